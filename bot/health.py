"""Whether the bot can serve: a pure decision over what the health probe measured.

The probe (integrations/ops) gathers facts with I/O; this module only decides, so the
rules are tested without a server: the bot cannot serve when the database does not
answer or no platform is connected (503); a failing LLM or a long Writer queue only
degrades it (200, /recall answers extractively and the Writer catches up later).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "degraded", "down"]


class LLMHealth(BaseModel):
    configured: bool
    failing_since: float | None = None
    """Unix time of the first failure in the current run of failures; None when healthy."""
    last_error: str | None = None


class HealthFacts(BaseModel):
    """What the probe measured (one sample)."""

    db_ok: bool
    db_error: str | None = None
    db_latency_ms: float | None = None
    platforms: dict[str, bool] = Field(default_factory=dict)
    """platform -> connected (Slack HTTP: listening; socket/gateway: session up)."""
    writer_pending: int = 0
    embed_pending: int = 0
    llm: LLMHealth = LLMHealth(configured=False)


class HealthReport(BaseModel):
    status: Status
    http_status: int
    reasons: list[str] = Field(default_factory=list)
    facts: HealthFacts


def decide(facts: HealthFacts, *, queue_warn: int = 1_000) -> HealthReport:
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
    if down:
        return HealthReport(status="down", http_status=503, reasons=down + degraded, facts=facts)
    status: Status = "degraded" if degraded else "ok"
    return HealthReport(status=status, http_status=200, reasons=degraded, facts=facts)
