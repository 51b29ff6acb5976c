"""The store's errors: what a caller catches, whichever backend raised it.

    StoreError              a storage failure with a message a user can act on
    ├── StoreBusy           another process held a lock longer than we wait
    ├── StoreFull           the database or its disk is full; nothing was written
    ├── ChainConflict       an update targets a record that is no longer its chain's head
    └── LeaseLost           a Writer worker's claim on a segment is gone
    DriverUnavailable       no SQLite driver here can load sqlite-vec (a setup problem)

Each backend maps its driver's errors onto these where it opens a transaction
(memory/store/sqlite/database.py, memory/store/pg/database.py).
"""

from __future__ import annotations


class StoreError(RuntimeError):
    """A storage failure with a message a user can act on."""


class StoreBusy(StoreError):
    """Another process held the write lock for longer than we were willing to wait."""


class StoreFull(StoreError):
    """The database or its disk is full. Nothing of the transaction was written; the same
    write succeeds once space returns (callers keep the event, not drop it)."""


class ChainConflict(StoreError):
    """An update targeted a record that is no longer the active head of its chain."""


class LeaseLost(StoreError):
    """The caller's claim on a segment is gone: another worker claimed it after the lease
    ran out (or it was released or deferred meanwhile). Nothing was written."""


class EmbedderMismatch(StoreError):
    """The store's vectors were written by another embedding model than this process's."""


class DriverUnavailable(RuntimeError):
    """No SQLite driver here can load sqlite-vec."""
