"""The governance CLI end to end: `main()` with arguments against a real database file."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations import app
from speakermem.integrations.cli import render
from speakermem.integrations.cli.governance import cmd_status
from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from tests.conftest import T0, msg
from tests.llm_server import LLMServer
from tests.test_governance_forget import rec

GENERAL = Scope(platform="slack", workspace="T1", channel="C1")
OTHER_WS = Scope(platform="slack", workspace="T2", channel="C9")


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("SPEAKERMEM_LLM_BASE_URL", "SPEAKERMEM_DB_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    for con in (render.console, render.err_console):
        monkeypatch.setattr(con, "_width", 200)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "g.db"
    asyncio.run(seed(path))
    return path


async def seed(path: Path) -> None:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=path)))
    try:
        await engine.ingest_many(
            [
                msg(GENERAL, "1.1", "Alice", "the kumquat order is late", 0),
                msg(GENERAL, "1.2", "Bob", "I will chase the supplier", 1),
                msg(GENERAL, "1.3", "Alice", "thanks, kumquat season ends soon", 2),
                msg(OTHER_WS, "9.1", "Bob", "other workspace bob here", 3),
            ]
        )
        await engine.store.records.add_records(
            GENERAL,
            [rec("Alice ordered kumquats", ("1.1", "1.3"), owner="alice", source="alice")],
            None,
        )
    finally:
        await engine.close()


def run(db: Path, *argv: str) -> int:
    return main(["--db", str(db), *argv])


def live(db: Path) -> set[str]:
    async def read() -> set[str]:
        engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
        try:
            rows = await engine.store.db.read(
                "SELECT message_id FROM messages WHERE deleted_at IS NULL"
            )
            return {r[0] for r in rows}
        finally:
            await engine.close()

    return asyncio.run(read())


def test_every_governance_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["channel"],
        ["retention", "set"],
        ["retention", "apply"],
        ["alias"],
        ["forget", "message"],
        ["forget", "user"],
        ["export", "user"],
        ["status"],
        ["audit"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--help"])
        assert exit_.value.code == 0
        assert "usage: speakermem" in capsys.readouterr().out


def test_forget_user_needs_yes_without_a_terminal_and_prints_the_receipt(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert run(db, "forget", "user", "alice") == 2
    assert "pass --yes" in capsys.readouterr().err
    assert live(db) == {"1.1", "1.2", "1.3", "9.1"}
    assert run(db, "forget", "user", "Alice", "--yes", "--json") == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["action"] == "forget-user" and receipt["target"] == "alice"
    assert receipt["counts"]["messages"] == 2 and receipt["counts"]["records"] == 1
    assert live(db) == {"1.2", "9.1"}
    assert run(db, "audit", "--json") == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["actor"], entry["action"], entry["receipt"]) == (
        "cli",
        "forget-user",
        receipt["counts"],
    )


def test_an_ambiguous_user_is_an_error_listing_the_candidates(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(db, "forget", "user", "bob", "--yes") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ambiguous" in err and "slack/T1" in err and "slack/T2" in err
    assert live(db) == {"1.1", "1.2", "1.3", "9.1"}
    assert run(db, "forget", "user", "bob", "--workspace", "T2", "--yes", "--json") == 0
    assert json.loads(capsys.readouterr().out)["counts"]["messages"] == 1
    assert live(db) == {"1.1", "1.2", "1.3"}
    assert run(db, "forget", "user", "nobody", "--yes") == 2
    assert "no member" in capsys.readouterr().err


def test_forget_message_confirms_on_a_terminal(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("no\n"))
    assert run(db, "forget", "message", "1.1", "--channel", "C1") == 2
    assert "cancelled" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", Tty("yes\n"))
    assert run(db, "forget", "message", "1.1", "--channel", "C1", "--json") == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["messages"] == 1 and counts["records"] == 1
    assert run(db, "forget", "message", "nope", "--channel", "C1", "--yes") == 2
    assert live(db) == {"1.2", "1.3", "9.1"}


def test_channel_retention_alias_export_and_status(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(db, "channel", "disable", "--channel", "C1") == 0
    assert "channel-off slack/T1/C1: channel_policy 1" in capsys.readouterr().out
    assert run(db, "status", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    by_channel = {c["channel"]: c for c in status["channels"]}
    assert by_channel["slack/T1/C1"]["on"] is False and by_channel["slack/T2/C9"]["on"] is True
    assert status["llm_reachable"] is None and status["messages"] == 4
    assert run(db, "channel", "enable", "--channel", "C1", "--purge") == 2  # purge needs disable
    assert run(db, "channel", "enable", "--channel", "C1") == 0
    assert run(db, "status") == 0
    assert "slack/T1/C1" in capsys.readouterr().out

    # a workspace limit: every message is long past it (T0 is 2024)
    assert run(db, "retention", "set", "30") == 2  # two workspaces: which one?
    assert "pass --workspace" in capsys.readouterr().err
    assert run(db, "retention", "set", "30", "--workspace", "T2") == 0
    assert run(db, "retention", "set", "banana", "--workspace", "T2") == 2
    capsys.readouterr()
    assert run(db, "retention", "apply", "--json") == 0
    assert json.loads(capsys.readouterr().out)["counts"]["messages"] == 1
    assert live(db) == {"1.1", "1.2", "1.3"}

    assert run(db, "alias", "add", "alice", "Kumquat Queen") == 0
    out = tmp_path / "alice.json"
    assert run(db, "export", "user", "kumquat queen", "--out", str(out)) == 0
    data = json.loads(out.read_text())
    assert [m["message_id"] for m in data["messages"]] == ["1.1", "1.3"]
    assert data["aliases"] == ["Kumquat Queen"]
    (record,) = data["records"]
    assert record["from_ids"] == ["1.1", "1.3"] and record["chain"] == [record["id"]]
    assert data["messages"][0]["link"] == "https://slack.com/archives/C1/p11"
    assert run(db, "alias", "remove", "alice", "Kumquat Queen") == 0
    assert run(db, "export", "user", "kumquat queen", "--out", str(out)) == 2
    capsys.readouterr()

    assert run(db, "channel", "disable", "--channel", "C1", "--purge", "--yes", "--json") == 0
    assert json.loads(capsys.readouterr().out)["counts"]["messages"] == 3
    assert live(db) == set()
    assert run(db, "audit") == 0
    text = capsys.readouterr().out
    assert "channel-off-purge" in text and "retention-apply" in text and "alias-add" in text


def test_roster_names_resolve_too(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def join() -> None:
        engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
        try:
            await engine.roster(
                RosterEvent(
                    scope=GENERAL, action=RosterAction.JOIN, user_id="U777", name="Zed", at=T0
                )
            )
        finally:
            await engine.close()

    asyncio.run(join())
    assert run(db, "export", "user", "zed", "--out", "zed.json") == 0
    assert json.loads(Path("zed.json").read_text())["user_id"] == "U777"


async def test_status_probes_the_llm_and_closes_its_client(
    db: Path,
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`status` asks the endpoint whether it answers, then closes the client on its own
    loop (left to garbage collection, it printed "Event loop is closed" after the command)."""
    built: list[Any] = []
    real = app.build_llm

    def spy(settings: Settings) -> Any:
        built.append(real(settings))
        return built[-1]

    monkeypatch.setattr(app, "build_llm", spy)
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=db,
        embedder="none",
        llm_base_url=llm_server.base_url,
        llm_model="test-model",
    )
    assert await cmd_status(settings, argparse.Namespace(json=True)) == 0
    assert json.loads(capsys.readouterr().out)["llm_reachable"] is True
    assert len(built) == 1 and built[0]._client.is_closed()
