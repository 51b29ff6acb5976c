"""Read-only facts about an open store, for `speakermem doctor`, `status` and `stats`.

`store_health` picks the diagnosis of the store's backend: memory/store/sqlite/diagnostics.py
(SQLite's versions and PRAGMAs) or memory/store/pg/diagnostics.py (the server's). The other
functions here are portable SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.protocol import Store
from speakermem.memory.store.sqlite.database import SqliteDatabase
from speakermem.memory.store.sqlite.diagnostics import StoreHealth, diagnose

if TYPE_CHECKING:
    from speakermem.memory.store.pg.diagnostics import PgHealth

__all__ = [
    "StoreHealth",
    "configured_location",
    "last_writer_run",
    "location",
    "schema_version",
    "status_counts",
    "store_health",
]


async def store_health(store: Store) -> StoreHealth | PgHealth:
    """The diagnosis of `store`'s backend (SQLite: `diagnose`; PostgreSQL: `diagnose_pg`)."""
    if isinstance(store.db, SqliteDatabase):
        return await diagnose(store.db, store.driver_name)
    from speakermem.memory.store.pg.database import PgDatabase
    from speakermem.memory.store.pg.diagnostics import diagnose_pg

    assert isinstance(store.db, PgDatabase)
    return await diagnose_pg(store.db, store.driver_name)


def configured_location(config: StoreConfig) -> str:
    """Where `config` points, printable: the masked PostgreSQL URL or the SQLite file."""
    if config.db_url is not None:
        from speakermem.memory.store.pg.database import masked_url

        return masked_url(config.db_url.get_secret_value())
    return str(config.db_path)


def location(store: Store) -> str:
    """Where the data is, printable: the database file's path, or the masked URL."""
    return store.db.where


async def schema_version(store: Store) -> int:
    """The newest migration applied to the open store."""
    return await store.db.schema_version()


async def last_writer_run(store: Store) -> tuple[float | None, str | None]:
    """When the Writer last started a run and the outcome of the newest one (None, None if
    it never ran)."""
    rows = await store.db.read(
        "SELECT max(started_at), (SELECT outcome FROM writer_runs ORDER BY id DESC LIMIT 1)"
        " FROM writer_runs"
    )
    return rows[0][0], rows[0][1]


async def status_counts(
    store: Store, platform: str | None = None, workspace: str | None = None
) -> dict[str, object]:
    """What `status` counts, for one workspace (or platform) when given, else the whole
    store: an admin asking in one workspace sees that workspace's numbers only."""
    scoped = (platform, platform, workspace, workspace)
    where = "(? IS NULL OR platform = ?) AND (? IS NULL OR workspace = ?)"
    channels = f"channel_pk IN (SELECT id FROM channels WHERE {where})"
    (m,) = await store.db.read(
        "SELECT count(*) FILTER (WHERE deleted_at IS NULL),"
        " count(*) FILTER (WHERE deleted_at IS NOT NULL),"
        " count(*) FILTER (WHERE deleted_at IS NULL AND embedded = 0)"
        f" FROM messages WHERE {channels}",
        scoped,
    )
    (r,) = await store.db.read(
        f"SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM records WHERE {channels}",
        scoped,
    )
    segments = dict(
        await store.db.read(
            f"SELECT state, count(*) FROM segments WHERE {channels} GROUP BY state", scoped
        )
    )
    (run,) = await store.db.read(
        f"SELECT max(started_at), (SELECT outcome FROM writer_runs WHERE {where}"
        f" ORDER BY id DESC LIMIT 1) FROM writer_runs WHERE {where}",
        scoped * 2,
    )
    return {
        "messages": int(m[0]),
        "tombstones": int(m[1]),
        "unembedded": int(m[2]),
        "records": int(r[0]),
        "records_active": int(r[1]),
        "pending_segments": int(segments.get("pending", 0)),
        "open_segments": int(segments.get("open", 0)),
        "writer_last_run": run[0],
        "writer_last_outcome": run[1],
    }
