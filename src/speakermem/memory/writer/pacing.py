"""How many Writer calls run at once: adapted to what the endpoint sustains.

A fixed two calls at a time caps the Writer near two segments a second at a 1 s model,
whatever the server: under 200 messages/s (eight segments a second) the queue grows
without end, while a batching server (vLLM serves dozens of requests at once) idles. A
server that serves a few at a time (Ollama by default, llama.cpp's --parallel slots)
answers more calls only by queueing them, and its latency climbs.

So the limit moves like TCP's congestion window (slow start, then additive increase and
multiplicative decrease), with latency as the signal:
- after each round (as many calls as the limit) that used the whole limit, with latency
  within `tolerance` of the best recently seen: raise it, doubling it until it first had
  to come down (a backlog should not wait a minute for the Writer to find its pace), then
  by a quarter (at least one), up to the ceiling;
- latency above that: lower it by a quarter; the endpoint is queueing;
- a 429 or 503 (the server says it is overloaded): halve it at once.
`ConcurrencyController` decides (pure, tested on its own); `Pacer` holds the slots.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from statistics import median

BEST_WINDOW = 64
"""Latencies kept to find the best one (the endpoint unloaded, as far as we can tell)."""
TOLERANCE = 0.5
"""A round's median latency more than this share above the best one counts as rising..."""
SLACK_S = 0.05
"""...and more than this many seconds above it (milliseconds of jitter are not queueing)."""


class ConcurrencyController:
    """The limit and the rule that moves it; no clock, no I/O."""

    def __init__(self, start: int, ceiling: int, *, floor: int = 1) -> None:
        if ceiling <= start:  # no room to adapt: the operator asked for a fixed number
            floor = start
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self.limit = min(max(start, self.floor), self.ceiling)
        self._recent: deque[float] = deque(maxlen=BEST_WINDOW)
        self._round: list[float] = []
        self._saturated = False
        self._slow_start = True
        """Doubling until the first decrease, then growing by a quarter."""
        self.raised = self.lowered = 0

    @property
    def best(self) -> float | None:
        return min(self._recent) if self._recent else None

    def saturated(self) -> None:
        """Work waited for a slot in this round: a higher limit would have been used."""
        self._saturated = True

    def observe(self, latency_s: float, *, overloaded: bool = False) -> None:
        """One finished call: how long it took, and whether the server said it was full."""
        if overloaded:
            self._set(max(self.floor, self.limit // 2))
            return
        best = self.best
        self._recent.append(latency_s)
        self._round.append(latency_s)
        if len(self._round) < self.limit:
            return
        typical = median(self._round)
        if best is not None and typical > best * (1 + TOLERANCE) + SLACK_S:
            self._set(max(self.floor, self.limit - max(1, self.limit // 4)))
        elif self._saturated:
            step = self.limit if self._slow_start else max(1, self.limit // 4)
            self._set(min(self.ceiling, self.limit + step))
        else:
            self._round, self._saturated = [], False

    def _set(self, limit: int) -> None:
        if limit > self.limit:
            self.raised += 1
        elif limit < self.limit:
            self.lowered += 1
            self._slow_start = False
        self.limit = limit
        self._round, self._saturated = [], False


class Pacer:
    """Slots for Writer calls, as many as the controller's limit (which moves)."""

    def __init__(self, start: int, ceiling: int) -> None:
        self.controller = ConcurrencyController(start, ceiling)
        self.in_flight = 0
        self._changed = asyncio.Condition()

    @property
    def limit(self) -> int:
        return self.controller.limit

    def cap(self, ceiling: int) -> None:
        """Lower the ceiling (a server that says how many requests it serves at once)."""
        c = self.controller
        c.ceiling = max(c.floor, min(c.ceiling, ceiling))
        c.limit = min(c.limit, c.ceiling)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._changed:
            if self.in_flight >= self.limit:
                self.controller.saturated()
            await self._changed.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1
        try:
            yield
        finally:
            async with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    async def observe(self, latency_s: float, *, overloaded: bool = False) -> None:
        async with self._changed:
            self.controller.observe(latency_s, overloaded=overloaded)
            self._changed.notify_all()
