"""Event-loop responsiveness: how late a 10 ms sleep wakes up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TICK_S = 0.010


class Ticker:
    """Records how late a 10 ms sleep wakes up: the event loop's responsiveness."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        """`clock` stamps the samples (time.monotonic is comparable across processes)."""
        self.clock = clock
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last = self.clock()
        while True:
            await asyncio.sleep(TICK_S)
            now = self.clock()
            self.samples.append((now, max(0.0, (now - last - TICK_S) * 1000)))
            last = now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def between(self, start: float, end: float) -> list[float]:
        return [lag for t, lag in self.samples if start <= t <= end]
