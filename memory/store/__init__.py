"""The one package that touches SQLite or PostgreSQL: the dual-track store and its indexes.

`make_store` (memory/store/factory.py) builds the backend the configuration selects; callers
type against the `Store` protocol (memory/store/protocol.py) and catch the errors of
memory/store/errors.py.
"""

from __future__ import annotations

from memory.store.catchup import Cursor
from memory.store.errors import (
    ChainConflict,
    DriverUnavailable,
    LeaseLost,
    StoreBusy,
    StoreError,
    StoreFull,
)
from memory.store.factory import make_store
from memory.store.forget_jobs import ForgetJob
from memory.store.governance import AuditEntry, ChannelPolicy, RederiveItem
from memory.store.messages import ChangeStatus, IngestOutcome, IngestStatus
from memory.store.protocol import CatchupCursors, ReconcileReads, Store
from memory.store.reconcile import StoredRow
from memory.store.records import WriterRunLog
from memory.store.segments import Backlog
from memory.store.sqlite.driver import pick_driver, stdlib_can_load_extensions

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
