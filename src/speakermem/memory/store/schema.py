"""What the two backends' schemas share: the migration record, the embedding width, and
the migrations whose SQL both run as it is (memory/store/sqlite/schema.py and
memory/store/pg/schema.py list each backend's migrations in order).

Never edit a released migration: append a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speakermem.memory.store.tombstone_backfill import backfill_person_tombstones

if TYPE_CHECKING:
    from speakermem.memory.store.database import Transaction

EMBED_DIM = 384

MigrationProgress = Callable[[str, int, int], None]
"""Called with (what, rows done, rows in all) while a migration re-indexes rows: the CLI
draws a progress bar from it (integrations/app.py), a service logs it."""

_log = logging.getLogger(__name__)


def log_progress(what: str, done: int, total: int) -> None:
    """The progress of a migration where no bar is drawn: its start and end in the log."""
    if done == 0 or done >= total:
        _log.info("migration: %s %d/%d", what, done, total)


MigrationStep = Callable[["Transaction", MigrationProgress], Awaitable[None]]
"""Work of a migration after its SQL, in the same transaction: a re-index in batches that
reports its progress."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    step: MigrationStep | None = None
    """Runs after `sql` in the same transaction: a re-index in batches, or the backfill of
    an invariant the migration brings in, derived from the rows that exist (SQL alone
    cannot compute a keyed hash)."""


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
        _backfill_tombstones,
    )


async def _backfill_tombstones(tx: Transaction, progress: MigrationProgress) -> None:
    await backfill_person_tombstones(tx)


STORE_META = """
-- Facts about the store itself, by name: `embedder` names the model that wrote its vectors
-- (a process embedding with another model is refused at start, src/speakermem/memory/engine.py).
CREATE TABLE store_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

VECTOR_DRAFTS = """
-- A message vector written from the quicker int8 graph while background embedding was behind
-- (draft = 1) is written again from the full-precision one once nothing waits for a first
-- vector (src/speakermem/memory/background_embedding.py); the index lists what still waits.
ALTER TABLE message_vectors ADD COLUMN draft INTEGER NOT NULL DEFAULT 0;
CREATE INDEX message_vectors_drafts ON message_vectors (id) WHERE draft = 1;
"""
