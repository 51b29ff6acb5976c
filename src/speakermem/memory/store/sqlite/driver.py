"""Pick a SQLite driver that can load sqlite-vec, and open connections with it.

Many CPython builds (pyenv's default, python.org macOS) ship a `sqlite3` module
without `enable_load_extension`. We detect that and fall back to sqlean.py, a
DB-API-compatible build of SQLite with extension loading and FTS5, so the user
never has to rebuild Python. aiosqlite stays the async layer: it accepts any
connector that returns a DB-API connection.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import aiosqlite
import sqlite_vec

from speakermem.memory.search.cjk import index_text
from speakermem.memory.store.errors import DriverUnavailable

log = logging.getLogger(__name__)

DriverName = Literal["stdlib", "sqlean"]


@dataclass(frozen=True)
class Driver:
    name: DriverName
    module: ModuleType

    @property
    def error(self) -> type[Exception]:
        return self.module.Error  # type: ignore[no-any-return]

    @property
    def operational_error(self) -> type[Exception]:
        return self.module.OperationalError  # type: ignore[no-any-return]

    @property
    def integrity_error(self) -> type[Exception]:
        return self.module.IntegrityError  # type: ignore[no-any-return]

    @property
    def row(self) -> Any:
        return self.module.Row


def stdlib_can_load_extensions() -> bool:
    return hasattr(sqlite3.Connection, "enable_load_extension")


def _sqlean() -> ModuleType | None:
    try:
        import sqlean
    except ImportError:
        return None
    return sqlean


def pick_driver(preference: Literal["auto", "stdlib", "sqlean"] = "auto") -> Driver:
    """Return the driver to use: stdlib when it can load extensions, else sqlean."""
    if preference in ("auto", "stdlib") and stdlib_can_load_extensions():
        return Driver("stdlib", sqlite3)
    if preference == "stdlib":
        raise DriverUnavailable(
            "This Python's sqlite3 module cannot load extensions (sqlite-vec). "
            "Set SPEAKERMEM_SQLITE_DRIVER=auto to use sqlean.py instead."
        )
    module = _sqlean()
    if module is None:
        raise DriverUnavailable(
            "This Python's sqlite3 module cannot load extensions and sqlean.py is missing. "
            "Run: pip install sqlean.py"
        )
    return Driver("sqlean", module)


def connect_sync(path: Path | str, driver: Driver) -> Any:
    """Open a DB-API connection with sqlite-vec loaded and our pragmas set.

    Runs in aiosqlite's worker thread (check_same_thread=False lets the thread own it).
    """
    conn = driver.module.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.enable_load_extension(True)
    try:
        sqlite_vec.load(conn)
    finally:
        conn.enable_load_extension(False)
    # the full-text indexes hold CJK text as character n-grams (migration 12's view and
    # triggers call it; memory/search/cjk.py)
    conn.create_function("speakermem_segment", 1, index_text, deterministic=True)
    conn.row_factory = driver.row
    return conn


async def open_async(
    path: Path | str, driver: Driver, *, busy_timeout_ms: int, cache_mib: int
) -> aiosqlite.Connection:
    """Open an aiosqlite connection over the chosen driver, in WAL mode, within a memory
    budget of `cache_mib` for the whole process.

    SQLite keeps every page a connection touched up to its cache size, so memory grows with
    the database until the caches are full, and a writer plus N readers per process (the
    bot and each recall process) multiply that. Each connection may use the whole budget
    for its cache, and SQLite's process-wide soft heap limit (set to the same budget; one
    value per process, so every open sets the same) makes the caches recycle pages instead
    of allocating once the process's SQLite memory reaches it: memory levels off early, and
    the OS page cache still serves re-reads.
    """

    def connector() -> Any:
        conn = connect_sync(path, driver)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA cache_size = -{int(cache_mib) * 1024}")
        conn.execute(f"PRAGMA soft_heap_limit = {int(cache_mib) * 1024 * 1024}")
        return conn

    conn = aiosqlite.Connection(connector, iter_chunk_size=64)
    try:
        await conn
    except BaseException:
        # After a failed connect aiosqlite stops its worker thread, which then hands one
        # last result back to this loop: wait for it here, or it lands on a loop that may
        # be closed by then (an exception in that thread).
        thread = getattr(conn, "_thread", None)
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)
        raise
    return conn
