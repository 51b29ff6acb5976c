"""At most N uses per key in any 60 seconds: sign-in attempts per address (the console),
questions per member (mentions, direct messages, the context menu).

A sliding window over monotonic time, bounded in memory: the least recently seen keys go
first beyond `max_keys`. Pure bookkeeping, no I/O, so callers test it with explicit times.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

WINDOW_S = 60.0


class PerMinuteLimiter:
    """At most `per_minute` uses per key in any 60 s."""

    def __init__(self, per_minute: int, *, max_keys: int = 10_000) -> None:
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def would_allow(self, key: str, *, now: float | None = None) -> bool:
        """Whether `allow` would say yes now, without counting a use (a caller about to do
        costly work first, such as platform lookups, asks this before it)."""
        now = time.monotonic() if now is None else now
        hits = self._seen.get(key, ())
        return sum(1 for t in hits if now - t < WINDOW_S) < self.per_minute

    def allow(self, key: str, *, now: float | None = None) -> bool:
        """Count one use of `key` now, unless it already had `per_minute` in the window."""
        now = time.monotonic() if now is None else now
        hits = self._seen.setdefault(key, deque())
        self._seen.move_to_end(key)
        while hits and now - hits[0] >= WINDOW_S:
            hits.popleft()
        if len(hits) >= self.per_minute:
            return False
        hits.append(now)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return True
