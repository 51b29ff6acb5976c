"""`LLM` port over any OpenAI-compatible chat endpoint (OpenAI, vLLM, llama.cpp server).

Why our own retries (the client is built with `max_retries=0`): we want one place that
counts every attempt, applies jittered backoff we can shrink in tests, and turns failures
into the port's three error types with log-safe reasons. Messages and logs carry only a
short reason and the HTTP status, never response bodies: some servers echo (part of) the
API key in 401 bodies.

Contract for `complete_json`: if the endpoint answered with a well-formed completion, it
returns an `LLMResult` even when the content is not usable JSON; then `data` is None and
`parse_error` holds an `extract_json` code ("empty", "no_json", "invalid_json", "truncated",
"not_object") so the caller can count a rejection. It raises:
- `LLMUnavailable` after `max_retries` retries of timeouts, connection errors, 429 and 5xx;
- `LLMRequestRejected` at once for other 4xx;
- `LLMBadOutput` when the HTTP body is not a chat completion at all (HTML, invalid JSON,
  no choices): a broken server or proxy, not a model slip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from integrations.llm.json_extract import extract_json
from memory.ports import (
    ChatMessage,
    LLMBadOutput,
    LLMRequestRejected,
    LLMResult,
    LLMUnavailable,
    LLMUsage,
)

log = logging.getLogger(__name__)

StructuredMode = Literal["json_schema", "json_object", "none"]

SCHEMA_PROMPT = (
    "Reply with exactly one JSON object and nothing else (no prose, no code fences). "
    "It must match this JSON schema:\n"
)


@dataclass(frozen=True)
class LLMStats:
    """Cumulative counters since construction; a snapshot, safe to keep or compare."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_total: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    parse_errors: dict[str, int] = field(default_factory=dict)


class _Retryable(Exception):
    """Internal: one failed attempt that may be retried."""

    def __init__(self, kind: str, status: int | None, retry_after: float | None = None):
        super().__init__(kind)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after


