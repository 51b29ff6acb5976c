"""The repositories every backend's store is made of, built once over one database.

A backend's store (memory/store/sqlite/store.py, memory/store/pg/store.py) gives its
database, its message and record repositories (the neutral ones plus its search) and its
job locks, and says what is its own: the driver's name, which errors a retry may cure, the
database's size on disk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from speakermem.memory.store.catchup import CatchupRepo
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.console import ConsoleRepo
from speakermem.memory.store.database import Database
from speakermem.memory.store.forget_jobs import ForgetJobRepo
from speakermem.memory.store.governance import GovernanceRepo
from speakermem.memory.store.interactions import InteractionRepo
from speakermem.memory.store.messages import MessageRepo
from speakermem.memory.store.protocol import JobLocks
from speakermem.memory.store.reconcile import ReconcileRepo
from speakermem.memory.store.records import RecordRepo
from speakermem.memory.store.segments import SegmentRepo
from speakermem.memory.store.tombstones import TombstoneRepo


class BaseStore(ABC):
    """One database and its repositories (the `Store` protocol)."""

    def __init__(
        self,
        db: Database,
        *,
        messages: type[MessageRepo],
        records: type[RecordRepo],
        locks: JobLocks,
        gap_seconds: float,
        window: int,
    ) -> None:
        self.db = db
        self.channels = ChannelRepo(db)
        self.governance = GovernanceRepo(db, self.channels)
        # a platform delete runs the same forgetting cascade as every governance path
        self.messages = messages(
            db, self.channels, self.governance, gap_seconds=gap_seconds, window=window
        )
        self.records = records(db, self.channels)
        self.segments = SegmentRepo(db)
        self.interactions = InteractionRepo(db)
        self.catchup = CatchupRepo(db)
        self.console = ConsoleRepo(db, self.channels)
        self.reconcile = ReconcileRepo(db)
        self.locks = locks
        self.tombstones = TombstoneRepo(db, self.channels)
        self.forget_jobs = ForgetJobRepo(db)

    async def open(self) -> None:
        """Open the database, then settle what its migrations just changed on an existing
        one (a new database, created by migration 1 now, is empty)."""
        await self.db.open()
        if self.db.migrated and self.db.migrated[0] != 1:
            await self.settle()

    async def close(self) -> None:
        await self.db.close()

    @property
    @abstractmethod
    def driver_name(self) -> str:
        """'stdlib' or 'sqlean' (the SQLite driver), or 'postgres'."""

    @abstractmethod
    def retryable(self, exc: BaseException) -> bool:
        """Whether the same write can succeed later (see the `Store` protocol)."""

    @abstractmethod
    async def db_size_bytes(self) -> int:
        """The database's size on disk."""

    @abstractmethod
    async def settle(self) -> list[str]:
        """After a bulk write (an import, a backlog of vectors, a graph catch-up): what a
        fresh database needs before it is queried; returns the tables it settled."""
