"""Edits and deletes that arrive before their message (`early_changes`).

Reordering by retries and reconnects, and catch-up racing live events, deliver an edit or a
delete before the create it changes. The change is kept here; the create that follows is
stored with the newest early edit's text, or, after a delete, stored and forgotten in the
same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from speakermem.memory.models import EditEvent, MessageEvent, Scope
from speakermem.memory.store.database import Transaction
from speakermem.memory.store.dialect import Dialect

EARLY_EDIT_TTL_S = 86_400.0
"""How long the text of an edit whose message never arrived is kept: reordering by retries
and reconnects spans minutes, and catch-up and imports fetch the edited text anyway. Early
deletes are kept for good: they hold ids only, and stop an import bringing a message back."""

BATCH = 5_000
"""Keys looked up per statement."""

Key = tuple[str, ...]
"""(platform, workspace, channel, message id)."""


@dataclass(frozen=True)
class Early:
    deleted: bool
    text: str | None
    edited_at: float | None


async def prune_edits(tx: Transaction) -> None:
    """Drop the text of early edits older than EARLY_EDIT_TTL_S."""
    await tx.execute(
        "DELETE FROM early_changes WHERE deleted_at IS NULL AND received_at < ?",
        (time.time() - EARLY_EDIT_TTL_S,),
    )


async def pending_for(
    tx: Transaction, dialect: Dialect, events: Sequence[MessageEvent]
) -> dict[Key, Early]:
    """Edits and deletes kept for these messages: (platform, workspace, channel, id) ->."""
    if await tx.fetchone("SELECT 1 FROM early_changes LIMIT 1") is None:
        return {}  # the usual case: one cheap probe per batch
    await prune_edits(tx)
    keys = [(*ev.scope.key(), ev.message_id) for ev in events]
    batch = dialect.batch(("text", "text", "text", "text"))
    p, w, c, m = batch.columns
    sql = (
        "SELECT e.platform, e.workspace, e.channel, e.message_id, e.deleted_at, e.text,"
        f" e.edited_at FROM {batch.source} {batch.join} early_changes AS e"
        f" ON e.platform = {p} AND e.workspace = {w} AND e.channel = {c} AND e.message_id = {m}"
    )
    out: dict[Key, Early] = {}
    for start in range(0, len(keys), BATCH):
        for r in await tx.fetchall(sql, batch.params(keys[start : start + BATCH])):
            out[(r[0], r[1], r[2], r[3])] = Early(r[4] is not None, r[5], r[6])
    return out


async def drop(tx: Transaction, keys: list[Key]) -> None:
    """Forget these keys' kept changes (consumed by their create, or refused with it)."""
    await tx.executemany(
        "DELETE FROM early_changes WHERE platform = ? AND workspace = ? AND channel = ?"
        " AND message_id = ?",
        keys,
    )


async def keep_edit(tx: Transaction, event: EditEvent, at: float) -> None:
    """Keep the newest edit of a message not stored yet (none after its delete)."""
    now = time.time()
    await prune_edits(tx)
    await tx.execute(
        "INSERT INTO early_changes (platform, workspace, channel, message_id, text,"
        " edited_at, received_at, author_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (platform, workspace, channel, message_id) DO UPDATE"
        " SET text = excluded.text, edited_at = excluded.edited_at,"
        " received_at = excluded.received_at, author_id = excluded.author_id"
        " WHERE early_changes.deleted_at IS NULL"
        " AND (early_changes.edited_at IS NULL OR excluded.edited_at > early_changes.edited_at"
        " OR (excluded.edited_at = early_changes.edited_at"
        " AND excluded.text > early_changes.text))",
        (*event.scope.key(), event.message_id, event.text, at, now, event.author_id),
    )


async def keep_delete(tx: Transaction, scope: Scope, message_id: str) -> None:
    """Keep a delete of a message not stored yet (for good: it drops any early edit's text)."""
    await tx.execute(
        "INSERT INTO early_changes (platform, workspace, channel, message_id,"
        " deleted_at, received_at) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (platform, workspace, channel, message_id) DO UPDATE"
        " SET deleted_at = coalesce(early_changes.deleted_at, excluded.deleted_at),"
        " text = NULL, edited_at = NULL",
        (*scope.key(), message_id, time.time(), time.time()),
    )
