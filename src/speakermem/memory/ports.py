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


@runtime_checkable
class BackgroundEmbedder(Embedder, Protocol):
    """An embedder whose background batches give way to /recall at the CPU (so they need
    no gate in front of it): final vectors only on cores nothing else wants, and quicker
    drafts for messages that wait without any vector."""

    drafts: bool
    """Whether `draft=True` gives quicker vectors than the final ones (False: the same)."""

    async def embed_background(self, texts: Sequence[str], *, draft: bool) -> np.ndarray:
        """`embed` for the backlog: final vectors at idle priority, drafts (`draft`) from
        the quicker graph."""
        ...


class ChatMessage(BaseModel):
    role: str
    content: str


class LLMUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    thinking_tokens: int = 0
    """Completion tokens a reasoning model spent thinking (part of completion_tokens)."""


class LLMResult(BaseModel):
    """A structured completion: the parsed JSON object (or None) and what it cost."""

    data: dict[str, Any] | None
    raw_text: str
    finish_reason: str | None
    usage: LLMUsage
    model: str
    parse_error: str | None = None
    truncated: bool = False
    """The server read far fewer prompt tokens than were sent: it cut the prompt (Ollama's
    OpenAI route does so silently). The reply answers a prompt we did not write: never use
    it as an answer to ours."""
    sent_tokens: int = 0
    """Estimated prompt tokens sent (what `usage.prompt_tokens` is compared with)."""


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

    def __init__(
        self,
        reason: str,
        *,
        retry_after: float | None = None,
        overloaded: bool = False,
        status: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        """The last HTTP status, when the endpoint answered at all."""
        self.retry_after = retry_after
        """Seconds the server asked us to wait (Retry-After), when it said."""
        self.overloaded = overloaded
        """The server said it is overloaded (429 or 503), rather than failing."""


class LLMRequestRejected(LLMError):
    """The endpoint refused the request (4xx other than 429): retrying will not help."""


class LLMContextOverflow(LLMRequestRejected):
    """The prompt did not fit the model's context: the server refused it, or cut it and
    answered the rest (`truncated`), an answer the adapter never hands on as one."""

    def __init__(
        self,
        reason: str,
        *,
        context_tokens: int | None = None,
        truncated: bool = False,
        usage: LLMUsage | None = None,
    ) -> None:
        super().__init__(reason)
        self.context_tokens = context_tokens
        """The context the server showed (its message, or what it read of a cut prompt)."""
        self.truncated = truncated
        self.usage = usage or LLMUsage()
        """What the call cost (a cut prompt is still read and answered)."""


class LLMBadOutput(LLMError):
    """The endpoint answered, but not with usable JSON."""
