"""What an LLM client has done so far: calls, retries, tokens, errors (a snapshot)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LLMStats:
    """Cumulative counters since construction; a snapshot, safe to keep or compare."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    thinking_tokens: int = 0
    latency_ms_total: float = 0.0
    truncations: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    parse_errors: dict[str, int] = field(default_factory=dict)
