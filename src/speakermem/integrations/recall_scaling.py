"""`SPEAKERMEM_RECALL_PROCESSES=auto` (the default): recall processes when the bot is busy.

A quiet bot answers /recall in its own process: no extra memory (each recall process loads
its own embedder, ~150 MB with MiniLM) and nothing to start. A busy one makes every recall
wait for the interpreter its platform connections and ingestion also hold (README "Load":
p95 252-392 ms at 200 messages a second on two cores, 62-118 ms with two recall processes).
So auto mode watches how many messages the bot stores a second: on a machine with at least
two usable cores, once the rate reaches AUTO_START_RATE (measured over AUTO_WINDOW_S), it
starts recall processes (`RecallProcesses`, as many as the cores allow up to AUTO_MAX);
after AUTO_IDLE_S below AUTO_STOP_RATE it stops them again. While they start, and whenever
none is up, recalls run in the bot's own pipeline: nothing waits for them.

`auto_processes` is the decision, pure; `AutoRecallProcesses` is the `Recaller` that applies
it, sampling the dispatcher's stored-message counter every AUTO_TICK_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from speakermem.bot.settings import Settings
from speakermem.integrations.ops.metrics import MeteredLLM
from speakermem.integrations.recall_processes import RecallProcesses
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.pipeline import Recaller, RecallRequest, RecallResult

log = logging.getLogger(__name__)

AUTO_START_RATE = 20.0
"""Messages stored a second (over AUTO_WINDOW_S) from which recalls move to processes."""
AUTO_STOP_RATE = 2.0
AUTO_WINDOW_S = 5.0
AUTO_IDLE_S = 900.0
"""How long the rate must stay under AUTO_STOP_RATE before the processes stop."""
AUTO_MAX = 2
"""Recall processes in auto mode at most (two served 40 recalls a second in 62-118 ms p95
on two cores, README "Load")."""
AUTO_TICK_S = 1.0
AUTO_RETRY_S = 60.0
"""After recall processes failed to start, how long auto mode waits before trying again."""


@dataclass(frozen=True)
class Load:
    """What the decision reads: usable cores, the recent storing rate, what runs now."""

    cores: int
    rate: float
    """Messages stored a second over the last window."""
    running: int
    """Recall processes up (or starting) now."""
    quiet_s: float
    """Seconds the rate has stayed under AUTO_STOP_RATE."""


def auto_processes(load: Load) -> int:
    """How many recall processes auto mode wants now.

    One usable core: none (a second process only competes with the bot for it). Busy:
    as many as the cores allow, up to AUTO_MAX. Quiet for AUTO_IDLE_S: none. Between the
    two: whatever runs now (no flapping around one threshold)."""
    if load.cores < 2:
        return 0
    if load.rate >= AUTO_START_RATE:
        return min(AUTO_MAX, load.cores)
    if load.quiet_s >= AUTO_IDLE_S:
        return 0
    return load.running


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class AutoRecallProcesses:
    """The bot's `Recaller` in auto mode: its own pipeline, or recall processes while busy."""

    def __init__(
        self,
        settings: Settings,
        engine: MemoryEngine,
        *,
        fallback: Recaller,
        stored: Callable[[], int],
        answer_llm: MeteredLLM | None = None,
        cores: int | None = None,
        tick_s: float = AUTO_TICK_S,
        factory: type[RecallProcesses] = RecallProcesses,
    ) -> None:
        """`stored`: the dispatcher's count of messages stored so far; `factory`: what
        starts the recall processes (the runtime's `RecallProcesses`)."""
        self.settings = settings
        self.engine = engine
        self.fallback = fallback
        self.stored = stored
        self.answer_llm = answer_llm
        self.cores = usable_cores() if cores is None else cores
        self.tick_s = tick_s
        self.factory = factory
        self.processes: RecallProcesses | None = None
        self.started = 0
        """Times recall processes were started (tests, logs)."""
        self._samples: deque[tuple[float, int]] = deque()
        self._quiet_since: float | None = None
        self._changing: asyncio.Task[None] | None = None
        self._failed_at: float | None = None
        self._monitor: asyncio.Task[None] | None = None

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        processes = self.processes
        if processes is None:
            return await self.fallback.run(req, answer=answer)
        return await processes.run(req, answer=answer)

    def start(self) -> None:
        self._monitor = asyncio.create_task(self._watch(), name="speakermem-recall-auto")

    async def stop(self) -> None:
        for task in (self._monitor, self._changing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._resize(0)

    def load(self, now: float) -> Load:
        """The storing rate over the window, from the counter's samples."""
        self._samples.append((now, self.stored()))
        while len(self._samples) > 2 and now - self._samples[1][0] >= AUTO_WINDOW_S:
            self._samples.popleft()
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        rate = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        if rate >= AUTO_STOP_RATE:
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = now
        running = self.processes.processes if self.processes is not None else 0
        quiet = now - self._quiet_since if self._quiet_since is not None else 0.0
        return Load(cores=self.cores, rate=rate, running=running, quiet_s=quiet)

    async def tick(self, now: float | None = None) -> int:
        """One sample and decision; returns the number of processes wanted."""
        now = time.monotonic() if now is None else now
        want = auto_processes(self.load(now))
        running = self.processes.processes if self.processes is not None else 0
        busy = self._changing is not None and not self._changing.done()
        waiting = self._failed_at is not None and now - self._failed_at < AUTO_RETRY_S
        if want != running and not busy and not (waiting and want > running):
            self._changing = asyncio.create_task(self._resize(want, now))
        return want

    async def _watch(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.tick_s)

    async def _resize(self, n: int, now: float = 0.0) -> None:
        """Start `n` recall processes (new recalls use them once all are up), or stop
        them (new recalls go back to the bot's pipeline first; running ones finish)."""
        old = self.processes
        if old is not None and (n == 0 or n != old.processes):
            self.processes = None
            await old.stop()
            log.info("recall runs in the bot process again (quiet for %.0f s)", AUTO_IDLE_S)
        if n == 0 or self.processes is not None:
            return
        fresh = self.factory(
            self.settings,
            self.engine,
            processes=n,
            fallback=self.fallback,
            answer_llm=self.answer_llm,
        )
        try:
            await fresh.start()
        except RuntimeError as exc:
            log.error("recall processes could not start (%s); recall stays in the bot", exc)
            self._failed_at = now
            return
        self._failed_at = None
        self.processes = fresh
        self.started += 1
        log.info("busy: recall moved to %d processes", n)
