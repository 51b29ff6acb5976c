"""Store maintenance that runs without an open engine: where the configured store lives, its
backup, and the copy of a SQLite store into PostgreSQL.

The CLI's door to them (`speakermem backup`, `migrate`, `stats`, `doctor`), as the engine is
the door for everything that runs with a store open: no command imports the store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.backup import BackupResult, backup_store
from speakermem.memory.store.diagnostics import configured_location
from speakermem.memory.store.driver import pick_driver

if TYPE_CHECKING:
    from speakermem.memory.store.migrate import MigrationReport

__all__ = ["BackupResult", "backup", "migrate_into_postgres", "migration_source", "where"]


def where(config: StoreConfig) -> str:
    """Where `config` points, printable: the masked PostgreSQL URL or the SQLite file."""
    return configured_location(config)


async def backup(config: StoreConfig, dest: Path) -> BackupResult:
    """A consistent copy of the store `config` selects at `dest`: pg_dump for PostgreSQL,
    else the SQLite file's `VACUUM INTO`, integrity-checked before it is renamed into place.
    Raises StoreError (or DriverUnavailable) with what went wrong."""
    driver = None if config.db_url is not None else pick_driver(config.sqlite_driver)
    return await backup_store(config, dest, driver)


def migration_source(spec: str) -> Path:
    """The SQLite file `spec` names (`sqlite:PATH` or a plain path); StoreError when it names
    none. ImportError when the PostgreSQL driver is not installed (nothing to copy into)."""
    from speakermem.memory.store.migrate import parse_source

    return parse_source(spec)


async def migrate_into_postgres(
    source: Path,
    target_url: str,
    *,
    batch: int,
    progress: Callable[[str, int], None] | None = None,
    on_counts: Callable[[dict[str, int]], None] | None = None,
    sqlite_driver: str = "auto",
    prune: bool = False,
) -> MigrationReport:
    """Copy the SQLite store at `source` into the PostgreSQL database at `target_url`
    (re-runnable: rows already equal are not rewritten) and return the per-table counts;
    `prune` also deletes target rows the source no longer has. See memory.store.migrate."""
    from speakermem.memory.store.migrate import migrate

    return await migrate(
        source,
        target_url,
        batch=batch,
        progress=progress,
        on_counts=on_counts,
        sqlite_driver=sqlite_driver,
        prune=prune,
    )
