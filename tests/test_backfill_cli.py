"""`speakermem backfill`: older history of one channel through the catch-up machinery,
against the Slack Web API and Discord REST stand-ins."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.commands_ops import cmd_backfill, parse_since
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.governance import cmd_status
from speakermem.integrations.cli.main import build_parser, main
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import make_config
from tests.standins.discord_gateway import DiscordStandIn, _json
from tests.standins.discord_guild import GENERAL as D_GENERAL
from tests.standins.discord_guild import GUILD_ID
from tests.standins.slack_api import BOT_USER_ID, TEAM_ID, SlackApiStandIn

pytestmark = pytest.mark.contract

GENERAL = "CGENERAL"
SCOPE = Scope(platform="slack", workspace=TEAM_ID, channel=GENERAL)
NOW = datetime.now(UTC).replace(microsecond=0)
SINCE = datetime.combine((NOW - timedelta(days=30)).date(), datetime.min.time(), UTC)
"""Midnight UTC, so `--since <its date>` is the same moment."""


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")


def slack_settings(standin: SlackApiStandIn | None, tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=make_config(tmp_path).store.db_path,
        embedder="none",
        slack_bot_token="xoxb-backfill",  # type: ignore[arg-type]
        slack_api_url=standin.base_url if standin else "http://127.0.0.1:9/api/",
        **extra,
    )


def args_for(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["backfill", *argv])


def err(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


async def stored(tmp_path: Path, scope: Scope) -> dict[str, Any]:
    engine = await MemoryEngine.open(make_config(tmp_path))
    try:
        rows = await engine.store.db.read(
            "SELECT m.message_id, m.speaker_name FROM messages m"
            " JOIN channels c ON c.id = m.channel_pk WHERE c.channel = ?",
            (scope.channel,),
        )
        members = {m.user_id for m in await engine.members(scope)}
        meta = next((c for c in await engine.store.channels.all() if c["scope"] == scope), None)
        cursors = await engine.store.catchup.cursors(scope.platform, "backfill")
        return {
            "ids": [r[0] for r in rows],
            "names": {r[1] for r in rows},
            "members": members,
            "meta": meta,
            "cursors": cursors,
        }
    finally:
        await engine.close()


def slack_standin() -> SlackApiStandIn:
    return SlackApiStandIn(
        users={
            "U1": {"name": "alice", "profile": {"display_name": "Alice"}},
            "U2": {"name": "bob", "profile": {"display_name": "Bob"}},
            BOT_USER_ID: {"name": "speakermem", "is_bot": True},
        },
        members={GENERAL: ["U1", "U2", BOT_USER_ID]},
    )


@pytest.mark.e2e
async def test_slack_backfill_stores_old_messages_once_and_a_rerun_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    standin = await slack_standin().start()
    try:
        before = standin.add_message(
            GENERAL, "older than --since", at=(SINCE - timedelta(hours=12)).timestamp()
        )
        at = SINCE.timestamp() + 60
        old: list[dict[str, Any]] = []
        for i in range(250):
            old.append(
                standin.add_message(
                    GENERAL, f"old {i}", user="U1" if i % 3 else "U2", at=at + i * 600
                )
            )
        parent = old[10]
        old += [
            standin.add_message(
                GENERAL, f"thread {i}", user="U2", at=at + 11 * 600 + i, thread_ts=parent["ts"]
            )
            for i in range(12)
        ]
        # a thread started before --since (within the day of thread lookback), answered after
        # it: the reply counts, the parent does not
        old += [
            standin.add_message(
                GENERAL, "late answer", user="U1", at=at + 5, thread_ts=before["ts"]
            )
        ]
        settings = slack_settings(standin, tmp_path)
        args = args_for(
            "--platform", "slack", "--channel", GENERAL, "--since", SINCE.date().isoformat()
        )
        assert args.since == SINCE  # a date is midnight UTC

        assert await cmd_backfill(settings, args) == 0
        out = err(capsys)
        assert f"stored {len(old)} new messages, 0 already present" in out
        assert "#cgeneral caught up to" in out and f"{len(old)} messages" in out
        got = await stored(tmp_path, SCOPE)
        assert sorted(got["ids"]) == sorted(m["ts"] for m in old)
        assert before["ts"] not in got["ids"]
        assert got["names"] == {"Alice", "Bob"}  # from users.list, not the bare ids
        assert got["members"] == {"U1", "U2", BOT_USER_ID}  # roster synced: /recall can answer
        assert got["meta"]["name"] == "cgeneral" and got["meta"]["messages"] == len(old)
        (cursor,) = got["cursors"]
        assert cursor.finished and cursor.fetched == len(old)

        # `speakermem status` shows how far the backfill got
        assert await cmd_status(settings, argparse.Namespace(json=False)) == 0
        shown = " ".join(capsys.readouterr().out.split())
        assert "history: backfill: #cgeneral caught up to" in shown
        assert f"{len(old)} messages" in shown

        calls = len(standin.calls)
        assert await cmd_backfill(settings, args) == 0
        assert f"stored 0 new messages, {len(old)} already present" in err(capsys)
        assert len((await stored(tmp_path, SCOPE))["ids"]) == len(old)
        # a week at a time: the first week in two pages, then an empty week that doubles the
        # next window, then the rest up to now (no `latest`)
        hist = [a for m, a in standin.calls[calls:] if m == "conversations.history"]
        week = 7 * 86400
        ends = [float(h["latest"]) if "latest" in h else None for h in hist]
        assert hist[0]["oldest"] == f"{SINCE.timestamp() - 86400:.6f}"  # a day of thread lookback
        assert hist[1]["cursor"] == "200" and ends[0] == ends[1]
        assert [round(e - SINCE.timestamp()) for e in ends[1:4] if e] == [week, 2 * week, 4 * week]
        assert len(hist) == 5 and ends[4] is None
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_slack_backfill_that_fails_says_so_and_a_rerun_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    standin = await slack_standin().start()
    try:
        old = [
            standin.add_message(GENERAL, f"old {i}", at=SINCE.timestamp() + 60 + i)
            for i in range(30)
        ]
        standin.fail("conversations.history", "internal_error")
        settings = slack_settings(standin, tmp_path)
        args = args_for("--platform", "slack", "--channel", GENERAL, "--since", SINCE.isoformat())
        with pytest.raises(CliError, match="run the same command to resume"):
            await cmd_backfill(settings, args)
        assert "stopped at" in err(capsys)
        assert (await stored(tmp_path, SCOPE))["ids"] == []

        assert await cmd_backfill(settings, args) == 0
        assert "stored 30 new messages" in err(capsys)
        assert sorted((await stored(tmp_path, SCOPE))["ids"]) == [m["ts"] for m in old]
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_slack_backfill_unknown_channel_and_switched_off_channel(tmp_path: Path) -> None:
    standin = await slack_standin().start()
    try:
        settings = slack_settings(standin, tmp_path)
        with pytest.raises(
            CliError, match=r"Slack does not know channel 'CNOPE' \(channel_not_found\)"
        ):
            await cmd_backfill(
                settings,
                args_for("--platform", "slack", "--channel", "CNOPE", "--since", "2024-01-01"),
            )
        standin.add_message(GENERAL, "x", at=SINCE.timestamp() + 1)
        off = slack_settings(standin, tmp_path, channel_default_enabled=False)
        with pytest.raises(CliError, match="memory is off"):
            await cmd_backfill(
                off, args_for("--platform", "slack", "--channel", GENERAL, "--since", "2024-01-01")
            )
    finally:
        await standin.close()


def test_backfill_without_a_token_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("SPEAKERMEM_SLACK_BOT_TOKEN", "SPEAKERMEM_DISCORD_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    db = str(tmp_path / "t.db")
    argv = ["--db", db, "backfill", "--channel", "C1", "--since", "2024-01-01"]
    assert main([*argv, "--platform", "slack"]) == 2
    assert "SPEAKERMEM_SLACK_BOT_TOKEN is not set" in err(capsys)
    assert main([*argv, "--platform", "discord"]) == 2
    assert "SPEAKERMEM_DISCORD_TOKEN is not set" in err(capsys)


def test_backfill_help_and_bad_dates(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["backfill", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--since DATE" in text and "resumes" in text and "--workspace W" in text
    with pytest.raises(SystemExit):
        main(["backfill", "--platform", "slack", "--channel", "C1", "--since", "last week"])
    assert "not a date: 'last week'" in capsys.readouterr().err
    assert parse_since("2024-03-01T10:00+02:00") == datetime(2024, 3, 1, 8, 0, tzinfo=UTC)


class ChannelStandIn(DiscordStandIn):
    """The Discord stand-in plus ``GET /channels/{id}`` (what backfill asks first)."""

    async def _rest(self, request: web.Request) -> web.Response:
        parts = request.match_info["tail"].strip("/").split("/")
        if request.method == "GET" and len(parts) == 2 and parts[0] == "channels":
            self.requests.append(("GET", "/" + request.match_info["tail"], None))
            if parts[1] == D_GENERAL:
                return _json({"id": D_GENERAL, "guild_id": GUILD_ID, "name": "general", "type": 0})
            return _json({"message": "Unknown Channel", "code": 10003}, status=404)
        return await super()._rest(request)


@pytest.mark.e2e
async def test_discord_backfill_over_rest_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    standin = await ChannelStandIn().start()
    try:
        standin.add_history(D_GENERAL, "older than --since", SINCE - timedelta(days=1))
        old = [
            standin.add_history(D_GENERAL, f"old {i}", SINCE + timedelta(minutes=i + 1))
            for i in range(150)
        ]
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            db_path=make_config(tmp_path).store.db_path,
            embedder="none",
            discord_token="standin-token",  # type: ignore[arg-type]
            discord_api_url=standin.api_base,
            discord_gateway_url=standin.gateway_url,
        )
        args = args_for(
            "--platform", "discord", "--channel", D_GENERAL, "--since", SINCE.isoformat()
        )
        assert await cmd_backfill(settings, args) == 0
        assert "stored 150 new messages" in err(capsys)
        scope = Scope(platform="discord", workspace=GUILD_ID, channel=D_GENERAL)
        got = await stored(tmp_path, scope)
        assert sorted(got["ids"], key=int) == [m["id"] for m in old]
        assert got["meta"]["name"] == "general"
        assert not standin.identified.is_set()  # no gateway session was opened
        assert await cmd_backfill(settings, args) == 0
        assert "stored 0 new messages, 150 already present" in err(capsys)

        with pytest.raises(CliError, match="Discord does not show channel 1234 to the bot"):
            await cmd_backfill(
                settings,
                args_for("--platform", "discord", "--channel", "1234", "--since", "2024-01-01"),
            )
    finally:
        await standin.close()
