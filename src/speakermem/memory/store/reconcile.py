"""What reconciliation after downtime reads: the stored messages of a channel's window, and
the rows a thread, channel or workspace deleted on the platform leaves behind.

Plain SQL over `messages` and `channels`, portable to PostgreSQL (its Database takes the same
placeholders), so both backends share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from speakermem.memory.models import Scope
from speakermem.memory.store.database import Database


@dataclass(frozen=True)
class StoredRow:
    """A live stored message as reconciliation compares it with the platform."""

    message_id: str
    ts: float
    thread_id: str | None
    text: str
    edited_at: float | None


_CHANNEL = (
    "FROM messages m JOIN channels c ON c.id = m.channel_pk"
    " WHERE c.platform = ? AND c.workspace = ? AND c.channel = ?"
)


class ReconcileRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def window(self, scope: Scope, low: float, high: float) -> list[StoredRow]:
        """Live messages of the channel (its threads included) with ``low <= ts <= high``,
        newest first."""
        rows = await self.db.read(
            "SELECT m.message_id, m.ts, m.thread_id, m.text, m.edited_at "
            + _CHANNEL
            + " AND m.deleted_at IS NULL AND m.ts >= ? AND m.ts <= ? ORDER BY m.ts DESC, m.id DESC",
            (*scope.key(), low, high),
        )
        return [
            StoredRow(
                message_id=str(r[0]),
                ts=float(r[1]),
                thread_id=r[2],
                text=str(r[3]),
                edited_at=float(r[4]) if r[4] is not None else None,
            )
            for r in rows
        ]

    async def count(self, scope: Scope, low: float, high: float) -> int:
        """Live messages of the channel with ``low <= ts <= high``."""
        rows = await self.db.read(
            "SELECT count(*) " + _CHANNEL + " AND m.deleted_at IS NULL AND m.ts >= ? AND m.ts <= ?",
            (*scope.key(), low, high),
        )
        return int(rows[0][0]) if rows else 0

    async def thread_messages(self, scope: Scope, thread_id: str) -> list[tuple[int, str]]:
        """(pk, message id) of the stored messages of a thread of the channel (its replies;
        the message that started it belongs to the channel)."""
        rows = await self.db.read(
            "SELECT m.id, m.message_id " + _CHANNEL + " AND m.thread_id = ?",
            (*scope.key(), thread_id),
        )
        return [(int(r[0]), str(r[1])) for r in rows]
