"""The Writer's segment queue (`engine.segments`): a channel's messages gather in an open
segment; it closes when full (the store does that on ingest), when idle (the scheduler's
close-idle job) or on request (an import, `speakermem write`), and waits, pending, for a
Writer attempt. Workers claim pending segments through memory.writer, not here.
"""

from __future__ import annotations

from speakermem.memory.models import Scope, Segment
from speakermem.memory.store import Store
from speakermem.memory.store.segments import Backlog

__all__ = ["Backlog", "SegmentQueue"]


class SegmentQueue:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def close_idle(self, idle_seconds: float) -> int:
        """Close the open segments idle this long (0: every open one); how many closed."""
        return await self._store.segments.close_idle(idle_seconds)

    async def close_channel(self, scope: Scope) -> int:
        """Close the channel's open segment now; how many closed (0 or 1)."""
        return await self._store.segments.close_channel(scope)

    async def due(
        self, *, limit: int, now: float | None = None, scope: Scope | None = None
    ) -> list[Segment]:
        """Pending segments ready for a Writer attempt, oldest first, each channel's order
        kept: nothing overtakes an earlier segment still backing off or being written."""
        return await self._store.segments.due(limit=limit, now=now, scope=scope)

    async def backlog(self) -> Backlog:
        """The pending segments in one aggregate (count, deferred, oldest, next retry), for
        health and metrics."""
        return await self._store.segments.backlog()
