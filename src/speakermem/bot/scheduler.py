"""The only module that touches APScheduler: periodic Writer flushes and idle closing.

Jobs (AsyncIOScheduler, coroutine jobs, one instance each, coalesced):
- `close-idle`: close segments of channels quiet for the session gap;
- `write`: flush every due segment through the Writer (deferred ones back off); after a
  run that deferred something, the next run is brought forward to when it becomes due (the
  Writer's breaker end or the earliest retry), never sooner: an outage costs one probe per
  backoff period, and no run spins on segments that are not due;
- `embed`: a safety net that embeds any message the live path left without a vector;
- `retention`: on start and daily, finish any forget a failure left incomplete, then forget
  what is past each channel's retention limit; a run that fails is retried with backoff
  (`retention_retry_s`, doubling up to the daily interval), not a day later.
With several bot processes on one PostgreSQL store, `close-idle`, `write`, `embed` and
`retention` run in one process at a time: each run takes the store's job lock
(`engine.job_lock`, an advisory lock held for the run) and a process that does not get
it skips that run. With `writer_mode="workers"` there is no `write` job: `speakermem worker`
processes claim and write the segments, and this process only closes them.
`kick()` runs the write job now (a segment just filled its window). Pending segments
live in the database, so a restart resumes them on the first `write` run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Literal

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.writer.runner import Writer

log = logging.getLogger(__name__)

MIN_WAKE_GAP_S = 0.05
"""A brought-forward write run starts at least this long after the previous one ended."""


class WriterScheduler:
    def __init__(
        self,
        engine: MemoryEngine,
        writer: Writer | None,
        *,
        idle_seconds: float,
        write_interval_s: float = 15.0,
        idle_check_s: float | None = None,
        governance: Governance | None = None,
        retention_interval_s: float = 86_400.0,
        retention_retry_s: float = 60.0,
        writer_mode: Literal["inprocess", "workers"] = "inprocess",
    ) -> None:
        self.engine = engine
        self.writer = writer
        self.idle_seconds = idle_seconds
        self.write_interval_s = write_interval_s
        self.idle_check_s = idle_check_s or max(1.0, min(60.0, idle_seconds / 4))
        self._scheduler = AsyncIOScheduler()
        self.governance = governance
        self.retention_interval_s = retention_interval_s
        self.retention_retry_s = retention_retry_s
        self.retention_failures = 0
        """Consecutive failed retention runs (the retry's backoff grows with them)."""
        self._retention_retry: asyncio.TimerHandle | None = None
        self.writer_mode = writer_mode
        self.runs = {"close-idle": 0, "write": 0, "embed": 0, "retention": 0}
        self.skipped = {"close-idle": 0, "write": 0, "embed": 0, "retention": 0}
        """Runs left to another process that held the job's cluster-wide lock."""
        self._inflight: set[asyncio.Task[object]] = set()
        self._wake: asyncio.TimerHandle | None = None
        self._writing = False
        self._again = False

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Remember a running job's task so shutdown() can let it finish."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._inflight.discard(task)

    @property
    def writes_here(self) -> bool:
        """Whether this process writes segments (not when Writer workers do)."""
        return self.writer is not None and self.writer_mode == "inprocess"

    @contextlib.asynccontextmanager
    async def _cluster_once(self, name: str) -> AsyncIterator[bool]:
        """The job's cluster-wide lock: True when this process runs this run of `name`."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                mine = await stack.enter_async_context(self.engine.job_lock(name))
            except Exception:  # the lock's connection failed: the next run tries again
                log.exception("job %s: cannot take its cluster-wide lock; run skipped", name)
                mine = False
            if not mine:
                self.skipped[name] += 1
            yield mine

    def start(self) -> None:
        opts = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        self._scheduler.add_job(
            self._close_idle, "interval", seconds=self.idle_check_s, id="close-idle", **opts
        )
        if self.writes_here:
            # two instances allowed so a tick during a long run is not logged as skipped: the
            # second returns at once and the first runs again when it ends (see _write)
            self._scheduler.add_job(
                self._write,
                "interval",
                seconds=self.write_interval_s,
                id="write",
                next_run_time=datetime.now() + timedelta(milliseconds=50),  # resume backlog
                **{**opts, "max_instances": 2},
            )
        if self.engine.embedder is not None:
            self._scheduler.add_job(self._embed, "interval", seconds=60, id="embed", **opts)
        if self.governance is not None:
            # retention: once right after start, then daily (same cascade as every forget)
            self._scheduler.add_job(
                self._retention,
                "interval",
                seconds=self.retention_interval_s,
                id="retention",
                next_run_time=datetime.now() + timedelta(seconds=1),
                **opts,
            )
        self._scheduler.start()
        log.info(
            "scheduler started (writer %s)",
            "off: no LLM"
            if self.writer is None
            else ("on" if self.writes_here else "off: Writer workers write the segments"),
        )

    def kick(self) -> None:
        """Run the write job as soon as possible (a segment reached its window)."""
        if not self.writes_here or not self._scheduler.running:
            return
        if self._writing:  # a second instance would be skipped: run again when this one ends
            self._again = True
            return
        job = self._scheduler.get_job("write")
        if job is not None:
            job.modify(next_run_time=datetime.now())
            self._scheduler.wakeup()

    async def _close_idle(self) -> None:
        self.runs["close-idle"] += 1
        with self._tracked():
            async with self._cluster_once("close-idle") as mine:
                if not mine:
                    return
                closed = await self.engine.segments.close_idle(self.idle_seconds)
        if closed:
            log.debug("closed %d idle segment(s)", closed)
            self.kick()

    async def _write(self) -> None:
        assert self.writer is not None
        if self._writing:  # a run is in progress: it runs again when it ends
            self._again = True
            return
        self.runs["write"] += 1
        self._writing, self._again = True, False
        with self._tracked():
            try:
                # several bot processes writing in-process on one store: one writes at a
                # time (two would call the LLM for the same segments; workers claim instead)
                async with self._cluster_once("write") as mine:
                    if mine:
                        await self._write_run()
            finally:
                self._writing = False
            more = self._again or self.writer.more_due  # a full run: the next starts at once
            self._wake_at(time.time() if more else self.writer.next_wake())

    async def _write_run(self) -> None:
        assert self.writer is not None
        try:
            await self.writer.flush_due(limit=self.writer.run_limit)
        except Exception:  # a failed run must not kill the job; segments stay pending
            log.exception("writer run failed; pending segments will be retried")
        try:
            await self.writer.rederive_due()
        except Exception:
            log.exception("re-derivation run failed; the queue is kept")

    def _wake_at(self, when: float | None) -> None:
        """Run the write job again at `when` (Unix time), unless a run comes sooner anyway.

        A timer, not a changed run time: a job brought forward while it is still running
        would be skipped as a second instance and wait a whole interval."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if when is None or not self._scheduler.running:
            return
        delay = max(when - time.time(), MIN_WAKE_GAP_S)
        if delay < self.write_interval_s:
            self._wake = asyncio.get_running_loop().call_later(delay, self.kick)

    async def _retention(self) -> None:
        self.runs["retention"] += 1
        assert self.governance is not None
        with self._tracked():
            async with self._cluster_once("retention") as mine:
                if not mine:
                    return
                try:
                    await self.governance.resume_forgets()
                    receipt = await self.governance.apply_retention(actor="scheduler")
                except Exception:
                    self.retention_failures += 1
                    delay = self._retry_retention()
                    log.exception("retention run failed; retried in %.0f s", delay)
                    return
            self.retention_failures = 0
            if receipt.counts:
                log.info("retention: %s", receipt.summary())

    def _retry_retention(self) -> float:
        """Run retention again after a backoff: 1, 2, 4... times `retention_retry_s`,
        never later than the daily run."""
        delay = min(
            self.retention_interval_s,
            self.retention_retry_s * 2 ** min(self.retention_failures - 1, 30),
        )
        if self._retention_retry is not None:
            self._retention_retry.cancel()
        if self._scheduler.running:
            self._retention_retry = asyncio.get_running_loop().call_later(
                delay, self._kick_retention
            )
        return delay

    def _kick_retention(self) -> None:
        self._retention_retry = None
        job = self._scheduler.get_job("retention")
        if job is not None and self._scheduler.running:
            job.modify(next_run_time=datetime.now())
            self._scheduler.wakeup()

    async def _embed(self) -> None:
        self.runs["embed"] += 1
        with self._tracked():
            async with self._cluster_once("embed") as mine:
                if not mine:
                    return
                try:
                    await self.engine.embed_backlog()
                except Exception:
                    log.exception("embedding run failed; messages stay pending")

    async def shutdown(self) -> None:
        """Stop scheduling; a job already running finishes first (drain), the Writer's after
        the segments in flight (not the whole backlog: the rest stays pending).

        APScheduler's asyncio executor cancels running jobs on shutdown, so pause the
        scheduler and wait for them before shutting it down.
        """
        if self._wake is not None:
            self._wake.cancel()
        if self._retention_retry is not None:
            self._retention_retry.cancel()
        if self.writer is not None:
            self.writer.request_stop()  # a run ends after the segments in flight
        if self._scheduler.running:
            self._scheduler.pause()
            await asyncio.gather(*self._inflight, return_exceptions=True)
            self._scheduler.shutdown(wait=False)
        if self.writer is not None:
            await self.writer.drain()
