"""The SQLite driver choice: stdlib when it can load sqlite-vec, else the sqlean.py fallback."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from memory.config import MemoryConfig, StoreConfig
from memory.engine import MemoryEngine
from memory.models import Scope
from memory.store import DriverUnavailable, pick_driver, stdlib_can_load_extensions
from memory.store import driver as driver_mod
from memory.store.database import StoreError
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
    from bot.settings import Settings

    settings = Settings(_env_file=None, db_path=tmp_path / "c.db", db_cache_mib=3)  # type: ignore[call-arg]
    engine = await MemoryEngine.open(settings.memory_config())
    try:
        db = engine.store.db
        async with db.transaction() as tx:
            writer = await tx.fetchone("PRAGMA cache_size")
        readers = [await db.read("PRAGMA cache_size") for _ in range(db.config.readers)]
        assert writer[0] == -3 * 1024
        assert [r[0][0] for r in readers] == [-3 * 1024] * db.config.readers
    finally:
        await engine.close()


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
