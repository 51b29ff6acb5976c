"""History importers: Slack export ZIP and DiscordChatExporter JSON (fixtures are invented)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.events import MessageEvent, RosterAction, RosterEvent, Scope
from speakermem.integrations.discord.export import read_discord_export
from speakermem.integrations.discord.export_folder import read_discord_export_dir
from speakermem.integrations.payload import PayloadError
from speakermem.integrations.slack.export import read_slack_export

FIXTURES = Path(__file__).parent / "fixtures"
SLACK_DIR = FIXTURES / "slack_export_small"
DISCORD_FILE = FIXTURES / "discord_export_small.json"


def zip_dir(
    src: Path,
    dest: Path,
    *,
    prefix: str = "",
    extra: dict[str, str] | None = None,
    skip: tuple[str, ...] = (),
) -> Path:
    """Build an export ZIP from a fixture folder (plus/minus some members)."""
    with zipfile.ZipFile(dest, "w") as zf:
        for path in sorted(src.rglob("*.json")):
            rel = path.relative_to(src).as_posix()
            if rel not in skip:
                zf.write(path, prefix + rel)
        for name, content in (extra or {}).items():
            zf.writestr(prefix + name, content)
    return dest


@pytest.fixture
def slack_zip(tmp_path: Path) -> Callable[..., Path]:
    def make(**kwargs: Any) -> Path:
        return zip_dir(SLACK_DIR, tmp_path / "export.zip", **kwargs)

    return make


# --- Slack -------------------------------------------------------------------------------------


def test_slack_export_metadata(slack_zip):
    export = read_slack_export(slack_zip())
    assert export.team_id == "TFAKE001"
    assert export.users["UALICE01"] == "ally"
    assert export.users["UBOB0002"] == "Bob Sample"
    assert export.users["UCARL003"] == "carl"
    assert {"UBOTDEPL", "BDEPLOY1"} <= export.bots
    assert [(c.id, c.is_private) for c in export.channels] == [
        ("CGENERAL", False),
        ("GPLANS01", True),
    ]


def test_slack_export_events(slack_zip):
    export = read_slack_export(slack_zip())
    events = list(export)
    assert export.errors == []
    assert len(events) == export.count == len(export)
    general = Scope(platform="slack", workspace="TFAKE001", channel="CGENERAL")
    in_general = [e for e in events if e.scope == general]

    # Members from channels.json who have no join message come in one snapshot per channel,
    # dated at channel creation; they are no longer one JOIN event each.
    rosters = {r.scope.channel: r for r in export.rosters()}
    assert rosters["CGENERAL"].members == [
        ("UALICE01", "ally", False),
        ("UBOB0002", "Bob Sample", False),
    ]
    assert rosters["CGENERAL"].at == datetime.fromtimestamp(1709251200, tz=UTC)
    # Carl's join comes from his channel_join message, in ts order, before the first message.
    kinds = [(type(e).__name__, getattr(e, "action", None)) for e in in_general]
    assert kinds[0] == ("RosterEvent", RosterAction.JOIN)
    assert in_general[0].user_id == "UCARL003"  # type: ignore[union-attr]

    messages = [e for e in in_general if isinstance(e, MessageEvent)]
    assert [m.ts for m in messages] == sorted(m.ts for m in messages)
    parent, reply, own_reply, bot, later = messages
    assert parent.thread_id is None and parent.speaker_name == "ally"
    assert reply.thread_id == reply.reply_to == parent.message_id
    assert reply.addressees == ("UCARL003", "UALICE01")
    assert own_reply.text == "Great, I'll book the cabin"  # edited text kept
    assert own_reply.addressees == ()  # replying in one's own thread addresses no one
    assert bot.speaker_is_bot and bot.speaker_id == "BDEPLOY1"
    assert later.speaker_name == "carl"
    # channel_topic skipped; channel_leave is a LEAVE at the end.
    last = in_general[-1]
    assert isinstance(last, RosterEvent) and last.action == RosterAction.LEAVE
    assert last.user_id == "UBOB0002"

    private = [e for e in events if e.scope.channel == "GPLANS01"]
    assert [type(e).__name__ for e in private] == ["MessageEvent"]
    assert [m for m, _, _ in rosters["GPLANS01"].members] == ["UALICE01", "UBOB0002"]


def test_slack_export_in_a_top_folder_and_without_team(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for path in SLACK_DIR.rglob("*.json"):
        target = src / path.relative_to(SLACK_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text()
        data = json.loads(text)
        if isinstance(data, list):
            for item in data:
                if isinstance(item, dict):
                    item.pop("team", None)
                    item.pop("team_id", None)
        target.write_text(json.dumps(data))
    export = read_slack_export(
        zip_dir(src, tmp_path / "x.zip", prefix="Fake Slack export/"), workspace="TCLI"
    )
    assert export.team_id == "TCLI"
    assert any(isinstance(e, MessageEvent) for e in export)


def test_slack_export_bad_records_are_skipped_or_raise(slack_zip):
    bad_day = json.dumps(
        [
            {"type": "message", "user": "UALICE01", "text": "ok", "ts": "1709900000.000100"},
            {"type": "message", "user": "UALICE01", "text": "x" * 40_001, "ts": "1709900001.0"},
            {"type": "message", "text": "no user", "ts": "1709900002.0"},
            {"type": "message", "user": "UALICE01", "text": "bad ts", "ts": "soon"},
            {"type": "message", "user": "UALICE01", "text": 12, "ts": "1709900003.0"},
            {"type": "message", "subtype": "channel_join", "ts": "1709900004.0"},
            {"type": "message", "user": "UALICE01", "text": "\udcff", "ts": "1709900006.0"},
            {"type": "message", "subtype": "reminder_add", "user": "U", "ts": "1709900005.0"},
            "not an object",
        ]
    )
    path = slack_zip(extra={"general/2024-03-08.json": bad_day})
    export = read_slack_export(path)
    events = list(export)
    assert len(export.errors) == 6
    assert any("not valid UTF-8" in e for e in export.errors)
    assert any("limit is 40000" in e for e in export.errors)
    assert sum(1 for e in events if isinstance(e, MessageEvent) and e.text == "ok") == 1
    with pytest.raises(PayloadError):
        list(read_slack_export(path, strict=True))


def test_slack_export_invalid_utf8_and_json(slack_zip, tmp_path: Path):
    path = slack_zip(extra={"general/2024-03-09.json": '[{"text": "\xff'})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("plans/2024-03-09.json", b'[{"type": "message", "text": "\xff\xfe"}]')
    export = read_slack_export(path)
    list(export)
    assert any("not valid JSON" in e or "UTF-8" in e for e in export.errors)
    with pytest.raises(PayloadError):
        read_slack_export(path, strict=True)


def test_slack_export_not_an_export(tmp_path: Path):
    with pytest.raises(PayloadError, match="ZIP"):
        read_slack_export(tmp_path / "missing.zip")
    (tmp_path / "junk.zip").write_bytes(b"PK not really")
    with pytest.raises(PayloadError, match="ZIP"):
        read_slack_export(tmp_path / "junk.zip")
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("readme.txt", "hi")
    with pytest.raises(PayloadError, match="not a Slack export"):
        read_slack_export(empty)
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(broken, "w") as zf:
        zf.writestr("channels.json", '{"not": "a list"}')
    with pytest.raises(PayloadError, match="expected a list"):
        read_slack_export(broken)


# --- Discord -----------------------------------------------------------------------------------


def test_discord_export_events():
    export = read_discord_export(DISCORD_FILE)
    assert export.guild_id == "900000000000000001"
    assert export.count == len(export) == 5
    events = list(export)
    assert export.errors == []
    join, first, reply, bot = events  # pinned-message notice skipped
    assert isinstance(join, RosterEvent) and join.action == RosterAction.JOIN
    assert join.scope.channel == "*" and join.name == "Carl"
    assert isinstance(first, MessageEvent)
    assert first.scope == Scope(
        platform="discord", workspace="900000000000000001", channel="900000000000000010"
    )
    assert first.ts == datetime(2024, 3, 1, 9, tzinfo=UTC)  # +01:00 converted
    assert first.speaker_name == "Ally"
    assert isinstance(reply, MessageEvent)
    assert reply.reply_to == first.message_id
    assert reply.addressees == ("900000000000000203", "900000000000000201")
    assert reply.text.startswith("Count me in")
    assert isinstance(bot, MessageEvent) and bot.speaker_is_bot


def _write(tmp_path: Path, data: dict[str, Any], name: str = "x.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_discord_thread_export_is_scoped_to_parent(tmp_path: Path):
    data = json.loads(DISCORD_FILE.read_text())
    data["channel"] = {
        "id": "900000000000000050",
        "type": "GuildPublicThread",
        "categoryId": "900000000000000010",
        "category": "general",
        "name": "trip thread",
        "topic": None,
    }
    for m in data["messages"]:
        m.pop("reference", None)
    export = read_discord_export(_write(tmp_path, data))
    messages = [e for e in export if isinstance(e, MessageEvent)]
    assert messages and all(m.scope.channel == "900000000000000010" for m in messages)
    assert all(m.thread_id == "900000000000000050" for m in messages)


def test_discord_cross_channel_reference_is_not_a_reply(tmp_path: Path):
    data = json.loads(DISCORD_FILE.read_text())
    data["messages"][2]["reference"]["channelId"] = "900000000000000099"
    reply = [e for e in read_discord_export(_write(tmp_path, data)) if isinstance(e, MessageEvent)]
    assert reply[1].reply_to is None


def test_discord_dm_export_yields_nothing(tmp_path: Path):
    data = json.loads(DISCORD_FILE.read_text())
    data["channel"]["type"] = "DirectTextChat"
    export = read_discord_export(_write(tmp_path, data))
    assert export.count == 0 and list(export) == []


def test_discord_export_bad_messages(tmp_path: Path):
    data = json.loads(DISCORD_FILE.read_text())
    good = data["messages"][1]
    data["messages"] += [
        {**good, "id": "1", "content": "x" * 40_001},
        {**good, "id": "2", "content": "\udcff"},
        {**good, "id": "3", "timestamp": "later"},
        {**good, "id": "4", "author": None},
        {**good, "id": "5", "type": "SomethingNew"},
        "junk",
    ]
    path = _write(tmp_path, data)
    export = read_discord_export(path)
    events = list(export)
    assert len(events) == 4
    assert len(export.errors) == 5
    with pytest.raises(PayloadError):
        list(read_discord_export(path, strict=True))


def test_discord_export_structural_errors(tmp_path: Path):
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PayloadError, match="UTF-8"):
        read_discord_export(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PayloadError, match="JSON"):
        read_discord_export(tmp_path / "bad.json")
    with pytest.raises(PayloadError, match="guild"):
        read_discord_export(_write(tmp_path, {"channel": {}, "messages": []}))
    with pytest.raises(PayloadError, match="messages"):
        read_discord_export(_write(tmp_path, {"guild": {"id": "1"}, "channel": {"id": "2"}}))


def test_discord_export_dir(tmp_path: Path):
    data = json.loads(DISCORD_FILE.read_text())
    _write(tmp_path, data, "a.json")
    data["channel"]["id"] = "900000000000000011"
    _write(tmp_path, data, "b.json")
    exports = read_discord_export_dir(tmp_path)
    assert [e.channel.id for e in exports] == ["900000000000000010", "900000000000000011"]
