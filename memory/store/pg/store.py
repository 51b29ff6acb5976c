"""PgStore: the repositories of `memory.store.Store` over a PostgreSQL database."""

from __future__ import annotations

from memory.config import StoreConfig
from memory.store import Store
from memory.store.console import ConsoleRepo
from memory.store.forget_jobs import ForgetJobRepo
from memory.store.pg.catchup import PgCatchupRepo
from memory.store.pg.channels import PgChannelRepo
from memory.store.pg.database import PgDatabase
from memory.store.pg.governance import PgGovernanceRepo
from memory.store.pg.interactions import PgInteractionRepo
from memory.store.pg.locks import PgJobLocks
from memory.store.pg.messages import PgMessageRepo
from memory.store.pg.records import PgRecordRepo
from memory.store.pg.segments import PgSegmentRepo
from memory.store.reconcile import ReconcileRepo
from memory.store.tombstones import TombstoneRepo


class PgStore(Store):
    """The same attributes as the SQLite `Store` (channels, messages, records, segments,
    governance, interactions, catchup, reconcile, db), each a repository whose SQL
    PostgreSQL runs: a PostgreSQL subclass where the SQLite one has SQLite-only SQL."""

    def __init__(self, config: StoreConfig, *, gap_seconds: float, window: int) -> None:
        # no super().__init__: that would build the SQLite Database
        self.db = PgDatabase(config)
        self.channels = PgChannelRepo(self.db)
        self.messages = PgMessageRepo(
            self.db, self.channels, gap_seconds=gap_seconds, window=window
        )
        self.records = PgRecordRepo(self.db, self.channels)
        self.segments = PgSegmentRepo(self.db)
        self.governance = PgGovernanceRepo(self.db, self.channels)
        self.interactions = PgInteractionRepo(self.db)
        self.catchup = PgCatchupRepo(self.db)
        self.console = ConsoleRepo(self.db, self.channels)
        self.reconcile = ReconcileRepo(self.db)  # portable SQL
        self.locks = PgJobLocks(self.db)
        self.tombstones = TombstoneRepo(self.db, self.channels)
        self.forget_jobs = ForgetJobRepo(self.db)

    @property
    def driver_name(self) -> str:
        return "postgres"

    async def db_size_bytes(self) -> int:
        rows = await self.db.read("SELECT pg_database_size(current_database())")
        return int(rows[0][0])
