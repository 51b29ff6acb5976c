"""`make_store`: the store the configuration selects (the one place a backend is chosen)."""

from __future__ import annotations

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.protocol import Store
from speakermem.memory.store.schema import MigrationProgress
from speakermem.memory.store.sqlite.store import SqliteStore


def make_store(
    config: StoreConfig,
    *,
    gap_seconds: float,
    window: int,
    progress: MigrationProgress | None = None,
) -> Store:
    """The store `config` selects: PostgreSQL when `db_url` is set, else the SQLite file.
    `progress` hears of the re-indexing migrations do when the store opens."""
    if config.db_url is not None:
        url = config.db_url.get_secret_value()
        if not url.startswith(("postgresql://", "postgres://")):
            raise StoreError("SPEAKERMEM_DB_URL must start with postgresql:// (or be unset)")
        try:
            from speakermem.memory.store.pg.store import PgStore
        except ImportError as exc:
            raise StoreError(
                f"the PostgreSQL backend needs psycopg ({exc}): pip install 'speakermem[postgres]'"
            ) from exc
        return PgStore(config, gap_seconds=gap_seconds, window=window, progress=progress)
    return SqliteStore(config, gap_seconds=gap_seconds, window=window, progress=progress)
