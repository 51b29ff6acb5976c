"""Read-only facts about an open PostgreSQL store, for `speakermem doctor`.

The counterpart of memory/store/sqlite/diagnostics.diagnose (SQLite versions and PRAGMAs):
the server's version, pgvector's, whether the `speakermem` text search configuration the
full-text columns are built with exists and answers, the schema version against this
release's latest, and the connection pool's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.store.pg.database import PgDatabase
from memory.store.pg.schema import migrations


@dataclass(frozen=True)
class PgHealth:
    location: str
    """The database URL with the password masked."""
    driver: str
    server_version: str
    vector_version: str | None
    """pgvector's extension version, None when the extension is not installed here."""
    text_search: bool
    """The `speakermem` text search configuration exists and stems text."""
    schema_version: int
    latest_version: int
    pool_size: int
    """Connections open in the pool now."""
    pool_max: int

    @property
    def migrated(self) -> bool:
        return self.schema_version >= self.latest_version


async def diagnose_pg(db: PgDatabase, driver: str = "postgres") -> PgHealth:
    """Versions, extension, text search and pool of `db`; every query here only reads."""
    (server_version,) = (await db.read("SELECT current_setting('server_version')"))[0]
    rows = await db.read("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    vector_version = str(rows[0][0]) if rows else None
    rows = await db.read("SELECT count(*) FROM pg_ts_config WHERE cfgname = 'speakermem'")
    text_search = bool(rows[0][0])
    if text_search:
        # the configuration answers: a word comes back as a stemmed lexeme
        rows = await db.read("SELECT to_tsvector('speakermem', 'doctors')::text")
        text_search = "doctor" in str(rows[0][0])
    latest = max(m.version for m in migrations(db.config))
    stats = db.pool.get_stats()
    return PgHealth(
        location=db.where,
        driver=driver,
        server_version=str(server_version),
        vector_version=vector_version,
        text_search=text_search,
        schema_version=await db.schema_version(),
        latest_version=latest,
        pool_size=int(stats.get("pool_size", 0)),
        pool_max=db.pool.max_size,
    )
