"""Ports: what the memory core needs from the outside world, as protocols.

Implementations live in `integrations/` (ONNX MiniLM, OpenAI-compatible endpoints);
tests and the composition root plug them in. The core never imports a vendor SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    name: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch off the event loop; returns an array of shape (len(texts), dim)."""
        ...


@runtime_checkable
class QueryEmbedder(Embedder, Protocol):
    """An embedder that can embed a /recall question ahead of queued background batches."""

    async def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, shape (dim,), without waiting behind background work."""
        ...


class ChatMessage(BaseModel):
    role: str
    content: str


class LLMUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


class LLMResult(BaseModel):
    """A structured completion: the parsed JSON object (or None) and what it cost."""

    data: dict[str, Any] | None
    raw_text: str
    finish_reason: str | None
    usage: LLMUsage
    model: str
    parse_error: str | None = None


@runtime_checkable
class LLM(Protocol):
    """A chat model that answers with one JSON object matching a schema."""

    model: str

    async def complete_json(
        self,
        messages: Sequence[ChatMessage],
        schema: dict[str, Any],
        *,
        schema_name: str,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult: ...

    async def complete_text(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult: ...


class LLMError(Exception):
    """Base of every LLM failure the core handles; carries a short, log-safe reason."""

    retryable: bool = False


class LLMUnavailable(LLMError):
    """Endpoint down, timed out, rate-limited or 5xx after retries: try again later."""

    retryable = True


class LLMRequestRejected(LLMError):
    """The endpoint refused the request (4xx other than 429): retrying will not help."""


class LLMBadOutput(LLMError):
    """The endpoint answered, but not with usable JSON."""
