"""Connections, transactions and migrations for the one SQLite file.

One writer connection serialises every write behind an asyncio lock and opens
each transaction with BEGIN IMMEDIATE (so a second process waits on the busy
timeout instead of failing mid-transaction); a small pool of reader connections
serves searches concurrently under WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from speakermem.memory.config import StoreConfig
from speakermem.memory.private_files import ensure_private_file, sidecars, tighten
from speakermem.memory.store.database import IN_CHUNK, Params, read_in_chunks
from speakermem.memory.store.errors import StoreBusy, StoreError, StoreFull
from speakermem.memory.store.schema import MigrationProgress, log_progress
from speakermem.memory.store.sqlite.dialect import SQLITE
from speakermem.memory.store.sqlite.driver import Driver, open_async, pick_driver
from speakermem.memory.store.sqlite.schema import migrations

log = logging.getLogger(__name__)


class SqliteDatabase:
    """The SQLite file: one writer, N readers, recorded migrations."""

    dialect = SQLITE

    def __init__(self, config: StoreConfig, progress: MigrationProgress | None = None) -> None:
        self.config = config
        self.progress = progress or log_progress
        self.path = Path(config.db_path)
        self.driver: Driver = pick_driver(config.sqlite_driver)
        self._writer: aiosqlite.Connection | None = None
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all_readers: list[aiosqlite.Connection] = []
        self._write_lock = asyncio.Lock()
        self.migrated: list[int] = []
        """Versions the last open applied (the first is 1 on a new database)."""

    async def open(self) -> None:
        # 0600 before SQLite opens it: the -wal and -shm files take the database's mode
        try:
            ensure_private_file(self.path)
            for sidecar in sidecars(self.path)[1:]:
                tighten(sidecar)
        except OSError as exc:
            raise StoreError(f"cannot open database {self.path}: {exc}") from exc
        try:
            self._writer = await open_async(
                self.path,
                self.driver,
                busy_timeout_ms=self.config.busy_timeout_ms,
                cache_mib=self.config.cache_mib,
            )
        except self.driver.error as exc:
            raise StoreError(f"cannot open database {self.path}: {exc}") from exc
        # Forgotten text must not linger in free pages (secure_delete zeroes them) or in FTS5
        # index segments (its secure-delete option rewrites the segment without the token).
        await self._writer.execute("PRAGMA secure_delete = ON")
        await self._migrate()
        await self._fts_secure_delete()
        for _ in range(self.config.readers):
            conn = await open_async(
                self.path,
                self.driver,
                busy_timeout_ms=self.config.busy_timeout_ms,
                cache_mib=self.config.cache_mib,
            )
            await conn.execute("PRAGMA query_only = ON")
            await conn.execute("PRAGMA secure_delete = ON")
            self._all_readers.append(conn)
            self._readers.put_nowait(conn)
        log.info("store open: %s (driver=%s)", self.path, self.driver.name)

    async def close(self) -> None:
        for conn in self._all_readers:
            await conn.close()
        self._all_readers.clear()
        if self._writer is not None:
            with contextlib.suppress(self.driver.error):
                await self._writer.execute("PRAGMA optimize")
            await self._writer.close()
            self._writer = None

    @property
    def where(self) -> str:
        return str(self.path)

    @property
    def writer(self) -> aiosqlite.Connection:
        if self._writer is None:
            raise StoreError("database is not open")
        return self._writer

    async def _migrate(self) -> None:
        conn = self.writer
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        async with conn.execute("SELECT version FROM schema_migrations") as cur:
            done = {row[0] for row in await cur.fetchall()}
        self.migrated = []
        for migration in migrations(self.config.vec_chunk_size):
            if migration.version in done:
                continue
            self.migrated.append(migration.version)
            async with self.transaction() as tx:
                if migration.sql:
                    await tx.executescript_in_tx(migration.sql)
                if migration.step is not None:
                    await migration.step(tx, self.progress)
                await tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, time.time()),
                )
            log.info("applied migration %d: %s", migration.version, migration.name)

    async def _fts_secure_delete(self) -> None:
        """Turn on FTS5 'secure-delete' for both full-text indexes (SQLite 3.42+).

        The option is stored in each index's config table; setting it again is a no-op
        write, so it runs on every open and also covers databases created before it."""
        for table in ("messages_fts", "records_fts"):
            try:
                async with self.transaction() as tx:
                    row = await tx.fetchone(
                        f"SELECT v FROM {table}_config WHERE k = 'secure-delete'"
                    )
                    if row is None or int(row[0]) != 1:
                        await tx.execute(
                            f"INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 1)"
                        )
            except (StoreError, self.driver.error) as exc:
                log.warning(
                    "FTS5 secure-delete unavailable on %s (SQLite %s): forgotten words may stay "
                    "in index segments until the next merge (%s)",
                    table,
                    getattr(self.driver.module, "sqlite_version", "?"),
                    exc,
                )

    async def schema_version(self) -> int:
        rows = await self.read("SELECT max(version) FROM schema_migrations")
        return int(rows[0][0] or 0)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTransaction]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on any error."""
        async with self._write_lock:
            conn = self.writer
            try:
                await self._begin(conn)
            except asyncio.CancelledError:
                # aiosqlite runs the BEGIN in its thread even when the await is cancelled:
                # an open transaction left on the one writer would fail every later write
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise
            tx = SqliteTransaction(conn)
            try:
                yield tx
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                if _is_full(exc):
                    raise self._full(exc) from exc
                raise
            try:
                await conn.execute("COMMIT")
            except self.driver.error as exc:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                if _is_full(exc):
                    raise self._full(exc) from exc
                raise StoreError(f"commit failed: {exc}") from exc

    def _full(self, exc: BaseException) -> StoreFull:
        log.error("write refused, %s is full (%s): free disk space", self.path, exc)
        return StoreFull(f"{self.path}: database or disk is full ({exc})")

    async def _begin(self, conn: aiosqlite.Connection) -> None:
        """BEGIN IMMEDIATE, retried while another process holds the write lock.

        Each attempt waits up to `busy_timeout_ms` inside SQLite; between attempts we sleep
        (capped backoff) until `lock_wait_s` has passed, then give up with StoreBusy.
        """
        deadline = time.monotonic() + self.config.lock_wait_s
        delay = 0.05
        attempt = 0
        while True:
            attempt += 1
            try:
                await conn.execute("BEGIN IMMEDIATE")
                return
            except self.driver.operational_error as exc:
                if _is_full(exc):
                    raise self._full(exc) from exc
                if not _is_busy(exc):
                    raise StoreError(str(exc)) from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                log.warning("database locked (attempt %d, %.1f s left); retrying", attempt, left)
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
        raise StoreBusy(
            f"{self.path} stayed locked by another process for {self.config.lock_wait_s:g} s; "
            "stop the other writer (or raise SPEAKERMEM_DB_LOCK_WAIT_S) and retry"
        )

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[aiosqlite.Connection]:
        conn = await self._readers.get()
        try:
            yield conn
        finally:
            self._readers.put_nowait(conn)

    async def read(self, sql: str, params: Params = ()) -> list[Any]:
        async with self.reader() as conn:
            # one hop to the connection's thread (execute, fetch and close there), not three
            return list(await conn.execute_fetchall(sql, params))

    async def read_in(
        self,
        sql: str,
        values: Sequence[Any],
        *,
        before: tuple[Any, ...] = (),
        chunk: int = IN_CHUNK,
    ) -> list[Any]:
        """Rows of `sql` whose `{marks}` placeholder is an IN list over `values`, chunked so
        no statement exceeds SQLite's variable limit; `before` binds the parameters that
        precede the list."""
        return await read_in_chunks(self.read, sql, values, before=before, chunk=chunk)


