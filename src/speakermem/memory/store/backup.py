"""Online backups (`speakermem backup PATH`) of the store the configuration selects:
VACUUM INTO of the SQLite file (memory/store/sqlite/backup.py) or pg_dump of a PostgreSQL
database (memory/store/pg/backup.py)."""

from __future__ import annotations

from pathlib import Path

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.backup_result import BackupResult
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.sqlite.backup import backup_database
from speakermem.memory.store.sqlite.driver import Driver

__all__ = ["BackupResult", "backup_store"]


async def backup_store(
    config: StoreConfig, dest: Path, driver: Driver | None = None
) -> BackupResult:
    """Back up the store `config` selects: pg_dump for PostgreSQL (db_url), else VACUUM INTO
    of the SQLite file (`driver` is needed then)."""
    if config.db_url is not None:
        try:
            from speakermem.memory.store.pg.backup import backup_postgres
        except ImportError as exc:
            raise StoreError(
                f"the PostgreSQL backend needs psycopg ({exc}): pip install 'speakermem[postgres]'"
            ) from exc
        return await backup_postgres(config.db_url.get_secret_value(), dest)
    if driver is None:
        raise StoreError("a SQLite backup needs the SQLite driver")
    return await backup_database(
        config.db_path, dest, driver, busy_timeout_ms=config.busy_timeout_ms
    )
