"""What one /recall did, for --explain and evaluation, and the stages' JSON calls to the LLM.

Every LLM stage (Project, Select, Sufficiency) asks through `llm_json`: a failure or an
unusable reply is noted in the trace and returns None, and the stage falls back to its
deterministic path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from speakermem.memory.ports import LLM, ChatMessage, LLMError


class RecallTrace(BaseModel):
    """What happened, for --explain and evaluation."""

    projection: dict[str, Any]
    breadth: str = "one"
    """How much of the channel the question spans (memory.query.breadth)."""
    time_window: str | None = None
    channels: list[str] = Field(default_factory=list)
    rankings: dict[str, int] = Field(default_factory=dict)
    pool: list[str] = Field(default_factory=list)
    select: str = "fused"
    anchors: list[str] = Field(default_factory=list)
    ask: str | None = None
    s1_evidence: list[str] = Field(default_factory=list)
    s2_rows: dict[str, list[str]] = Field(default_factory=dict)
    s2_people: dict[str, Any] = Field(default_factory=dict)
    """Who got a row: how they were chosen, how many were considered and left out."""
    cut: list[str] = Field(default_factory=list)
    """What Compose left out or shortened to keep the pack within its budgets."""
    budgets: dict[str, Any] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict)
    latency_ms: dict[str, float] = Field(default_factory=dict)
    llm_errors: list[str] = Field(default_factory=list)
    claims: dict[str, int] = Field(default_factory=dict)
    """The LLM answer's claims: checked, dropped, rewritten (re-cited), abstained (0/1)."""
    dropped_claims: list[str] = Field(default_factory=list)


async def llm_json(
    llm: LLM | None,
    trace: RecallTrace,
    stage: str,
    messages: list[dict[str, str]],
    schema: dict[str, Any],
    max_tokens: int = 512,
) -> dict[str, Any] | None:
    """The stage's JSON reply, or None (no LLM, a failure, or no JSON: noted in the trace)."""
    if llm is None:
        return None
    try:
        result = await llm.complete_json(
            [ChatMessage(**m) for m in messages],
            schema,
            schema_name=stage,
            max_tokens=max_tokens,
        )
    except LLMError as exc:
        trace.llm_errors.append(f"{stage}: {exc}")
        return None
    trace.tokens[f"{stage}_prompt"] = result.usage.prompt_tokens
    trace.tokens[f"{stage}_completion"] = result.usage.completion_tokens
    if result.data is None:
        trace.llm_errors.append(f"{stage}: {result.parse_error}")
    return result.data
