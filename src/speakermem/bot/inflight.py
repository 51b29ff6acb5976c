"""Track work that runs in tasks we do not own, so shutdown can wait for it.

slack-bolt acks an event, then runs the listener in a future it drops; nothing outside
bolt can await it. A listener that enters `InFlight.track()` registers its own task, and
`drain()` awaits whatever is still registered (bounded) before the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)


class InFlight:
    """The set of tasks currently inside `track()`; `drain()` waits for them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[object]] = set()
        self.closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for tracked work; returns how many tasks were still running."""
        self.closing = True
        current = asyncio.current_task()
        pending = {t for t in self._tasks if t is not current and not t.done()}
        if not pending:
            return 0
        log.info("%s: waiting for %d in-flight handler(s)", self.name, len(pending))
        _done, left = await asyncio.wait(pending, timeout=timeout_s)
        if left:
            log.warning(
                "%s: %d handler(s) still running after %.1f s; cancelled",
                self.name,
                len(left),
                timeout_s,
            )
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        return len(left)
