"""Connections, transactions and migrations for the PostgreSQL backend.

`PgDatabase` implements the store's `Database` protocol (memory/store/database.py), so the
backend-neutral repositories run their SQL on it:

- SQL keeps SQLite's `?` placeholders; `translate` (memory/store/pg/dialect.py) turns them
  into psycopg's `%s` (and doubles literal `%`) once per statement text. Values are bound
  client-side (`AsyncClientCursor`), so untyped parameters behave as in SQLite (`? IS NULL`
  works); the search's large statements are bound server-side and prepared once per
  connection instead (`read_prepared`).
- Rows answer both `row[0]` and `row["column"]`, like sqlite3.Row, and unpack as tuples.
- `numeric` results (sum of BIGINT, avg) load as int or float, never Decimal.
- One write transaction at a time per process (an asyncio lock, as SQLite's single writer
  connection gives), on its own pooled connection; across processes Postgres' row locks
  and unique keys serialise writers. A lock held by another process longer than
  `lock_wait_s` raises StoreBusy, as does a serialization failure or deadlock; a full disk
  raises StoreFull.
- Migrations are recorded in `schema_migrations`; each runs in its own transaction under
  `pg_advisory_xact_lock`, so processes opening the same database at once apply each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import PosixPath
from typing import Any
from urllib.parse import quote

import psycopg
import psycopg.errors
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.database import IN_CHUNK, Params, read_in_chunks
from speakermem.memory.store.errors import StoreBusy, StoreError, StoreFull
from speakermem.memory.store.pg import schema
from speakermem.memory.store.pg.dialect import POSTGRES, translate
from speakermem.memory.store.schema import Migration, MigrationProgress, log_progress
from speakermem.memory.url_masking import MASK, mask_url

log = logging.getLogger(__name__)

MIGRATION_LOCK = 0x53504D454D  # "SPMEM": the advisory lock id that serialises migrations
POLICY_LOCK = 0x53504D50  # "SPMP": the advisory lock id of `PgTransaction.policy_lock`
INGEST_LOCK_CLASS = 0x53504D53  # "SPMS": the first key of every channel's ingest lock


def crc_key(name: str) -> int:
    """The second key of an advisory lock named `name`: its CRC-32 as a signed 32-bit
    integer (the same in every process and Python version, unlike `hash`)."""
    crc = zlib.crc32(name.encode())
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def channel_lock_keys(channels: Sequence[tuple[str, str, str]]) -> list[int]:
    """The ingest lock keys of `channels`, each once and sorted: every transaction takes its
    channels' locks in this one order, so two batches sharing channels wait, not deadlock.
    Two channels whose keys collide only share a lock."""
    return sorted({crc_key("\x00".join(key)) for key in channels})


@dataclass(frozen=True)
class PgDriver:
    """The driver's name and error classes, as the SQLite backend's `Driver` gives them."""

    name: str = "postgres"
    error: type[Exception] = psycopg.Error
    operational_error: type[Exception] = psycopg.OperationalError
    integrity_error: type[Exception] = psycopg.IntegrityError


DRIVER = PgDriver()


_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


def _parsed(url: str) -> dict[str, Any] | None:
    """`url` as libpq reads it (URL, ?password=, key=value form), None when it does not parse."""
    try:
        return conninfo_to_dict(url)
    except psycopg.Error:
        return None


def _password(url: str) -> str | None:
    """The password `url` carries, or None when it has none or does not parse."""
    password = (_parsed(url) or {}).get("password")
    return None if password in (None, "") else str(password)


def masked_url(url: str) -> str:
    """The connection string with its password as '***', in every form libpq accepts: the
    URL's user info (a raw `@` or several hosts included), `?password=`, and key=value
    DSNs (for logs, `stats`, errors and /healthz). Text rules (memory/url_masking.py and
    the key=value `password`), so a string libpq would reject is masked as well; tests hold
    them to what `conninfo_to_dict` reads as the password."""
    return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + MASK, mask_url(url))


def scrub_password(text: str, password: str | None) -> str:
    """`text` with `password`, as typed or percent-encoded, replaced by '***'."""
    if password:
        for form in {password, quote(password, safe=""), quote(password)}:
            text = text.replace(form, MASK)
    return text


def scrub_error(text: str, url: str) -> str:
    """A driver's message about `url`, safe to show: the URL masked, the password gone, and
    the quoted fragments of a parse error (libpq quotes the text it choked on, which may be
    the password) withheld."""
    text = scrub_password(text.replace(url, masked_url(url)), _password(url))
    if _parsed(url) is None:
        text = re.sub(r'"[^"]*"', '"…"', text)
    return text.strip()


class UrlPath(PosixPath):
    """`Database.path` of a PostgreSQL store: prints as the masked URL (stats, logs), but
    refuses to be used as a file (StoreError), so SQLite-only code (a file backup, a file
    size) fails with a message instead of creating a stray SQLite file named after it."""

    _url = ""

    def __new__(cls, url: str) -> UrlPath:
        self = super().__new__(cls, "postgresql")
        self._url = url
        return self

    def __str__(self) -> str:
        return self._url or super().__str__()

    def __fspath__(self) -> str:
        raise StoreError(
            f"{self._url} is a PostgreSQL database, not a file: this needs the SQLite backend"
        )


# ---- rows --------------------------------------------------------------------------------


class PgRow(tuple):  # type: ignore[type-arg]
    """A result row: a tuple (index, slice, unpacking, ==) that also answers row["column"]
    and keys(), like sqlite3.Row. Each result shape gets its own subclass carrying the
    column index, so a row costs no more than a tuple."""

    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                raise IndexError(f"no such column: {key}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[PgRow]:
    index: dict[str, int] = {}
    for pos, name in enumerate(names):
        index.setdefault(name, pos)  # the first of duplicate names, as sqlite3.Row does
    return type("PgRow", (PgRow,), {"_index": index})


def pg_row(cursor: AsyncCursor[Any]) -> Callable[[Sequence[Any]], PgRow]:
    """psycopg row factory building PgRow objects."""
    names = tuple(col.name for col in cursor.description or ())
    cls = _row_class(names)
    return lambda values: cls(values)


class _NumericLoader(Loader):
    """numeric (sum of BIGINT, avg of integers) as int when whole, else float: SQLite gives
    integers and reals, and JSON/arithmetic downstream expects those, not Decimal."""

    def load(self, data: Any) -> int | float:
        text = bytes(data).decode()
        if "." not in text and "e" not in text.lower() and text.lstrip("-").isdigit():
            return int(text)
        return float(text)


# ---- errors ------------------------------------------------------------------------------

_BUSY = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)


def map_error(exc: BaseException, *, where: str, lock_wait_s: float) -> BaseException:
    """The typed store error for a psycopg error, or the error itself when it has none."""
    if isinstance(exc, _BUSY):
        return StoreBusy(
            f"{where}: another process held a conflicting lock ({type(exc).__name__}: "
            f"{str(exc).strip()}); nothing was written. Retry; if it persists, stop the other "
            f"writer or raise SPEAKERMEM_DB_LOCK_WAIT_S (now {lock_wait_s:g} s)"
        )
    if isinstance(exc, psycopg.errors.DiskFull):
        log.error("write refused, %s is full (%s): free disk space", where, exc)
        return StoreFull(f"{where}: database disk is full ({str(exc).strip()})")
    if type(exc) is psycopg.OperationalError or isinstance(exc, psycopg.InterfaceError):
        return StoreError(f"{where}: connection failed ({str(exc).strip()})")
    return exc


# ---- the database ------------------------------------------------------------------------


def pool_max_size(config: StoreConfig) -> int:
    """Connections one process's pool may open: one for its write transaction (a process
    runs one at a time) and one per reader (/recall's rankings run concurrently, one per
    connection). A job lock holds one more of its own while its job runs
    (memory/store/pg/locks.py). The server must allow this many per process."""
    return config.readers + 1


class PgDatabase:
    """A PostgreSQL database: a connection pool, recorded migrations."""

    dialect = POSTGRES

    def __init__(self, config: StoreConfig, progress: MigrationProgress | None = None) -> None:
        if config.db_url is None:
            raise StoreError("PgDatabase needs StoreConfig.db_url (postgresql://...)")
        self.config = config
        self.progress = progress or log_progress
        self.url = config.db_url.get_secret_value()
        self._where = masked_url(self.url)
        self.path = UrlPath(self._where)
        self.driver = DRIVER
        self._pool: AsyncConnectionPool[AsyncConnection[PgRow]] | None = None
        self._write_lock = asyncio.Lock()
        self.migrated: list[int] = []
        """The migrations this process applied when it opened the database."""

    # open / close ---------------------------------------------------------------------

    async def open(self) -> None:
        lock_ms = max(1, int(self.config.lock_wait_s * 1000))

        async def configure(conn: AsyncConnection[Any]) -> None:
            conn.adapters.register_loader("numeric", _NumericLoader)
            await conn.execute(f"SET lock_timeout = {lock_ms}")
            await conn.execute("SET TIME ZONE 'UTC'")

        pool: AsyncConnectionPool[AsyncConnection[PgRow]] = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=pool_max_size(self.config),
            kwargs={"autocommit": True, "cursor_factory": AsyncClientCursor, "row_factory": pg_row},
            configure=configure,
            # a connection the server dropped (restart, failover, idle timeout) is replaced
            # when taken from the pool, not handed to a query that would fail on it
            check=AsyncConnectionPool.check_connection,
            open=False,
            name="speakermem",
        )
        try:
            await pool.open(wait=True, timeout=max(5.0, self.config.lock_wait_s))
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close()
            raise StoreError(
                f"cannot open database {self.where}: {scrub_error(str(exc), self.url)}"
            ) from exc
        self._pool = pool
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise
        log.info("store open: %s (postgres)", self.where)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def where(self) -> str:
        """The URL, password masked."""
        return self._where

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection[PgRow]]:
        if self._pool is None:
            raise StoreError("database is not open")
        return self._pool

    @property
    def writer(self) -> Any:
        raise StoreError("PostgreSQL has no single writer connection: use transaction()")

    async def _migrate(self) -> None:
        applied = [m.version for m in schema.migrations(self.config) if await self._apply(m)]
        self.migrated = applied
        # A rewritten table starts with an empty visibility map: until VACUUM sets it, an
        # index-only scan reads the heap for every row (counting a question's sessions on
        # the index took 4x as long), and autovacuum need not come, the rewrite having left
        # no dead rows. VACUUM cannot run inside the migration's transaction. A database
        # this process created (migration 1 applied now) has nothing to rewrite.
        rewritten: dict[str, None] = {}
        if applied and applied[0] != 1:
            for version in applied:
                rewritten.update(dict.fromkeys(schema.REWRITES.get(version, ())))
        for table in rewritten:
            async with self.reader() as conn:
                await conn.execute(f"VACUUM (ANALYZE) {table}")

    async def _apply(self, migration: Migration) -> bool:
        """Apply one migration unless recorded; True when this process applied it."""
        async with self.transaction() as tx:
            await tx.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            # a migration's commit is on disk before it returns, whatever the server's
            # synchronous_commit: the VACUUM after a rewrite can then mark its pages
            # all-visible (it cannot for a commit not yet flushed)
            await tx.execute("SET LOCAL synchronous_commit = on")
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at DOUBLE PRECISION NOT NULL)"
            )
            done = await tx.fetchone(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
            )
            if done is not None:
                return False
            if migration.sql:
                await tx.executescript_in_tx(migration.sql)
            if migration.step is not None:
                await migration.step(tx, self.progress)
            await tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time()),
            )
        log.info("applied migration %d: %s", migration.version, migration.name)
        return True

    async def schema_version(self) -> int:
        rows = await self.read("SELECT max(version) FROM schema_migrations")
        return int(rows[0][0] or 0)

    # writes ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgTransaction]:
        """One write transaction (BEGIN ... COMMIT on a pooled connection), rolled back on
        any error. Lock waits beyond `lock_wait_s`, serialization failures and deadlocks
        raise StoreBusy; a full disk raises StoreFull; other psycopg errors pass through
        (IntegrityError stays catchable as `db.driver.integrity_error`)."""
        async with self._write_lock:
            try:
                async with (
                    self.pool.connection(timeout=self.config.lock_wait_s) as conn,
                    conn.transaction(),
                ):
                    yield PgTransaction(conn)
            except PoolTimeout as exc:
                raise StoreBusy(
                    f"{self.where}: no free connection for {self.config.lock_wait_s:g} s"
                ) from exc
            except psycopg.Error as exc:
                mapped = map_error(exc, where=self.where, lock_wait_s=self.config.lock_wait_s)
                if mapped is exc:
                    raise
                raise mapped from exc

    # reads ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncConnection[PgRow]]:
        """A pooled connection in autocommit mode (its SQL in psycopg's `%s` format)."""
        try:
            async with self.pool.connection(timeout=self.config.lock_wait_s) as conn:
                yield conn
        except psycopg.Error as exc:
            mapped = map_error(exc, where=self.where, lock_wait_s=self.config.lock_wait_s)
            if mapped is exc:
                raise
            raise mapped from exc

    async def read(self, sql: str, params: Params = ()) -> list[Any]:
        async with self.reader() as conn, conn.cursor() as cur:
            await cur.execute(translate(sql), params)
            return list(await cur.fetchall())

    async def read_prepared(self, sql: str, params: Params = ()) -> list[Any]:
        """`read` for the search's large fixed statements: bound server-side and prepared
        on each pooled connection at first use, so the server parses and plans the text
        once per connection instead of on every search (a tenth of such a statement's
        time). Every parameter must be typed by the SQL (`?::float8`) or by its Python
        value: unlike `read`'s client-side binding, a bare NULL has no type here."""
        async with self.reader() as conn, AsyncCursor(conn) as cur:
            await cur.execute(translate(sql), params, prepare=True)
            return list(await cur.fetchall())

    async def read_in(
        self,
        sql: str,
        values: Sequence[Any],
        *,
        before: tuple[Any, ...] = (),
        chunk: int = IN_CHUNK,
    ) -> list[Any]:
        return await read_in_chunks(self.read, sql, values, before=before, chunk=chunk)


class PgTransaction:
    """The statements of one write transaction on one connection.

    `insert` returns the new row's id: it appends ` RETURNING id` to the INSERT unless the
    SQL already has a RETURNING clause (then its first column is the id). An INSERT that
    inserted nothing (ON CONFLICT DO NOTHING) raises StoreError, as SQLite's missing rowid.
    """

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.pg = conn

    async def policy_lock(self, *, shared: bool) -> None:
        """A transaction-scoped advisory lock: processes that write policy (a forget, an
        opt-out, a switch) wait for ingests and Writer commits in flight, and those that
        start later read the new policy."""
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        await self.execute(f"SELECT {fn}(?)", (POLICY_LOCK,))

    async def ingest_lock(self, channels: Sequence[tuple[str, str, str]]) -> None:
        """Transaction-scoped advisory locks, one per channel, taken in one statement in key
        order: ingests, edits and deletes of a channel run one at a time across processes
        (its cursor, open segment and early changes), those of other channels beside it."""
        keys = channel_lock_keys(channels)
        if keys:
            await self.execute(
                "SELECT count(pg_advisory_xact_lock(?, k))"
                " FROM (SELECT unnest(?::int[]) AS k ORDER BY k) AS keys",
                (INGEST_LOCK_CLASS, keys),
            )

    async def insert_rows(
        self, table: str, columns: Sequence[tuple[str, str]], rows: list[tuple[Any, ...]]
    ) -> None:
        """One INSERT ... SELECT FROM unnest(arrays) per 5,000 rows: the server parses and
        plans one statement, not one per row."""
        names = ", ".join(name for name, _ in columns)
        arrays = ", ".join(f"?::{kind}[]" for _, kind in columns)
        sql = f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays})"
        for start in range(0, len(rows), 5_000):
            chunk = rows[start : start + 5_000]
            await self.execute(sql, [list(col) for col in zip(*chunk, strict=True)])

    async def reserve_ids(self, table: str, n: int) -> list[int]:
        """`n` values of the table's identity sequence (never handed out twice, whatever
        other transactions do)."""
        rows = await self.fetchall(
            "SELECT nextval(pg_get_serial_sequence(?, 'id')) FROM generate_series(1, ?)",
            (table, n),
        )
        return [int(r[0]) for r in rows]

    async def execute(self, sql: str, params: Params = ()) -> Any:
        cur = self.pg.cursor()
        await cur.execute(translate(sql), params)
        return cur

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            async with self.pg.cursor() as cur:
                await cur.executemany(translate(sql), rows)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Any]:
        async with self.pg.cursor() as cur:
            await cur.execute(translate(sql), params)
            return list(await cur.fetchall())

    async def fetchone(self, sql: str, params: Params = ()) -> Any:
        async with self.pg.cursor() as cur:
            await cur.execute(translate(sql), params)
            return await cur.fetchone()

    async def insert(self, sql: str, params: Params = ()) -> int:
        if not re.search(r"\breturning\b", sql, re.IGNORECASE):
            sql = sql.rstrip().rstrip(";") + " RETURNING id"
        row = await self.fetchone(sql, params)
        if row is None:
            raise StoreError("insert returned no row id")
        return int(row[0])

    async def executescript_in_tx(self, script: str) -> None:
        """Run a multi-statement script (no parameters) inside the open transaction.

        Sent as one simple-protocol query: Postgres splits it itself, so PL/pgSQL bodies
        with `;` inside need no splitter, and `%` and `?` are sent untouched."""
        async with self.pg.cursor() as cur:
            await cur.execute(script)
