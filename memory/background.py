"""A background task woken by new messages: embedding and the interaction graph.

The work runs whenever it is woken (coalescing wake-ups that arrive while it runs), never
twice at once, and survives its own failures: the error is logged, and the work is retried
on the next wake-up after a short pause (what it had not done stays pending in the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0


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
