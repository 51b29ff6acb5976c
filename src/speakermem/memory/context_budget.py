"""How much of a model's context one prompt may use (pure, but for `endpoint_limits`).

A prompt longer than the server's context is not always refused: Ollama's OpenAI route cuts
it to fit, silently, and the model answers a prompt without its instructions. So every
prompt the Writer and the answerer build is sized to the context the endpoint has (found
by the LLM adapter, or set with SPEAKERMEM_LLM_CONTEXT_TOKENS), with room left for the
answer and for the thinking of a reasoning model.

Token counts here are estimates (4 characters a token, `approx_tokens`): no tokenizer
matches every model, and a margin absorbs the difference and the chat template's own tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_OUTPUT_TOKENS = 256
"""The least room kept for the answer, however small the context."""
OUTPUT_SHARE = 4
"""On a small context the answer gets at most 1/OUTPUT_SHARE of it."""
ESTIMATE_MARGIN = 0.10
"""Share of the input budget held back for estimate error and chat-template tokens."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat template adds around each message (role markers), roughly."""


def approx_tokens(text: str) -> int:
    """Rough token count (≈ chars / 4): good enough for budgeting prompt sections."""
    return (len(text) + 3) // 4


def chat_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Estimated prompt tokens of chat messages ({"role", "content"} mappings)."""
    return sum(
        approx_tokens(str(m.get("content") or "")) + MESSAGE_OVERHEAD_TOKENS for m in messages
    )


@dataclass(frozen=True)
class EndpointLimits:
    """What the endpoint allows, as far as anyone knows (None: unknown)."""

    context_tokens: int | None = None
    """Prompt and answer together, in tokens."""
    parallel: int | None = None
    """Requests the server serves at once, when it says so."""
    thinking_tokens: int = 0
    """Completion tokens a reasoning model spends before it answers (its budget)."""


@dataclass(frozen=True)
class PromptBudget:
    output_tokens: int
    """max_tokens to ask for (the answer and any thinking)."""
    input_tokens: int | None
    """Estimated prompt tokens that fit; None when the context is unknown (no limit)."""

    def fits(self, tokens: int) -> bool:
        return self.input_tokens is None or tokens <= self.input_tokens


def prompt_budget(limits: EndpointLimits, max_tokens: int) -> PromptBudget:
    """Split the context between the prompt and the answer.

    The answer asks for `max_tokens` plus the thinking budget; on a context too small for
    that, a quarter of the context (never under MIN_OUTPUT_TOKENS). The prompt gets the
    rest, less ESTIMATE_MARGIN.
    """
    wanted = max_tokens + max(0, limits.thinking_tokens)
    ctx = limits.context_tokens
    if ctx is None:
        return PromptBudget(output_tokens=wanted, input_tokens=None)
    output = min(wanted, max(MIN_OUTPUT_TOKENS, ctx // OUTPUT_SHARE))
    room = max(0, ctx - output)
    return PromptBudget(output_tokens=output, input_tokens=int(room * (1 - ESTIMATE_MARGIN)))


def scaled_budgets(budgets: Sequence[int], available: int | None) -> list[int]:
    """Shrink section budgets in proportion so their sum fits `available` (None: as given)."""
    total = sum(budgets)
    if available is None or total <= available or total <= 0:
        return list(budgets)
    factor = max(0, available) / total
    return [int(b * factor) for b in budgets]


async def endpoint_limits(llm: object) -> EndpointLimits:
    """The LLM's limits when it can tell (`limits()`; the OpenAI adapter identifies the
    server on first use), else none known. Never raises: an unknown limit sizes nothing."""
    fn = getattr(llm, "limits", None)
    if fn is None:
        return EndpointLimits()
    try:
        found = await fn()
    except Exception:  # sizing must not fail a write: without limits, prompts go as built
        return EndpointLimits()
    return found if isinstance(found, EndpointLimits) else EndpointLimits()
