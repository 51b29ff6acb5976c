"""The one package that touches SQLite or PostgreSQL: the dual-track store and its indexes.

`make_store` (memory/store/factory.py) builds the backend the configuration selects; callers
type against the `Store` protocol (memory/store/protocol.py) and catch the errors of
memory/store/errors.py.
"""

from __future__ import annotations

from speakermem.memory.store.catchup import Cursor
from speakermem.memory.store.errors import (
    ChainConflict,
    DriverUnavailable,
    LeaseLost,
    StoreBusy,
    StoreError,
    StoreFull,
)
from speakermem.memory.store.factory import make_store
from speakermem.memory.store.forget_jobs import ForgetJob
from speakermem.memory.store.governance import AuditEntry, ChannelPolicy, RederiveItem
from speakermem.memory.store.messages import ChangeStatus, IngestOutcome, IngestStatus
from speakermem.memory.store.protocol import CatchupCursors, ReconcileReads, Store
from speakermem.memory.store.reconcile import StoredRow
from speakermem.memory.store.records import WriterRunLog
from speakermem.memory.store.segments import Backlog
from speakermem.memory.store.sqlite.driver import pick_driver, stdlib_can_load_extensions

__all__ = [
    "AuditEntry",
    "Backlog",
    "CatchupCursors",
    "ChainConflict",
    "ChangeStatus",
    "ChannelPolicy",
    "Cursor",
    "DriverUnavailable",
    "ForgetJob",
    "IngestOutcome",
    "IngestStatus",
    "LeaseLost",
    "ReconcileReads",
    "RederiveItem",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoredRow",
    "WriterRunLog",
    "make_store",
    "pick_driver",
    "stdlib_can_load_extensions",
]
