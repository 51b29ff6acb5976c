"""The PostgreSQL store: the same repositories over a PostgreSQL database with pgvector."""

from __future__ import annotations

from speakermem.memory.config import StoreConfig
from speakermem.memory.store.base_store import BaseStore
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.pg.database import DRIVER, PgDatabase
from speakermem.memory.store.pg.locks import PgJobLocks
from speakermem.memory.store.pg.messages import PgMessageRepo
from speakermem.memory.store.pg.records import PgRecordRepo
from speakermem.memory.store.pg.upkeep import settle
from speakermem.memory.store.schema import MigrationProgress


class PgStore(BaseStore):
    """The same attributes as the SQLite store (channels, messages, records, segments,
    governance, interactions, catchup, reconcile, db); messages and records search with
    BM25 over tsvector and pgvector, job locks are advisory locks."""

    db: PgDatabase
    messages: PgMessageRepo
    records: PgRecordRepo

    def __init__(
        self,
        config: StoreConfig,
        *,
        gap_seconds: float,
        window: int,
        progress: MigrationProgress | None = None,
    ) -> None:
        db = PgDatabase(config, progress)
        super().__init__(
            db,
            messages=PgMessageRepo,
            records=PgRecordRepo,
            locks=PgJobLocks(db),
            gap_seconds=gap_seconds,
            window=window,
        )

    @property
    def driver_name(self) -> str:
        return DRIVER.name

    def retryable(self, exc: BaseException) -> bool:
        """Whether the same write can succeed later: the store is full, locked, its
        connection was lost. Anything else is a bad write or a bug."""
        return isinstance(exc, StoreError | OSError | DRIVER.operational_error)

    async def db_size_bytes(self) -> int:
        rows = await self.db.read("SELECT pg_database_size(current_database())")
        return int(rows[0][0])

    async def settle(self) -> list[str]:
        """VACUUM (ANALYZE) the tables a bulk write outgrew (memory/store/pg/upkeep.py), so
        the next questions neither plan without statistics nor wait on autovacuum."""
        return await settle(self.db)