class OpenAICompatLLM:
    """Chat completions with structured JSON output, retries and usage accounting."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float,
        structured_mode: StructuredMode = "json_schema",
        *,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        if structured_mode not in ("json_schema", "json_object", "none"):
            raise ValueError(f"unknown structured_mode {structured_mode!r}")
        self.model = model
        self.base_url = base_url
        self.structured_mode: StructuredMode = structured_mode
        self.max_retries = max(0, max_retries)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # `or "none"`: the client refuses an empty key, local servers ignore it anyway.
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=0
        )
        self._calls = self._attempts = self._retries = 0
        self._prompt_tokens = self._completion_tokens = 0
        self._latency_ms = 0.0
        self._errors: dict[str, int] = {}
        self._parse_errors: dict[str, int] = {}

    def __repr__(self) -> str:  # keep the key out of any accidental repr
        return f"OpenAICompatLLM(base_url={self.base_url!r}, model={self.model!r})"

    @property
    def stats(self) -> LLMStats:
        return LLMStats(
            calls=self._calls,
            attempts=self._attempts,
            retries=self._retries,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion_tokens,
            latency_ms_total=self._latency_ms,
            errors=dict(self._errors),
            parse_errors=dict(self._parse_errors),
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> OpenAICompatLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the port ---------------------------------------------------------------------------

    async def complete_json(
        self,
        messages: Sequence[ChatMessage],
        schema: dict[str, Any],
        *,
        schema_name: str = "response",
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        """One JSON object per the module contract: data=None + parse_error on bad content."""
        payload = [m.model_dump() for m in messages]
        extra: dict[str, Any] = {}
        if self.structured_mode == "json_schema":
            extra["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": False},
            }
        elif self.structured_mode == "json_object":
            # llama.cpp server 0.3.x: json_schema -> HTTP 500; json_object + schema works.
            extra["response_format"] = {"type": "json_object", "schema": schema}
        else:
            payload = _with_schema_prompt(payload, schema)
        completion, latency_ms = await self._create(payload, max_tokens, temperature, extra)
        text, finish_reason, usage = self._account(completion, latency_ms)
        data, error = extract_json(text, finish_reason)
        if error is not None:
            self._parse_errors[error] = self._parse_errors.get(error, 0) + 1
            log.warning(
                "llm output unusable: %s (finish_reason=%s, %d chars)",
                error,
                finish_reason,
                len(text),
            )
        return LLMResult(
            data=data,
            raw_text=text,
            finish_reason=finish_reason,
            usage=usage,
            model=getattr(completion, "model", None) or self.model,
            parse_error=error,
        )

    async def complete_text(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        """Plain completion; `raw_text` is the answer, `data` is always None."""
        payload = [m.model_dump() for m in messages]
        completion, latency_ms = await self._create(payload, max_tokens, temperature, {})
        text, finish_reason, usage = self._account(completion, latency_ms)
        return LLMResult(
            data=None,
            raw_text=text,
            finish_reason=finish_reason,
            usage=usage,
            model=getattr(completion, "model", None) or self.model,
        )

    async def check(self) -> str:
        """Readiness probe: never raises, returns a short status line for logs and /health.

        Lists models (cheap, no tokens); servers without /v1/models get a 1-token completion.
        """
        try:
            page = await self._client.models.list()
            ids = [m.id for m in page.data]
        except openai.NotFoundError:
            try:
                await self.complete_text([ChatMessage(role="user", content="ping")], max_tokens=1)
            except (LLMUnavailable, LLMRequestRejected, LLMBadOutput) as exc:
                return f"down: {exc}"
            return f"ok: {self.model} answered"
        except openai.APIStatusError as exc:
            return f"down: http {exc.status_code}"
        except openai.APITimeoutError:
            return "down: timeout"
        except openai.APIConnectionError:
            return "down: connection error"
        except Exception as exc:  # a readiness probe reports, it does not crash the caller
            return f"down: {type(exc).__name__}"
        if self.model in ids:
            return f"ok: {self.model} available"
        return f"ok: endpoint up, {len(ids)} model(s), {self.model} not listed"

    # -- internals --------------------------------------------------------------------------

    async def _create(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None,
        temperature: float,
        extra: dict[str, Any],
    ) -> tuple[ChatCompletion, float]:
        """Call the endpoint with retries; returns the completion and wall time incl. retries."""
        self._calls += 1
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            **extra,
        }
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        started = time.perf_counter()
        try:
            return await self._retry_loop(kwargs, started)
        finally:
            self._latency_ms += (time.perf_counter() - started) * 1000.0

    async def _retry_loop(
        self, kwargs: dict[str, Any], started: float
    ) -> tuple[ChatCompletion, float]:
        attempt = 0
        while True:
            self._attempts += 1
            try:
                completion = await self._attempt(kwargs)
                return completion, (time.perf_counter() - started) * 1000.0
            except _Retryable as failure:
                self._count_error(failure.kind)
                status = f" (http {failure.status})" if failure.status else ""
                if attempt >= self.max_retries:
                    self._count_error("unavailable")
                    log.warning(
                        "llm unavailable after %d attempt(s): %s%s",
                        attempt + 1,
                        failure.kind,
                        status,
                    )
                    raise LLMUnavailable(
                        f"{failure.kind}{status} after {attempt + 1} attempt(s)"
                    ) from None
                delay = self._backoff(attempt, failure.retry_after)
                log.info(
                    "llm attempt %d failed: %s%s; retrying in %.2fs",
                    attempt + 1,
                    failure.kind,
                    status,
                    delay,
                )
                attempt += 1
                self._retries += 1
                await asyncio.sleep(delay)

    async def _attempt(self, kwargs: dict[str, Any]) -> ChatCompletion:
        """One HTTP call, with every client exception mapped; `from None` drops bodies."""
        try:
            completion = await self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            raise _Retryable("timeout", None) from None
        except openai.APIConnectionError:
            raise _Retryable("connection", None) from None
        except openai.APIStatusError as exc:
            code = exc.status_code
            if code == 429:
                raise _Retryable("rate_limited", code, _retry_after(exc)) from None
            if code >= 500 or code == 408:
                raise _Retryable("server_error", code) from None
            self._count_error("rejected")
            log.warning("llm request rejected: http %d", code)
            raise LLMRequestRejected(f"http {code}") from None
        except openai.APIResponseValidationError:
            completion = None
        except ValueError:  # JSON content type with a body that is not JSON
            completion = None
        if not isinstance(completion, ChatCompletion) or not _has_choice(completion):
            self._count_error("bad_response")
            log.warning("llm endpoint returned something that is not a chat completion")
            raise LLMBadOutput("bad_response: not a chat completion")
        return completion

    def _account(
        self, completion: ChatCompletion, latency_ms: float
    ) -> tuple[str, str | None, LLMUsage]:
        choice = completion.choices[0]
        text = getattr(choice.message, "content", None) or ""
        usage = getattr(completion, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        done = int(getattr(usage, "completion_tokens", 0) or 0)
        self._prompt_tokens += prompt
        self._completion_tokens += done
        return (
            text,
            getattr(choice, "finish_reason", None),
            LLMUsage(prompt_tokens=prompt, completion_tokens=done, latency_ms=latency_ms),
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential with equal jitter; a server's Retry-After wins but is capped."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max_s)
        cap = min(self.backoff_max_s, self.backoff_base_s * (2**attempt))
        return cap / 2 + random.uniform(0, cap / 2)

    def _count_error(self, kind: str) -> None:
        self._errors[kind] = self._errors.get(kind, 0) + 1


def _with_schema_prompt(messages: list[dict[str, Any]], schema: dict[str, Any]) -> list[dict]:
    """Mode "none": the schema travels in the system prompt (first system message or new)."""
    note = SCHEMA_PROMPT + json.dumps(schema, ensure_ascii=False)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{note}"
    else:
        out.insert(0, {"role": "system", "content": note})
    return out


def _has_choice(completion: ChatCompletion) -> bool:
    try:
        return bool(completion.choices) and completion.choices[0].message is not None
    except (AttributeError, TypeError):
        return False


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, ValueError):
        return None
