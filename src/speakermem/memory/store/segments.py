"""The Writer's queue: segments move open -> pending -> done; failures back off.

Writer workers in other processes take segments with `claim`: a claim is a lease (claimed_by,
lease_until), so a worker that dies mid-segment holds it only until the lease runs out, and
then any worker claims it again. Only the oldest pending segment of a channel can be claimed,
and not while it is leased or backing off, so a channel's segments are written in order even
with many workers (a later segment's records may update an earlier one's).

Whatever a worker does to a segment afterwards (`defer`, `renew`, `release`, and
`RecordRepo.commit_segment`) applies only while it still holds the claim: a worker whose lease
ran out and whose segment another worker has claimed since never overwrites that worker's
lease, backoff or records (`holds_claim`). The in-process Writer does not claim; it passes no
worker id and acts on any segment no live claim holds.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from speakermem.memory.models import Scope, Segment
from speakermem.memory.store.database import Database
from speakermem.memory.store.errors import LeaseLost as LeaseLost  # its old import path
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.rows import SEGMENT_COLUMNS, segment_from_row


class Backlog(NamedTuple):
    """The pending segments in aggregate (timestamps in epoch seconds, None when none)."""

    pending: int
    deferred: int
    """Pending segments that failed at least once."""
    oldest_opened_at: float | None
    earliest_retry_at: float | None


def holds_claim(
    claimed_by: str | None, lease_until: float | None, worker_id: str | None, now: float
) -> bool:
    """Whether `worker_id` may still act on a pending segment whose claim columns are
    `claimed_by` / `lease_until`.

    A worker holds the segment while `claimed_by` names it, even after its lease ran out,
    as long as no one else claimed it since (a claim rewrites `claimed_by`; `release` and
    `defer` clear it). No worker id (the in-process Writer, which never claims) may act
    unless a live lease of some worker holds the segment."""
    if worker_id is not None:
        return claimed_by == worker_id
    return claimed_by is None or lease_until is None or lease_until <= now


def _holder_sql(worker_id: str | None, now: float) -> tuple[str, tuple[object, ...]]:
    """`holds_claim` as a WHERE condition on segments (with its parameters)."""
    if worker_id is not None:
        return " AND claimed_by = ?", (worker_id,)
    return " AND (claimed_by IS NULL OR lease_until IS NULL OR lease_until <= ?)", (now,)


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

    async def backlog(self) -> Backlog:
        """The Writer's queue in one aggregate, for health and metrics. (Listing the pending
        segments to measure them cost `due()`'s per-channel order check for each: O(pending²),
        351 s at 51,000 pending, and past the health probe's 2 s at 2,300 under load.)"""
        rows = await self.db.read(
            "SELECT count(*), coalesce(sum(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), 0),"
            " min(opened_at), min(next_attempt_at) FROM segments WHERE state = 'pending'"
        )
        r = rows[0]
        return Backlog(
            pending=int(r[0]),
            deferred=int(r[1]),
            oldest_opened_at=None if r[2] is None else float(r[2]),
            earliest_retry_at=None if r[3] is None else float(r[3]),
        )

    async def due(
        self, *, limit: int, now: float | None = None, scope: Scope | None = None
    ) -> list[Segment]:
        """Pending segments ready for a Writer attempt, oldest first.

        A segment a worker's live lease holds is not ready (that worker is writing it), nor
        is any later segment of its channel."""
        now = time.time() if now is None else now
        sql = (
            f"SELECT {SEGMENT_COLUMNS} FROM segments{self.db.dialect.pending_in_order}"
            " WHERE state = 'pending'"
            " AND (next_attempt_at IS NULL OR next_attempt_at <= ?)"
            " AND (lease_until IS NULL OR lease_until <= ?)"
            # keep each channel's order: nothing overtakes an earlier segment still backing
            # off or being written by a worker
            " AND NOT EXISTS (SELECT 1 FROM segments e WHERE e.channel_pk = segments.channel_pk"
            " AND e.state = 'pending' AND e.id < segments.id"
            " AND (e.next_attempt_at > ? OR e.lease_until > ?))"
        )
        params: list[object] = [now, now, now, now]
        if scope is not None:
            sql += " AND platform = ? AND workspace = ? AND channel = ?"
            params.extend(scope.key())
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        return [segment_from_row(r) for r in await self.db.read(sql, params)]

    async def defer(
        self,
        segment_id: int,
        error: str,
        delay_seconds: float,
        *,
        worker_id: str | None = None,
        now: float | None = None,
    ) -> bool:
        """Back off after a failed attempt; a worker's lease on it ends (the backoff rules).

        Only while the caller holds the segment (`holds_claim`): a worker that lost its lease
        leaves the new holder's claim alone. False when nothing changed (not held, not
        pending)."""
        now = time.time() if now is None else now
        holder, held = _holder_sql(worker_id, now)
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE segments SET attempts = attempts + 1, last_error = ?,"
                " next_attempt_at = ?, claimed_by = NULL, lease_until = NULL"
                " WHERE id = ? AND state = 'pending'" + holder,
                (error[:500], now + delay_seconds, segment_id, *held),
            )
            return bool(cur.rowcount)

    async def claim(
        self,
        worker_id: str,
        lease_s: float,
        *,
        limit: int = 1,
        now: float | None = None,
    ) -> list[Segment]:
        """Lease up to `limit` segments (each the oldest pending one of its channel, due, and
        not leased by a live claim) to `worker_id` for `lease_s` seconds, oldest first.

        A segment comes back here only after its lease ran out (the worker died or stalled)
        or was given up (`release`, `defer`); `commit_segment` marks it done for good."""
        now = time.time() if now is None else now
        if limit <= 0:
            return []
        dialect = self.db.dialect
        async with self.db.transaction() as tx:
            rows = await tx.fetchall(
                f"SELECT {SEGMENT_COLUMNS} FROM segments{dialect.pending_in_order}"
                " WHERE state = 'pending'"
                " AND (next_attempt_at IS NULL OR next_attempt_at <= ?)"
                " AND (lease_until IS NULL OR lease_until <= ?)"
                # only a channel's oldest pending segment: nothing overtakes one in flight
                " AND NOT EXISTS (SELECT 1 FROM segments e WHERE e.channel_pk = segments.channel_pk"
                " AND e.state = 'pending' AND e.id < segments.id)"
                " ORDER BY id LIMIT ?" + dialect.claim_lock,
                (now, now, limit),
            )
            segments = [segment_from_row(r) for r in rows]
            if segments:
                marks, ids = in_list([s.id for s in segments])
                await tx.execute(
                    f"UPDATE segments SET claimed_by = ?, lease_until = ? WHERE id IN ({marks})",
                    (worker_id, now + lease_s, *ids),
                )
        return segments

    async def renew(
        self, segment_id: int, worker_id: str, lease_s: float, *, now: float | None = None
    ) -> bool:
        """Extend a worker's lease (a long LLM call); False once another worker reclaimed
        the segment or it was written."""
        now = time.time() if now is None else now
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE segments SET lease_until = ? WHERE id = ? AND claimed_by = ?"
                " AND state = 'pending'",
                (now + lease_s, segment_id, worker_id),
            )
            return bool(cur.rowcount)

    async def release(self, segment_id: int, worker_id: str) -> bool:
        """Give a claimed segment back unwritten (a worker shutting down)."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE segments SET claimed_by = NULL, lease_until = NULL"
                " WHERE id = ? AND claimed_by = ? AND state = 'pending'",
                (segment_id, worker_id),
            )
            return bool(cur.rowcount)

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read("SELECT state, count(*) FROM segments GROUP BY state")
        out = {"open": 0, "pending": 0, "done": 0}
        out.update({r[0]: int(r[1]) for r in rows})
        return {f"segments_{k}": v for k, v in out.items()}
