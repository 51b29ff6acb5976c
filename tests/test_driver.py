"""The SQLite driver choice: stdlib when it can load sqlite-vec, else the sqlean.py fallback."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.store import (
    DriverUnavailable,
    StoreError,
    pick_driver,
    stdlib_can_load_extensions,
)
from speakermem.memory.store.sqlite import driver as driver_mod
from tests.conftest import msg


def test_auto_falls_back_to_sqlean_when_stdlib_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "stdlib_can_load_extensions", lambda: False)
    chosen = pick_driver("auto")
    assert chosen.name == "sqlean"
    with pytest.raises(DriverUnavailable, match="cannot load extensions"):
        pick_driver("stdlib")


def test_auto_prefers_stdlib_when_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "stdlib_can_load_extensions", lambda: True)
    assert pick_driver("auto").name == "stdlib"


def test_missing_fallback_gives_an_actionable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "stdlib_can_load_extensions", lambda: False)
    monkeypatch.setattr(driver_mod, "_sqlean", lambda: None)
    with pytest.raises(DriverUnavailable, match=r"pip install sqlean\.py"):
        pick_driver("auto")


def test_this_python_reports_its_capability_truthfully() -> None:
    assert stdlib_can_load_extensions() == hasattr(sqlite3.Connection, "enable_load_extension")


@pytest.mark.parametrize("preference", ["auto", "sqlean", "stdlib"])
async def test_store_works_end_to_end_on_each_available_driver(
    tmp_path: Path, preference: str
) -> None:
    if preference == "stdlib" and not stdlib_can_load_extensions():
        pytest.skip("this Python's sqlite3 cannot load extensions (the fallback case)")
    cfg = MemoryConfig(store=StoreConfig(db_path=tmp_path / "d.db", sqlite_driver=preference))
    eng = await MemoryEngine.open(cfg)
    try:
        if preference == "auto" and not stdlib_can_load_extensions():
            assert eng.store.driver_name == "sqlean"  # the fallback path, exercised for real
        scope = Scope(platform="t", workspace="w", channel="c")
        await eng.ingest_many([msg(scope, "1", "Al", "vectors need an extension", 0)])
        rows = await eng.store.db.read("SELECT vec_version()")
        assert rows[0][0].startswith("v")
        assert len(await eng.search("extension", [scope], mode="lexical")) == 1
    finally:
        await eng.close()


async def test_page_cache_follows_the_setting_on_every_connection(tmp_path: Path) -> None:
    from speakermem.bot.settings import Settings

    settings = Settings(_env_file=None, db_path=tmp_path / "c.db", db_cache_mib=3)  # type: ignore[call-arg]
    engine = await MemoryEngine.open(settings.memory_config())
    try:
        db = engine.store.db
        async with db.transaction() as tx:
            writer = await tx.fetchone("PRAGMA cache_size")
        readers = [await db.read("PRAGMA cache_size") for _ in range(db.config.readers)]
        assert writer[0] == -3 * 1024
        assert [r[0][0] for r in readers] == [-3 * 1024] * db.config.readers
        assert (await db.read("PRAGMA soft_heap_limit"))[0][0] == 3 * 1024 * 1024
    finally:
        await engine.close()


READ_EVERY_READER = """
import asyncio, sys
from pathlib import Path
from speakermem.memory.config import StoreConfig
from speakermem.memory.store.sqlite.database import SqliteDatabase

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

async def main():
    db = SqliteDatabase(StoreConfig(db_path=Path(sys.argv[1]), readers=4, cache_mib=8))
    await db.open()
    before = rss_mb()
    # all four readers at once, so each connection fills its own cache with the table
    await asyncio.gather(*(db.read("SELECT sum(length(b)) FROM blobs") for _ in range(4)))
    print(rss_mb() - before)
    await db.close()

asyncio.run(main())
"""


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_the_cache_budget_bounds_the_whole_process_not_each_connection(tmp_path: Path) -> None:
    """Four readers scanning a 48 MB table: per-connection caches of 8 MiB would keep
    32 MiB; one budget of 8 MiB for the process keeps about that, whatever the readers."""
    import subprocess
    import sys

    path = tmp_path / "big.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, b BLOB)")
    conn.executemany("INSERT INTO blobs (b) VALUES (randomblob(1000))", [()] * 48_000)
    conn.commit()
    conn.close()
    out = subprocess.run(
        [sys.executable, "-c", READ_EVERY_READER, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    grew_mb = float(out.stdout.strip().splitlines()[-1])
    assert grew_mb < 16, f"reading grew RSS by {grew_mb:.1f} MB"


async def test_a_failed_open_leaves_no_worker_thread(tmp_path: Path) -> None:
    """aiosqlite's worker thread outlived a failed connect and could hand its last result to
    a closed loop (an exception in a thread, seen in CI after the doctor's failing open)."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(StoreError):
        await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=blocker / "x.db")))
    workers = [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]
    assert not [t.name for t in workers if t.ident not in before and t.is_alive()]
