"""The one module that touches SQLite: the dual-track store and its indexes."""

from __future__ import annotations

from memory.config import StoreConfig
from memory.store.catchup import CatchupRepo
from memory.store.channels import ChannelRepo
from memory.store.console import ConsoleRepo
from memory.store.database import Database, StoreBusy, StoreError
from memory.store.driver import DriverUnavailable, pick_driver, stdlib_can_load_extensions
from memory.store.forget_jobs import ForgetJob, ForgetJobRepo
from memory.store.governance import AuditEntry, ChannelPolicy, GovernanceRepo, RederiveItem
from memory.store.interactions import InteractionRepo
from memory.store.locks import JobLocks
from memory.store.messages import ChangeStatus, IngestOutcome, IngestStatus, MessageRepo
from memory.store.reconcile import ReconcileRepo
from memory.store.records import ChainConflict, RecordRepo, WriterRunLog
from memory.store.segments import SegmentRepo
from memory.store.tombstones import TombstoneRepo

__all__ = [
    "AuditEntry",
    "ChainConflict",
    "ChangeStatus",
    "ChannelPolicy",
    "DriverUnavailable",
    "ForgetJob",
    "GovernanceRepo",
    "IngestOutcome",
    "IngestStatus",
    "RederiveItem",
    "Store",
    "StoreBusy",
    "StoreError",
    "WriterRunLog",
    "make_store",
    "pick_driver",
    "stdlib_can_load_extensions",
]


class Store:
    """The SQLite file and its repositories: channels/rosters, messages, records, segments."""

    def __init__(self, config: StoreConfig, *, gap_seconds: float, window: int) -> None:
        self.db = Database(config)
        self.channels = ChannelRepo(self.db)
        self.messages = MessageRepo(self.db, self.channels, gap_seconds=gap_seconds, window=window)
        self.records = RecordRepo(self.db, self.channels)
        self.segments = SegmentRepo(self.db)
        self.governance = GovernanceRepo(self.db, self.channels)
        self.interactions = InteractionRepo(self.db)
        self.catchup = CatchupRepo(self.db)
        self.console = ConsoleRepo(self.db, self.channels)
        self.reconcile = ReconcileRepo(self.db)
        self.locks = JobLocks()
        self.tombstones = TombstoneRepo(self.db, self.channels)
        self.forget_jobs = ForgetJobRepo(self.db)

    @property
    def driver_name(self) -> str:
        return self.db.driver.name

    def retryable(self, exc: BaseException) -> bool:
        """Whether the same write can succeed later: the store is full, locked, its
        connection was lost (a StoreError, an OS error, the driver's operational error).
        Anything else is a bad write or a bug."""
        return isinstance(exc, StoreError | OSError | self.db.driver.operational_error)

    async def open(self) -> None:
        await self.db.open()

    async def close(self) -> None:
        await self.db.close()

    async def db_size_bytes(self) -> int:
        size = 0
        for suffix in ("", "-wal"):
            path = self.db.path.with_name(self.db.path.name + suffix)
            if path.exists():
                size += path.stat().st_size
        return size


def make_store(config: StoreConfig, *, gap_seconds: float, window: int) -> Store:
    """The store `config` selects: PostgreSQL when `db_url` is set, else the SQLite file."""
    if config.db_url is not None:
        url = config.db_url.get_secret_value()
        if not url.startswith(("postgresql://", "postgres://")):
            raise StoreError("SPEAKERMEM_DB_URL must start with postgresql:// (or be unset)")
        try:
            from memory.store.pg.store import PgStore
        except ImportError as exc:
            raise StoreError(
                f"the PostgreSQL backend needs psycopg ({exc}): pip install 'speakermem[postgres]'"
            ) from exc
        return PgStore(config, gap_seconds=gap_seconds, window=window)
    return Store(config, gap_seconds=gap_seconds, window=window)
