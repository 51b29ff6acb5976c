"""Store faults: another process holding the write lock; kill -9 in the middle of work."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.store import StoreBusy
from tests.conftest import msg

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def hold_write_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process takes the write lock on `db` and keeps it for `seconds`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def config(db: Path, **store: object) -> MemoryConfig:
    return MemoryConfig(store=StoreConfig(db_path=db, **store))  # type: ignore[arg-type]


@pytest.mark.e2e
async def test_ingestion_waits_out_a_5s_write_lock_and_drops_nothing(
    tmp_path: Path, scope: Scope
) -> None:
    db = tmp_path / "locked.db"
    engine = await MemoryEngine.open(config(db))
    try:
        holder = hold_write_lock(db, 5.0)
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(engine.ingest(msg(scope, f"m{i}", "Ann", f"note {i}", i)) for i in range(40))
        )
        waited = time.monotonic() - started
        holder.wait(10)
        assert waited >= 4.0  # it really waited for the other process
        assert all(o.status.value == "stored" for o in outcomes)
        counts = await engine.store.messages.counts()
        assert counts["messages"] == 40
    finally:
        await engine.close()


@pytest.mark.e2e
async def test_lock_wait_is_bounded_by_the_setting(tmp_path: Path, scope: Scope) -> None:
    db = tmp_path / "locked.db"
    engine = await MemoryEngine.open(config(db, busy_timeout_ms=200, lock_wait_s=1.0))
    try:
        holder = hold_write_lock(db, 4.0)
        started = time.monotonic()
        with pytest.raises(StoreBusy):
            await engine.ingest(msg(scope, "m1", "Ann", "note", 1))
        waited = time.monotonic() - started
        holder.wait(10)
        assert 0.8 <= waited < 3.0
        # once the lock is free the same write goes through
        assert (await engine.ingest(msg(scope, "m1", "Ann", "note", 1))).status.value == "stored"
    finally:
        await engine.close()


@pytest.mark.e2e
def test_sqlite_sees_the_holder(tmp_path: Path) -> None:
    """The helper really locks: a plain connection with no busy wait is refused."""
    db = tmp_path / "x.db"
    sqlite3.connect(db).execute("PRAGMA journal_mode = WAL").close()
    holder = hold_write_lock(db, 1.0)
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        conn.execute("BEGIN IMMEDIATE")
    holder.wait(5)


def test_lock_wait_setting_reaches_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from speakermem.bot.settings import Settings

    monkeypatch.setenv("SPEAKERMEM_DB_LOCK_WAIT_S", "7.5")
    assert Settings().memory_config().store.lock_wait_s == 7.5


async def test_a_write_cancelled_while_it_begins_leaves_the_store_writable(
    tmp_path: Path, scope: Scope
) -> None:
    """A task cancelled while its BEGIN runs (a catch-up or reconciliation pass stopped at
    shutdown): aiosqlite runs the BEGIN anyway, and the transaction it opened must not stay
    open on the one writer connection, or every later write fails."""
    engine = await MemoryEngine.open(config(tmp_path / "t.db"))
    try:
        for turns in range(4):  # cancelled at each of its first awaits
            task = asyncio.create_task(engine.ingest(msg(scope, f"c{turns}", "Alice", "x", 0)))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await engine.ingest(msg(scope, f"after{turns}", "Bob", "still writable", 1))
        rows = await engine.store.db.read("SELECT message_id FROM messages")
        assert {f"after{t}" for t in range(4)} <= {r[0] for r in rows}
    finally:
        await engine.close()
