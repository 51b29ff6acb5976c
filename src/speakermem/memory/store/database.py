"""What a repository needs of a database, whichever backend: reads, one write transaction
at a time, and the backend's dialect.

`memory/store/sqlite/database.py` (one writer connection and a pool of readers over the
SQLite file) and `memory/store/pg/database.py` (a psycopg pool) implement these protocols;
the repositories are written against them and never against a backend class.

SQL keeps SQLite's `?` placeholders on both backends (PostgreSQL's database translates
them once per statement text), and rows answer both `row[0]` and `row["column"]`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.dialect import Dialect
from speakermem.memory.store.errors import StoreBusy as StoreBusy  # the errors' old import path
from speakermem.memory.store.errors import StoreError as StoreError
from speakermem.memory.store.errors import StoreFull as StoreFull
from speakermem.memory.store.inlists import in_list

IN_CHUNK = 512
"""Values per IN (...) list: well under SQLite's default 32,766 bound variables, and a
power of two, so a full chunk needs no padding (memory.store.inlists)."""

Params = tuple[Any, ...] | list[Any]


class Transaction(Protocol):
    """The statements of one write transaction."""

    async def execute(self, sql: str, params: Params = ()) -> Any:
        """Run a statement; the result has the driver's `rowcount`."""

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Run a statement once per row (nothing when there are none)."""

    async def insert_rows(
        self, table: str, columns: Sequence[tuple[str, str]], rows: list[tuple[Any, ...]]
    ) -> None:
        """INSERT `rows` into `table`'s (name, type) `columns` (types 'bigint', 'text',
        'double precision', 'integer') as the backend sends a burst fastest."""

    async def fetchall(self, sql: str, params: Params = ()) -> list[Any]: ...

    async def fetchone(self, sql: str, params: Params = ()) -> Any:
        """The first row of a single-row query (callers select by key or aggregate)."""

    async def insert(self, sql: str, params: Params = ()) -> int:
        """Run an INSERT of one row; its new id."""

    async def executescript_in_tx(self, script: str) -> None:
        """Run a multi-statement script (no parameters) inside the open transaction."""

    async def policy_lock(self, *, shared: bool) -> None:
        """Order this transaction against the policy writes (switches, opt-outs,
        tombstones): those take it exclusive, the writes they govern (ingest, Writer
        commits) shared."""

    async def ingest_lock(self, channels: Sequence[tuple[str, str, str]]) -> None:
        """Order this transaction against every other ingest, edit or delete of messages in
        `channels` (scope keys: platform, workspace, channel): placement reads each
        channel's cursor and open segment, and a create must not miss its early edit or
        delete. Ingests of other channels go on beside it."""

    async def reserve_ids(self, table: str, n: int) -> list[int]:
        """`n` fresh ids for rows of `table` that this transaction inserts with explicit
        ids (rows that reference each other are written in one executemany per table)."""


class Database(Protocol):
    """One database: its configuration, dialect, reads and write transactions."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def dialect(self) -> Dialect: ...

    @property
    def where(self) -> str:
        """Where the data is, printable: the file's path or the masked URL."""

    async def open(self) -> None:
        """Connect and apply every migration not applied yet."""

    @property
    def migrated(self) -> list[int]:
        """The versions the last `open` applied, in order (1 first on a new database)."""

    async def close(self) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """One write transaction, rolled back on any error; a lock held too long raises
        StoreBusy, a full disk StoreFull."""

    async def read(self, sql: str, params: Params = ()) -> list[Any]:
        """The rows of a read, outside any write transaction."""

    async def read_in(
        self,
        sql: str,
        values: Sequence[Any],
        *,
        before: tuple[Any, ...] = (),
        chunk: int = IN_CHUNK,
    ) -> list[Any]:
        """Rows of `sql` whose `{marks}` placeholder is an IN list over `values`, chunked;
        `before` binds the parameters that precede the list."""

    async def schema_version(self) -> int:
        """The newest migration applied."""


async def read_in_chunks(
    read: Callable[[str, Params], Awaitable[list[Any]]],
    sql: str,
    values: Sequence[Any],
    *,
    before: tuple[Any, ...] = (),
    chunk: int = IN_CHUNK,
) -> list[Any]:
    """`Database.read_in` over a database's `read`: one statement per `chunk` values."""
    rows: list[Any] = []
    values = list(values)
    for start in range(0, len(values), chunk):
        marks, part = in_list(values[start : start + chunk])
        rows.extend(await read(sql.format(marks=marks), (*before, *part)))
    return rows
