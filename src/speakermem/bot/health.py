"""Whether the bot can serve: a pure decision over what the health probe measured.

The probe (integrations/ops) gathers facts with I/O (the Writer queue through
`measure_writer_queue`, engine calls only); `decide` only decides, so the rules are tested
without a server: the bot cannot serve when the database does not
answer or no platform is connected (503); a failing LLM or a long Writer queue only
degrades it (200, /recall answers extractively and the Writer catches up later).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from speakermem.memory.segment_queue import SegmentQueue

Status = Literal["ok", "degraded", "down"]
QUEUE_WARN = 1_000
"""Pending Writer segments past which the bot reports itself degraded (still serving)."""


class LLMHealth(BaseModel):
    configured: bool
    failing_since: float | None = None
    """Unix time of the first failure in the current run of failures; None when healthy."""
    last_error: str | None = None


class WriterQueue(BaseModel):
    """The Writer's backlog: what waits, what is backing off, and for how long."""

    pending: int = 0
    """Closed segments not yet written."""
    deferred: int = 0
    """Pending segments that failed at least once (backing off, or due for a retry)."""
    oldest_pending_age_s: float | None = None
    """Age of the first message of the oldest pending segment; None when nothing waits."""
    next_attempt_in_s: float | None = None
    """Seconds until the earliest deferred segment is due again (0 when one is due now)."""


async def measure_writer_queue(segments: SegmentQueue, *, now: float | None = None) -> WriterQueue:
    """Read the queue (`engine.segments`: one aggregate over the pending segments)."""
    now = time.time() if now is None else now
    b = await segments.backlog()
    if not b.pending:
        return WriterQueue()
    oldest, retry = b.oldest_opened_at, b.earliest_retry_at
    return WriterQueue(
        pending=b.pending,
        deferred=b.deferred,
        oldest_pending_age_s=None if oldest is None else round(max(0.0, now - oldest), 1),
        next_attempt_in_s=None if retry is None else round(max(0.0, retry - now), 1),
    )


class HealthFacts(BaseModel):
    """What the probe measured (one sample)."""

    db_ok: bool
    db_error: str | None = None
    db_latency_ms: float | None = None
    platforms: dict[str, bool] = Field(default_factory=dict)
    """platform -> connected (Slack HTTP: listening; socket/gateway: session up)."""
    writer_pending: int = 0
    writer_queue: WriterQueue = WriterQueue()
    """The backlog in detail (pending, deferred, oldest age); `writer_pending` is its total."""
    embed_pending: int = 0
    embed_drafts: int = 0
    """Messages whose vector is a draft (memory/background_embedding.py)."""
    spilled: int = 0
    """Events kept in the disk-full spill, waiting to be stored (bot/spill.py)."""
    llm: LLMHealth = LLMHealth(configured=False)


class HealthReport(BaseModel):
    status: Status
    http_status: int
    reasons: list[str] = Field(default_factory=list)
    facts: HealthFacts


def decide(facts: HealthFacts, *, queue_warn: int = QUEUE_WARN) -> HealthReport:
    """ok / degraded (still serving: 200) / down (cannot serve: 503), with the reasons."""
    down: list[str] = []
    degraded: list[str] = []
    if not facts.db_ok:
        down.append(f"database: {facts.db_error or 'not answering'}")
    if not facts.platforms:
        down.append("no platform adapter running")
    else:
        offline = sorted(p for p, up in facts.platforms.items() if not up)
        if len(offline) == len(facts.platforms):
            down.append("no platform connected: " + ", ".join(offline))
        elif offline:
            degraded.append("disconnected: " + ", ".join(offline))
    if facts.llm.configured and facts.llm.failing_since is not None:
        degraded.append(f"LLM failing ({facts.llm.last_error or 'error'}): answers are extractive")
    if facts.writer_pending > queue_warn:
        degraded.append(f"Writer queue at {facts.writer_pending} segments")
    q = facts.writer_queue
    if q.deferred:
        waited = (
            ""
            if q.oldest_pending_age_s is None
            else f", oldest waiting {q.oldest_pending_age_s:.0f}s"
        )
        degraded.append(
            f"Writer backing off: {q.deferred} of {q.pending} segments deferred{waited}"
        )
    if facts.spilled:
        degraded.append(
            f"{facts.spilled} events wait in the spill: the database or disk was full"
            " (they are stored when space returns)"
        )
    if down:
        return HealthReport(status="down", http_status=503, reasons=down + degraded, facts=facts)
    status: Status = "degraded" if degraded else "ok"
    return HealthReport(status=status, http_status=200, reasons=degraded, facts=facts)
