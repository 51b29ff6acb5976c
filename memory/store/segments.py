"""The Writer's queue: segments move open -> pending -> done; failures back off."""

from __future__ import annotations

import time

from memory.models import Scope, Segment
from memory.store.database import Database
from memory.store.rows import SEGMENT_COLUMNS, segment_from_row


class SegmentRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def close_idle(self, idle_seconds: float, *, now: float | None = None) -> int:
        """Close open segments whose channel has been quiet for `idle_seconds`."""
        now = time.time() if now is None else now
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE segments SET state = 'pending', closed_at = ?"
                " WHERE state = 'open' AND n_messages > 0 AND last_message_at <= ?",
                (now, now - idle_seconds),
            )
            return int(cur.rowcount or 0)

    async def close_channel(self, scope: Scope) -> int:
        """Close a channel's open segment now (a manual flush)."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE segments SET state = 'pending', closed_at = ?"
                " WHERE state = 'open' AND n_messages > 0 AND platform = ? AND workspace = ?"
                " AND channel = ?",
                (time.time(), *scope.key()),
            )
            return int(cur.rowcount or 0)

    async def due(
        self, *, limit: int, now: float | None = None, scope: Scope | None = None
    ) -> list[Segment]:
        """Pending segments ready for a Writer attempt, oldest first."""
        now = time.time() if now is None else now
        sql = (
            f"SELECT {SEGMENT_COLUMNS} FROM segments WHERE state = 'pending'"
            " AND (next_attempt_at IS NULL OR next_attempt_at <= ?)"
            # keep each channel's order: nothing overtakes an earlier segment still backing off
            " AND NOT EXISTS (SELECT 1 FROM segments e WHERE e.channel_pk = segments.channel_pk"
            " AND e.state = 'pending' AND e.id < segments.id AND e.next_attempt_at > ?)"
        )
        params: list[object] = [now, now]
        if scope is not None:
            sql += " AND platform = ? AND workspace = ? AND channel = ?"
            params.extend(scope.key())
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        return [segment_from_row(r) for r in await self.db.read(sql, params)]

    async def defer(self, segment_id: int, error: str, delay_seconds: float) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE segments SET attempts = attempts + 1, last_error = ?,"
                " next_attempt_at = ? WHERE id = ? AND state = 'pending'",
                (error[:500], time.time() + delay_seconds, segment_id),
            )

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read("SELECT state, count(*) FROM segments GROUP BY state")
        out = {"open": 0, "pending": 0, "done": 0}
        out.update({r[0]: int(r[1]) for r in rows})
        return {f"segments_{k}": v for k, v in out.items()}
