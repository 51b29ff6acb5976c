"""Background tasks woken by new messages (embedding, the interaction graph), and the
foreground gate they give way to.

The work runs whenever it is woken (coalescing wake-ups that arrive while it runs), never
twice at once, and survives its own failures: the error is logged, and the work is retried
on the next wake-up after a short pause (what it had not done stays pending in the store).

A member waiting on /recall comes first: on a small machine a background embedding batch
and a /recall compete for the same cores, so background work checks the `Foreground` gate
before each unit and waits while a /recall is in flight — for at most `max_defer_s`, so a
channel with /recall always running still gets its vectors, only more slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0
FOREGROUND_MAX_DEFER_S = 2.0
"""Longest a background unit waits for /recall to finish: bounds starvation under a
continuous stream of /recall calls to one unit per two seconds."""


class Foreground:
    """How many member-facing requests are in flight; background work yields to them."""

    def __init__(self, max_defer_s: float = FOREGROUND_MAX_DEFER_S) -> None:
        self.max_defer_s = max_defer_s
        self._active = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.deferrals = 0
        """Background units that had to wait (a counter for tests and metrics)."""

    @property
    def active(self) -> int:
        return self._active

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Mark one foreground request in flight for the duration of the block."""
        self._active += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._quiet.set()

    async def yield_to(self) -> None:
        """Return when no foreground request is in flight, or after `max_defer_s`."""
        if self._active == 0:
            return
        self.deferrals += 1
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # lands as the event is set, and the worker's stop() would then wait forever
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_defer_s):
                await self._quiet.wait()


class WakeWorker:
    def __init__(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.work = work
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def wake(self) -> None:
        self._wakeup.set()

    def start(self) -> None:
        """Start (idempotent), with one pass over what is already pending."""
        if self._task is not None:
            return
        self._wakeup.set()
        self._task = asyncio.create_task(self._loop(), name=f"speakermem-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.work()
            except Exception:  # keep the worker alive; what failed stays pending
                log.exception("background %s failed; will retry on next message", self.name)
                await asyncio.sleep(RETRY_PAUSE_S)
