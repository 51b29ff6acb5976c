"""Read-only facts about an open SQLite store, for `speakermem doctor`: the versions of
SQLite and sqlite-vec, FTS5 and its index, the schema version and the journal mode."""

from __future__ import annotations

from dataclasses import dataclass

from speakermem.memory.store.sqlite.database import SqliteDatabase
from speakermem.memory.store.sqlite.schema import migrations


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


async def diagnose(db: SqliteDatabase, driver: str) -> StoreHealth:
    """Versions, extensions and index health; every query here only reads."""
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
    latest = max(m.version for m in migrations(db.config.vec_chunk_size))
    return StoreHealth(
        path=str(db.path),
        driver=driver,
        sqlite_version=str(sqlite_version),
        vec_version=vec_version,
        fts5=fts5 or fts_ok,
        fts_ok=fts_ok,
        schema_version=await db.schema_version(),
        latest_version=latest,
        journal_mode=str(journal),
    )
