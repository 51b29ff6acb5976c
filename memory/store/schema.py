"""What the two backends' schemas share: the migration record, the embedding width, and
the migrations whose SQL both run as it is (memory/store/sqlite/schema.py and
memory/store/pg/schema.py list each backend's migrations in order).

Never edit a released migration: append a new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memory.store.tombstone_backfill import backfill_person_tombstones

if TYPE_CHECKING:
    from memory.store.database import Transaction

EMBED_DIM = 384


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    backfill: Callable[[Transaction], Awaitable[object]] | None = None
    """Runs after `sql` in the same transaction: a migration that brings in an invariant
    also derives it from the rows that exist (SQL alone cannot compute a keyed hash)."""


PENDING_SEGMENT_INDEXES = """
CREATE INDEX segments_pending ON segments (id) WHERE state = 'pending';
CREATE INDEX segments_channel_pending ON segments (channel_pk, id) WHERE state = 'pending';
"""
"""The Writer's queue in order, and each channel's earlier pending segments: without them
finding the due segments checked every pending segment against every other (51,000 pending
after an outage: 308 s for one `due()`, 4 s with the channel index, 0.1 ms with both)."""


RECONCILE_DETAIL = """
-- Reconciliation after downtime (bot/reconcile.py) keeps its state in a cursor of kind
-- 'reconcile': the windows still to check, newest first, and what it found, as JSON.
ALTER TABLE catchup_cursors ADD COLUMN detail TEXT;
"""


def tombstone_backfill(version: int) -> Migration:
    """SQLite migration 11 / PostgreSQL 15: tombstones for the people forgotten before SQLite
    9 / PostgreSQL 11 brought them in (their forgets' receipts are in the audit log). No
    schema change: rows only, written by memory.store.tombstone_backfill."""
    return Migration(
        version,
        "governance: tombstones of people forgotten before tombstones existed",
        "",
        backfill_person_tombstones,
    )
