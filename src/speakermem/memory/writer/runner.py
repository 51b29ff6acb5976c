"""The Writer's I/O loop: segment -> prompt -> LLM -> validate -> one-transaction commit.

Per channel, segments are written strictly in order (each sees the heads the previous
one committed); channels run in parallel up to the concurrency setting. An endpoint
outage defers the segment with jittered exponential backoff; the segment stays pending in
the database, so a crash or restart simply redoes it — and a segment already marked done
commits nothing twice.

An outage also pauses the whole Writer (a breaker): after an endpoint failure no channel
calls the LLM again until the pause ends, so fifty channels with pending segments make one
probe per backoff period, not fifty. The pause grows with consecutive failures and ends on
the first success.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speakermem.memory.config import WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.tombstones import Exclusions
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import NewRecord, RosterMember, Scope, Segment, StoredMessage
from speakermem.memory.ports import LLM, LLMContextOverflow, LLMError, LLMUnavailable
from speakermem.memory.store import ChainConflict, LeaseLost, RederiveItem, WriterRunLog
from speakermem.memory.writer.derive import Derivation, SegmentWriter, Validate
from speakermem.memory.writer.gate import EvidenceGate
from speakermem.memory.writer.pacing import Pacer
from speakermem.memory.writer.prompt import WRITER_PROMPT_VERSION, SegmentLinks, remembered
from speakermem.memory.writer.sizing import PromptPart
from speakermem.memory.writer.validate import (
    ValidationContext,
    ValidationReport,
    build_name_index,
    channel_key,
    validate_actions,
)

log = logging.getLogger(__name__)


def per_thousand(tokens: int, messages: int) -> float:
    """Tokens per 1,000 messages (0 when no message was written)."""
    return tokens * 1000.0 / messages if messages else 0.0


RUN_SEGMENTS_PER_SLOT = 4
"""Due segments a scheduled write run takes per concurrency slot (`Writer.run_limit`)."""


@dataclass
class FlushOutcome:
    segment_id: int
    scope: Scope
    status: str
    """committed | deferred | empty | paused (not attempted: the breaker opened meanwhile) |
    lost (a worker's lease ran out and another worker claimed the segment: nothing written)"""
    proposed: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    record_ids: list[int] = field(default_factory=list)
    error: str | None = None
    latency_ms: float = 0.0


def backoff_seconds(
    attempts: int, cfg: WriterConfig, rand: Callable[[], float] = random.random
) -> float:
    """Delay before the next attempt after `attempts` failed ones: exponential, jittered.

    The ceiling doubles from `retry_base_s` up to `retry_max_s`; the delay is drawn uniformly
    from the upper half of it ("equal jitter"), so retries of many segments that failed
    together spread out instead of arriving in step, and no draw is shorter than half the
    ceiling (full jitter can draw ~0 s, an immediate retry against an endpoint that is down).
    `rand` returns a float in [0, 1); tests pass their own source.
    """
    ceiling = min(cfg.retry_max_s, cfg.retry_base_s * (2 ** min(max(0, attempts), 62)))
    return float(ceiling / 2 + (ceiling / 2) * rand())


def gate_from(cfg: WriterConfig) -> EvidenceGate:
    return EvidenceGate(
        lexical_threshold=cfg.gate_lexical_threshold,
        dense_threshold=cfg.gate_dense_threshold,
        mode=cfg.gate_mode,
    )


def entry_ids(raw: Any) -> list[int]:
    """UPDATE targets named in a raw Writer output (to look up their channel and state)."""
    ids: list[int] = []
    actions = raw.get("actions") if isinstance(raw, dict) else None
    for item in actions if isinstance(actions, list) else []:
        if isinstance(item, dict):
            value = item.get("entry_id")
            if isinstance(value, int) and not isinstance(value, bool):
                ids.append(value)
            elif isinstance(value, str) and value.strip().isdigit():
                ids.append(int(value.strip()))
    return ids


class Writer:
    def __init__(
        self,
        engine: MemoryEngine,
        llm: LLM,
        config: WriterConfig | None = None,
    ) -> None:
        self.engine = engine
        self.llm = llm
        self.cfg = config or engine.config.writer
        self.gate = gate_from(self.cfg)
        self._channel_locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self.pacer = Pacer(
            self.cfg.concurrency, max(self.cfg.concurrency, self.cfg.max_concurrency)
        )
        """Slots for LLM calls: the limit starts at `concurrency` and adapts up to
        `max_concurrency` (memory/writer/pacing.py)."""
        self.segment_writer = SegmentWriter(llm, self.cfg, self.pacer)
        self.rand: Callable[[], float] = random.random
        """Jitter source for backoff delays (tests substitute a seeded one)."""
        self.failures = 0
        """Consecutive failed probe rounds of the endpoint (reset by the first success)."""
        self.paused_until = 0.0
        """Wall-clock time before which no LLM call is made (the breaker); 0 when closed."""
        self._stopping = False
        """Set by request_stop(): runs end after the segments already being written."""
        self._retries: dict[int, float] = {}
        """When each item this Writer deferred becomes due (segment id; rederive: -id)."""
        self.more_due = False
        """The last `flush_due` found as many due segments as its limit: more may wait."""

    def request_stop(self) -> None:
        """Finish only what is in flight: a shutdown must not wait for a whole backlog (at
        one LLM call per segment that can take minutes; the rest stays pending)."""
        self._stopping = True

    @property
    def run_limit(self) -> int:
        """Due segments one scheduled run takes: a few per slot. Behind a backlog (a slow
        endpoint, 1 s a call, under 200 messages/s) a run of the 1,000 oldest held them
        all in memory and ran for minutes, so a channel that became due meanwhile waited
        for its end; short runs back to back keep the oldest-first order and end within
        seconds."""
        return self.pacer.limit * RUN_SEGMENTS_PER_SLOT

    @property
    def paused(self) -> bool:
        return time.time() < self.paused_until

    def next_wake(self) -> float | None:
        """When another write run could make progress on what was deferred (None: nothing
        waits on a retry). Never before the breaker closes."""
        if not self._retries:
            return self.paused_until if self.paused else None
        return max(min(self._retries.values()), self.paused_until)

    def _endpoint_failed(self, delay: float, retry_after: float | None = None) -> float:
        """Open (or extend) the breaker after an endpoint failure.

        `delay` is the failed item's own backoff; the breaker's pause grows with consecutive
        probe rounds that failed (calls of one round, in flight together, count once), and
        lasts at least the server's Retry-After. Returns the item's delay, never shorter
        than the pause, so the item is due no earlier than the breaker closes.
        """
        now = time.time()
        if not self.paused:
            pause = backoff_seconds(self.failures, self.cfg, self.rand)
            self.paused_until = now + max(pause, retry_after or 0.0)
            self.failures += 1
        elif retry_after is not None:
            self.paused_until = max(self.paused_until, now + retry_after)
        return max(delay, self.paused_until - now)

    def _deferred(self, key: int, delay: float) -> None:
        """Remember when a deferred item is due (after its deferral is stored, so this is
        never earlier than the time the store holds)."""
        self._retries[key] = time.time() + delay

    def _endpoint_ok(self) -> None:
        self.failures = 0
        self.paused_until = 0.0

    def _lock(self, scope: Scope) -> asyncio.Lock:
        return self._channel_locks.setdefault(scope.key(), asyncio.Lock())

    async def _exclusions(self, scope: Scope) -> Exclusions:
        return await self.engine.store.channels.policy.exclusions(scope.platform, scope.workspace)

    async def validation_context(
        self, scope: Scope, messages: Sequence[StoredMessage], raw: Any, budget: int
    ) -> ValidationContext:
        store = self.engine.store
        pks = await self.engine.channel_pks([scope])
        roster, visible, _ = remembered(
            await self._exclusions(scope),
            await self.engine.members(scope, include_left=True),
            await store.records.heads(pks),
        )
        heads = {h.id: h for h in visible}
        known = {
            rid: f"{p}/{w}/{c}"
            for rid, (p, w, c) in (await store.records.channel_of(entry_ids(raw))).items()
        }
        known.update({rid: channel_key(scope) for rid in heads})
        return ValidationContext(
            roster_ids={m.user_id for m in roster},
            heads=heads,
            all_records_channel=known,
            ref_map={},
            scope=scope,
            budget=budget,
            gate=self.gate,
            names=build_name_index(roster),
        )

    async def _links(
        self, pks: list[int], roster: list[RosterMember], messages: list[StoredMessage]
    ) -> SegmentLinks:
        """Who each message speaks to and what it answers (the interaction graph)."""
        store = self.engine.store
        names = interaction_names(roster)
        for pk in pks:
            while await store.interactions.update(pk, names) > 0:
                pass
        ids = [m.pk for m in messages]
        parents = await store.interactions.parents(ids)
        return SegmentLinks(
            addressees=await store.interactions.addressees(ids),
            parents={pk: parent for pk, (parent, _) in parents.items()},
        )

    async def flush(self, segment: Segment, *, worker_id: str | None = None) -> FlushOutcome:
        """Write one segment (callers hold the channel lock).

        A worker passes its id: its commit or deferral applies only while it still holds the
        claim, else the outcome is "lost" and nothing is written (the worker that claimed
        the segment since writes it)."""
        try:
            return await self._flush(segment, worker_id)
        except LeaseLost as exc:
            log.warning("writer: segment %d of %s not written: %s", segment.id, segment.scope, exc)
            return FlushOutcome(segment.id, segment.scope, "lost", error=str(exc))

    async def _flush(self, segment: Segment, worker_id: str | None) -> FlushOutcome:
        store = self.engine.store
        scope = segment.scope
        started = time.time()
        t0 = time.perf_counter()
        people = await self._exclusions(scope)
        messages = remembered(people, [], [], await store.messages.in_segment(segment.id))[2]
        run = WriterRunLog(
            model=self.llm.model, prompt_version=WRITER_PROMPT_VERSION, started_at=started
        )
        if not messages:
            run.outcome = "empty"
            await store.records.commit_segment(
                segment.id, scope, [], None, run, worker_id=worker_id
            )
            return FlushOutcome(segment.id, scope, "empty")
        pks = await self.engine.channel_pks([scope])
        roster, heads, _ = remembered(
            people,
            await self.engine.members(scope, include_left=True),
            await store.records.heads(pks),
        )
        links = await self._links(pks, roster, messages)
        if self.paused:  # another channel's call failed while this prompt was being built
            return FlushOutcome(segment.id, scope, "paused")
        spent = Derivation()
        try:
            await self.segment_writer.derive(
                roster, heads, messages, links, self._validator(scope), spent
            )
            self._endpoint_ok()
        except LLMError as exc:
            run.prompt_tokens, run.completion_tokens = spent.prompt_tokens, spent.completion_tokens
            return await self._defer(segment, run, exc, t0, worker_id)
        report = spent.report
        run.prompt_tokens, run.completion_tokens = spent.prompt_tokens, spent.completion_tokens
        if spent.replans:  # reported, never silent: the run log says the prompt did not fit
            run.error = spent.overflow_note()
        records = [a.to_new_record(writer_model=self.llm.model) for a in report.accepted]
        vectors = await self._embed(records)
        self._fill_run(run, report)
        run.latency_ms = (time.perf_counter() - t0) * 1000
        ids = await store.records.commit_segment(
            segment.id, scope, records, vectors, run, worker_id=worker_id
        )
        log.info(
            "writer: segment %d of %s: %d proposed, %d accepted, rejected %s, %d+%d tokens "
            "(%.0f per 1,000 messages; %d thinking), %d call(s), %.0f ms",
            segment.id,
            scope,
            report.proposed,
            len(ids),
            run.rejected,
            run.prompt_tokens,
            run.completion_tokens,
            per_thousand(run.prompt_tokens + run.completion_tokens, len(messages)),
            spent.thinking_tokens,
            spent.calls,
            run.latency_ms,
        )
        return FlushOutcome(
            segment.id,
            scope,
            "committed",
            proposed=report.proposed,
            accepted=len(ids),
            rejected=dict(run.rejected),
            record_ids=ids,
            latency_ms=run.latency_ms,
        )

    def _validator(self, scope: Scope) -> Validate:
        """Validation of one prompt part's output against that part's refs."""

        async def validate(part: PromptPart, raw: Any, parse_error: str | None) -> ValidationReport:
            ctx = await self.validation_context(scope, part.messages, raw, part.budget)
            by_id = {m.message_id: m for m in part.messages}
            ctx.ref_map = {ref: by_id[mid] for ref, mid in part.refs.items() if mid in by_id}
            ctx.shown = part.shown
            return validate_actions(raw, ctx, parse_error=parse_error)

        return validate

    async def _defer(
        self,
        segment: Segment,
        run: WriterRunLog,
        exc: LLMError,
        t0: float,
        worker_id: str | None,
    ) -> FlushOutcome:
        """Defer a segment whose LLM call failed. An endpoint failure also pauses the whole
        Writer (the breaker), at least as long as the server's Retry-After; a prompt that
        did not fit the context is this segment's trouble only."""
        store, scope = self.engine.store, segment.scope
        delay = backoff_seconds(segment.attempts, self.cfg, self.rand)
        if not isinstance(exc, LLMContextOverflow):
            delay = self._endpoint_failed(delay, getattr(exc, "retry_after", None))
        if not await store.segments.defer(segment.id, str(exc), delay, worker_id=worker_id):
            raise LeaseLost(f"segment {segment.id}: deferral skipped ({exc})") from exc
        self._deferred(segment.id, delay)
        run.outcome, run.error = "deferred", str(exc)[:300]
        run.latency_ms = (time.perf_counter() - t0) * 1000
        await store.records.log_failed_run(segment.id, scope, run)
        log.warning("writer: segment %d of %s deferred %.0fs (%s)", segment.id, scope, delay, exc)
        return FlushOutcome(
            segment.id, scope, "deferred", error=str(exc), latency_ms=run.latency_ms
        )

    @staticmethod
    def _fill_run(run: WriterRunLog, report: ValidationReport) -> None:
        run.proposed = report.proposed
        run.accepted = len(report.accepted)
        run.noops = report.noops
        run.rejected = report.reason_counts()

    async def _embed(self, records: Sequence[NewRecord]) -> np.ndarray | None:
        if not records or self.engine.embedder is None:
            return None
        return await self.engine.embedder.embed([r.content for r in records])

    async def rederive_due(self, *, limit: int = 20) -> list[FlushOutcome]:
        """Derive again what a forgetting withdrew while other cited messages remained.

        Each queue entry holds only coordinates (channel, owner, source, the message ids still
        supporting it); the Writer sees those messages with the channel's current heads and
        proposes records as for a segment. The entry leaves the queue with the commit.
        Outcomes carry the negated queue id as `segment_id`.
        """
        store = self.engine.store
        outcomes: list[FlushOutcome] = []
        # not held back by the breaker: each entry backs off on its own, and the queue is short
        for item in await store.governance.due_rederive(limit):
            if self._stopping:
                break
            async with self.pacer.slot(), self._lock(item.scope):
                outcomes.append(await self._rederive(item))
        return outcomes

    async def _rederive(self, item: RederiveItem) -> FlushOutcome:
        store = self.engine.store
        scope = item.scope
        t0 = time.perf_counter()
        found = await store.messages.by_ids(scope, item.from_ids)
        people = await self._exclusions(scope)
        messages = remembered(
            people,
            [],
            [],
            sorted((m for m in found.values() if not m.deleted), key=lambda m: (m.ts, m.pk)),
        )[2]
        if not messages:  # its support was forgotten too: nothing to derive
            await store.governance.drop_rederive(item.id)
            return FlushOutcome(-item.id, scope, "empty")
        pks = await self.engine.channel_pks([scope])
        roster, heads, _ = remembered(
            people,
            await self.engine.members(scope, include_left=True),
            await store.records.heads(pks),
        )
        try:
            done = await self.segment_writer.derive(
                roster, heads, messages, None, self._validator(scope)
            )
            self._endpoint_ok()
        except LLMError as exc:
            delay = backoff_seconds(item.attempts, self.cfg, self.rand)
            if not isinstance(exc, LLMContextOverflow):
                delay = self._endpoint_failed(delay, getattr(exc, "retry_after", None))
            await store.governance.defer_rederive(item.id, str(exc), delay)
            self._deferred(-item.id, delay)
            return FlushOutcome(-item.id, scope, "deferred", error=str(exc))
        report = done.report
        records = [a.to_new_record(writer_model=self.llm.model) for a in report.accepted]
        vectors = await self._embed(records)
        dropped: dict[str, int] = {}
        try:
            ids = await store.records.add_records(
                scope, records, vectors, rederive_item=item.id, dropped=dropped
            )
        except ChainConflict as exc:  # a head moved meanwhile: try again later
            await store.governance.defer_rederive(item.id, str(exc), self.cfg.retry_base_s)
            return FlushOutcome(-item.id, scope, "deferred", error=str(exc))
        rejected = report.reason_counts()
        for reason, n in dropped.items():
            rejected[reason] = rejected.get(reason, 0) + n
        return FlushOutcome(
            -item.id,
            scope,
            "committed",
            proposed=report.proposed,
            accepted=len(ids),
            rejected=rejected,
            record_ids=ids,
            latency_ms=(time.perf_counter() - t0) * 1000,
        )

    async def write_claimed(
        self,
        worker_id: str,
        *,
        lease_s: float,
        limit: int | None = None,
        on_progress: Callable[[FlushOutcome], None] | None = None,
    ) -> list[FlushOutcome]:
        """One round of a Writer worker process: claim segments, write them, commit.

        `claim` leases up to `limit` (default: the pacer's limit) segments to `worker_id`, each
        the oldest pending segment of its channel, so they are written in parallel and a
        channel's order holds across any number of workers. While a segment is written its
        lease is renewed every third of `lease_s` (an LLM call may outlast the lease); a
        worker that dies stops renewing, and the segment is claimed again once the lease
        runs out. A failure defers the segment as in `flush_due` (which ends the lease); a
        cancelled round (the worker stopping) releases its segments for other workers.
        While the breaker is open nothing is claimed. Returns the outcomes of this round
        (empty: nothing was claimable).
        """
        if self.paused or self._stopping:
            return []
        now = time.time()  # forget retries that are due: the store's backoff governs claims
        self._retries = {k: t for k, t in self._retries.items() if t > now}
        store = self.engine.store
        limit = self.pacer.limit if limit is None else limit
        segments = await store.segments.claim(worker_id, lease_s, limit=limit)
        if segments and len(segments) >= limit:
            self.pacer.controller.saturated()  # as many as it had slots: more may wait
        outcomes: list[FlushOutcome] = []

        async def one(seg: Segment) -> None:
            try:
                async with self.pacer.slot(), self._lock(seg.scope):
                    outcome = await self._flush_leased(seg, worker_id, lease_s)
            except asyncio.CancelledError:
                # shielded: the release must reach the database although this task is cancelled
                await asyncio.shield(store.segments.release(seg.id, worker_id))
                raise
            outcomes.append(outcome)
            if on_progress:
                on_progress(outcome)

        await asyncio.gather(*(one(seg) for seg in segments))
        return outcomes

    async def _flush_leased(self, seg: Segment, worker_id: str, lease_s: float) -> FlushOutcome:
        store = self.engine.store
        renewer = asyncio.create_task(self._renew_lease(seg.id, worker_id, lease_s))
        try:
            if self.paused or self._stopping:
                outcome = FlushOutcome(seg.id, seg.scope, "paused")
            else:
                outcome = await self.flush(seg, worker_id=worker_id)
        except Exception as exc:  # not the endpoint (flush defers those): the store, a bug
            delay = backoff_seconds(seg.attempts, self.cfg, self.rand)
            error = f"{type(exc).__name__}: {exc}"
            if not await store.segments.defer(seg.id, error, delay, worker_id=worker_id):
                log.exception("writer worker %s: segment %d failed; lease lost", worker_id, seg.id)
                return FlushOutcome(seg.id, seg.scope, "lost", error=str(exc))
            log.exception("writer worker %s: segment %d failed; deferred", worker_id, seg.id)
            self._deferred(seg.id, delay)
            return FlushOutcome(seg.id, seg.scope, "deferred", error=str(exc))
        finally:
            renewer.cancel()
        if outcome.status == "paused":  # not attempted: another worker may take it now
            await store.segments.release(seg.id, worker_id)
        return outcome

    async def _renew_lease(self, segment_id: int, worker_id: str, lease_s: float) -> None:
        """Extend the lease every third of it until cancelled; stop once it is lost (another
        worker reclaimed the segment: its commit or ours finds the segment done)."""
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                if not await self.engine.store.segments.renew(segment_id, worker_id, lease_s):
                    log.warning(
                        "writer worker %s: lost the lease on segment %d", worker_id, segment_id
                    )
                    return
            except Exception:  # the commit may still succeed; the next renewal tries again
                log.warning(
                    "writer worker %s: lease renewal of segment %d failed", worker_id, segment_id
                )

    async def drain(self) -> None:
        """Wait for in-flight flushes to finish (each holds its channel's lock)."""
        for lock in list(self._channel_locks.values()):
            async with lock:
                pass

    async def flush_due(
        self,
        *,
        scope: Scope | None = None,
        limit: int = 1000,
        on_progress: Callable[[FlushOutcome], None] | None = None,
    ) -> list[FlushOutcome]:
        """Write the due segments (the `limit` oldest): channels in parallel, each channel's
        segments in order.

        While the breaker is open (the endpoint failed recently) nothing is attempted: the
        segments stay pending, their attempt counts untouched, until the pause ends.
        """
        self.more_due = False
        if self.paused or self._stopping:
            return []
        now = time.time()  # what was due by now is attempted in this run (or deferred again)
        self._retries = {k: t for k, t in self._retries.items() if t > now}
        due = await self.engine.store.segments.due(limit=limit, scope=scope)
        by_channel: dict[tuple[str, str, str], list[Segment]] = {}
        for seg in due:
            by_channel.setdefault(seg.scope.key(), []).append(seg)
        outcomes: list[FlushOutcome] = []

        async def channel_worker(segments: list[Segment]) -> None:
            async with self.pacer.slot(), self._lock(segments[0].scope):
                for seg in segments:
                    if self.paused or self._stopping:
                        break  # the endpoint just failed for another channel, or shutdown
                    try:
                        outcome = await self.flush(seg)
                    except LLMUnavailable as exc:  # pragma: no cover - flush defers these
                        outcome = FlushOutcome(seg.id, seg.scope, "deferred", error=str(exc))
                    outcomes.append(outcome)
                    if on_progress:
                        on_progress(outcome)
                    if outcome.status in ("deferred", "paused", "lost"):
                        break  # keep the channel's order: later segments wait too

        await asyncio.gather(*(channel_worker(segs) for segs in by_channel.values()))
        # only a run that went through says so: a failing one must not be retried at once
        self.more_due = len(due) >= limit
        return outcomes