class SqliteTransaction:
    """The statements of one write transaction (a thin, typed wrapper)."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    async def policy_lock(self, *, shared: bool) -> None:
        """Order this transaction against the policy writes (switches, opt-outs, tombstones):
        those take it exclusive, the writes they govern (ingest, Writer commits) shared.
        Nothing to do on SQLite: its one writer already runs transactions one at a time."""

    async def ingest_lock(self, channels: Sequence[tuple[str, str, str]]) -> None:
        """Order this transaction against other ingests, edits and deletes: nothing to do,
        the one writer already does."""

    async def insert_rows(
        self, table: str, columns: Sequence[tuple[str, str]], rows: list[tuple[Any, ...]]
    ) -> None:
        """One prepared INSERT stepped per row: SQLite runs in this process, so there is no
        round trip to save."""
        names = ", ".join(name for name, _ in columns)
        marks = ", ".join("?" for _ in columns)
        await self.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)

    async def reserve_ids(self, table: str, n: int) -> list[int]:
        """The ids after the largest stored: the one writer makes them this transaction's."""
        row = await (
            await self.conn.execute(f"SELECT coalesce(max(id), 0) FROM {table}")
        ).fetchone()
        first = int(row[0]) + 1 if row is not None else 1
        return list(range(first, first + n))

    async def execute(self, sql: str, params: Params = ()) -> Any:
        return await self.conn.execute(sql, params)

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            await self.conn.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Any]:
        return list(await self.conn.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: Params = ()) -> Any:
        """The first row of a single-row query (callers select by key or aggregate)."""
        rows = list(await self.conn.execute_fetchall(sql, params))
        return rows[0] if rows else None

    async def insert(self, sql: str, params: Params = ()) -> int:
        cur = await self.conn.execute(sql, params)
        rowid = cur.lastrowid
        await cur.close()
        if rowid is None:
            raise StoreError("insert returned no row id")
        return int(rowid)

    async def executescript_in_tx(self, script: str) -> None:
        """Run a multi-statement script inside the open transaction.

        `executescript` would COMMIT first, so we split on statement boundaries
        with the driver's own `complete_statement` check instead.
        """
        for statement in split_statements(script):
            await self.conn.execute(statement)


def _is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED (by code where the driver gives one, else by message)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)
    return "locked" in str(exc) or "busy" in str(exc)


def _is_full(exc: BaseException) -> bool:
    """SQLITE_FULL (by code where the driver gives one, else by SQLite's message)."""
    if isinstance(exc, StoreFull):
        return False  # already typed (a nested write)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 13
    return "database or disk is full" in str(exc)


def split_statements(script: str) -> list[str]:
    """Split SQL text into complete statements (trigger bodies kept whole)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--") and not buffer.strip():
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
