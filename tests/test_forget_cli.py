"""Issue 27's "done when", from the outside: the `speakermem` commands a user runs.

- `speakermem write` against the scripted LLM server, which holds its answer until a
  `speakermem forget user` has returned: no record cites or names the forgotten person,
  in `records --export` or in another person's `export user` (the issue's trial found 11);
- `speakermem import slack-export` after `channel disable` stores none of a channel's new
  messages (the trial: 20 of 20 stored), and a re-import after `forget user` or
  `forget message` stores none of what was forgotten, nor the person's name.

Each command runs like `main()` does for a user, in a worker thread (its own event loop),
while the LLM server answers on the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli import render
from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg
from tests.llm_server import LLMServer
from tests.test_commit_check import HeldAnswer

GENERAL = Scope(platform="test", workspace="w1", channel="general")


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("SPEAKERMEM_LLM_BASE_URL", "SPEAKERMEM_DB_PATH", "SPEAKERMEM_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.setenv("SPEAKERMEM_LLM_MODEL", "test-model")
    monkeypatch.setenv("SPEAKERMEM_LLM_TIMEOUT_S", "20")
    monkeypatch.setenv("SPEAKERMEM_LLM_MAX_RETRIES", "0")
    for con in (render.console, render.err_console):
        monkeypatch.setattr(con, "_width", 200)


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


async def test_forget_user_while_speakermem_write_waits_for_the_llm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llm_server: LLMServer
) -> None:
    db = tmp_path / "x.db"
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        await engine.ingest_many(
            [
                msg(GENERAL, f"m{i}", who, text, i)
                for i, (who, text) in enumerate(
                    [
                        ("Bob", "I bought a red kayak for the lake"),
                        ("Alice", "I am moving to Quillfort next spring"),
                        ("Bob", "the lake is cold in April"),
                        ("Alice", "my sister runs the Quillfort bakery"),
                        ("Alice", "I will sell my piano before the move"),
                    ]
                )
            ]
        )
    finally:
        await engine.close()
    monkeypatch.setenv("SPEAKERMEM_LLM_BASE_URL", llm_server.base_url)
    held = HeldAnswer()
    from tests.llm_server import Handler

    llm_server.default = Handler(held)
    write = asyncio.ensure_future(cli("write", "--channel", "general", "--db", str(db)))
    await asyncio.wait_for(held.arrived.wait(), 30)
    assert await cli("forget", "user", "alice", "--yes", "--db", str(db)) == 0
    held.release.set()  # the LLM answers after the forget returned
    assert await asyncio.wait_for(write, 60) == 0

    recs = rows(db, "SELECT owner, source, content, from_ids FROM records")
    assert recs and {(o, s) for o, s, _, _ in recs} <= {("bob", "bob")}
    for _, _, content, from_ids in recs:
        assert "Alice" not in content and "Quillfort" not in content and "piano" not in content
        assert set(json.loads(from_ids)) <= {"m0", "m2"}
    assert await cli("records", "--export", str(tmp_path / "state.json"), "--db", str(db)) == 0
    state = (tmp_path / "state.json").read_text()
    assert "Quillfort" not in state and "piano" not in state
    assert (
        await cli("export", "user", "bob", "--out", str(tmp_path / "bob.json"), "--db", str(db))
        == 0
    )
    assert "Quillfort" not in (tmp_path / "bob.json").read_text()
    # the run log counts what was dropped
    ((rejected,),) = rows(db, "SELECT rejected FROM writer_runs")
    assert sum(json.loads(rejected).values()) >= 4


def slack_export(path: Path, messages: list[tuple[str, str, str]], day: str = "2024-03-01") -> Path:
    """A Slack export ZIP of #general: (ts, user id, text) messages by Alice and Bob."""
    users = [
        {"id": "UALICE01", "team_id": "TFAKE001", "name": "alice", "real_name": "Alice Example",
         "profile": {"display_name": "Ally", "real_name": "Alice Example"}},
        {"id": "UBOB0002", "team_id": "TFAKE001", "name": "bob", "real_name": "Bob Sample",
         "profile": {"display_name": "", "real_name": "Bob Sample"}},
    ]  # fmt: skip
    channels = [
        {"id": "CGENERAL", "name": "general", "created": 1709251200,
         "members": ["UALICE01", "UBOB0002"]},
    ]  # fmt: skip
    day_messages = [
        {"type": "message", "user": uid, "text": text, "ts": ts, "team": "TFAKE001"}
        for ts, uid, text in messages
    ]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("users.json", json.dumps(users))
        zf.writestr("channels.json", json.dumps(channels))
        zf.writestr(f"general/{day}.json", json.dumps(day_messages))
    return path


def lines(start: int, n: int) -> list[tuple[str, str, str]]:
    return [
        (f"{1709290800 + i}.000100", ("UALICE01", "UBOB0002")[i % 2], f"export note {i} zebra{i}")
        for i in range(start, start + n)
    ]


def imported(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


async def test_an_import_after_channel_disable_stores_none_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.db")
    first = slack_export(tmp_path / "first.zip", lines(0, 5))
    assert await cli("--db", db, "import", "slack-export", str(first)) == 0
    assert "imported 5 messages" in imported(capsys)
    assert await cli("--db", db, "channel", "disable", "--channel", "general") == 0
    later = slack_export(tmp_path / "later.zip", lines(0, 25), day="2024-03-02")
    assert await cli("--db", db, "import", "slack-export", str(later)) == 0
    out = imported(capsys)
    assert "imported 0 messages" in out and "20 in channels whose memory is off" in out
    assert rows(Path(db), "SELECT count(*) FROM messages") == [(5,)]


async def test_a_reimport_after_forget_stores_nothing_forgotten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.db")
    export = slack_export(tmp_path / "export.zip", lines(0, 6))
    assert await cli("--db", db, "import", "slack-export", str(export)) == 0
    assert "imported 6 messages" in imported(capsys)
    assert ("Ally",) in rows(Path(db), "SELECT display_name FROM users")
    assert await cli("--db", db, "forget", "user", "UALICE01", "--yes") == 0
    bob_line = lines(1, 1)[0][0]  # a message of Bob's
    assert (
        await cli("--db", db, "forget", "message", bob_line, "--channel", "general", "--yes") == 0
    )
    capsys.readouterr()

    assert await cli("--db", db, "import", "slack-export", str(export)) == 0
    out = imported(capsys)
    assert "imported 0 messages" in out
    live = rows(Path(db), "SELECT message_id, text FROM messages WHERE deleted_at IS NULL")
    assert sorted(t for _, t in live) == ["export note 3 zebra3", "export note 5 zebra5"]
    # her name is not written back (users.json), nor her messages' words
    names = rows(Path(db), "SELECT user_id, display_name FROM users")
    assert names == [("UBOB0002", "Bob Sample")]
    assert rows(Path(db), "SELECT count(*) FROM user_aliases") == [(0,)]
    raw = b"".join(p.read_bytes() for p in Path(db).parent.glob("s.db*"))  # file and WAL
    for word in ("Ally", "Alice Example", "zebra0", "zebra1"):  # zebra1: Bob's forgotten one
        assert word.encode() not in raw, word
    # new messages of hers in a later export stay out too
    later = slack_export(tmp_path / "later.zip", lines(6, 2), day="2024-03-02")
    assert await cli("--db", db, "import", "slack-export", str(later)) == 0
    assert "1 by forgotten members" in imported(capsys)
