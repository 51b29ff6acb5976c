"""Read-only facts about an open store, for `speakermem doctor` (SQLite stays in memory.store).

`store_health` picks the diagnosis of the store's backend: `diagnose` here for SQLite,
memory/store/pg/diagnostics.diagnose_pg for PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memory.config import StoreConfig
from memory.store import Store
from memory.store.schema import migrations

if TYPE_CHECKING:
    from memory.store.pg.diagnostics import PgHealth


@dataclass(frozen=True)
class StoreHealth:
    path: str
    driver: str
    sqlite_version: str
    vec_version: str | None
    fts5: bool
    fts_ok: bool
    schema_version: int
    latest_version: int
    journal_mode: str

    @property
    def migrated(self) -> bool:
        return self.schema_version >= self.latest_version


async def diagnose(store: Store) -> StoreHealth:
    """Versions, extensions and index health; every query here only reads."""
    db = store.db
    (sqlite_version,) = (await db.read("SELECT sqlite_version()"))[0]
    try:
        vec_version: str | None = str((await db.read("SELECT vec_version()"))[0][0])
    except Exception:  # the driver's own error class: the extension is not loaded
        vec_version = None
    options = {str(r[0]).upper() for r in await db.read("PRAGMA compile_options")}
    fts5 = "ENABLE_FTS5" in options
    try:
        await db.read("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'doctor'")
        fts_ok = True
    except Exception:
        fts_ok = False
    (journal,) = (await db.read("PRAGMA journal_mode"))[0]
    latest = max(m.version for m in migrations(store.db.config.vec_chunk_size))
    return StoreHealth(
        path=str(db.path),
        driver=store.driver_name,
        sqlite_version=str(sqlite_version),
        vec_version=vec_version,
        fts5=fts5 or fts_ok,
        fts_ok=fts_ok,
        schema_version=await db.schema_version(),
        latest_version=latest,
        journal_mode=str(journal),
    )


async def store_health(store: Store) -> StoreHealth | PgHealth:
    """The diagnosis of `store`'s backend (SQLite: `diagnose`; PostgreSQL: `diagnose_pg`)."""
    if store.driver_name == "postgres":
        from memory.store.pg.database import PgDatabase
        from memory.store.pg.diagnostics import diagnose_pg

        assert isinstance(store.db, PgDatabase)
        return await diagnose_pg(store.db, store.driver_name)
    return await diagnose(store)


def configured_location(config: StoreConfig) -> str:
    """Where `config` points, printable: the masked PostgreSQL URL or the SQLite file."""
    if config.db_url is not None:
        from memory.store.pg.database import masked_url

        return masked_url(config.db_url.get_secret_value())
    return str(config.db_path)


def location(store: Store) -> str:
    """The database file's path, as text."""
    return str(store.db.path)


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
