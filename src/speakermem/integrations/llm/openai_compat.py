"""`LLM` port over any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp, LM Studio,
OpenAI).

Why our own retries (the client is built with `max_retries=0`): we want one place that
counts every attempt, applies jittered backoff we can shrink in tests, and turns failures
into the port's error types with log-safe reasons. Messages and logs carry only a short
reason and the HTTP status, never response bodies: some servers echo (part of) the API key
in 401 bodies.

Contract for `complete_json`: if the endpoint answered with a well-formed completion, it
returns an `LLMResult` even when the content is not usable JSON; then `data` is None and
`parse_error` holds an `extract_json` code ("empty", "no_json", "invalid_json", "truncated",
"not_object") or "thinking_budget" (a reasoning model spent the tokens thinking) so the
caller can count a rejection. It raises:
- `LLMUnavailable` after `max_retries` retries of timeouts, connection errors, 429 and 5xx,
  or at once when the server asks for a wait (Retry-After) longer than our backoff cap;
- `LLMContextOverflow` when the prompt did not fit: refused (HTTP 400 naming the context),
  or cut by the server (it reports far fewer prompt tokens than were sent);
- `LLMRequestRejected` at once for other 4xx;
- `LLMBadOutput` when the HTTP body is not a chat completion at all (HTML, invalid JSON,
  no choices): a broken server or proxy, not a model slip.

Servers (issue 32): with `structured_mode="auto"` the first call identifies the server
(integrations/llm/server_profile.py) and takes its mode, context and thinking switch; an
unidentified server gets `json_schema`, then `json_object`, then the schema in the prompt,
whichever its first call accepts. What was found is remembered for the process. Thinking is
turned off where the server has a switch, stripped from the answer where it does not, and a
model that thinks anyway gets `thinking_tokens` more to spend before it answers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from speakermem.integrations.llm.accounting import LLMStats
from speakermem.integrations.llm.context_guard import (
    context_overflow,
    looks_truncated,
    retry_after_seconds,
)
from speakermem.integrations.llm.json_extract import extract_json
from speakermem.integrations.llm.reasoning import field_thinking, split_thinking, thinking_tokens
from speakermem.integrations.llm.server_profile import ServerProfile, StructuredMode, detect_server
from speakermem.integrations.llm.structured_modes import (
    MODE_ORDER,
    ModeSetting,
    for_mode,
    refuses_mode,
)
from speakermem.memory.context_budget import (
    ESTIMATE_MARGIN,
    MIN_OUTPUT_TOKENS,
    EndpointLimits,
    chat_tokens,
)
from speakermem.memory.ports import (
    ChatMessage,
    LLMBadOutput,
    LLMContextOverflow,
    LLMRequestRejected,
    LLMResult,
    LLMUnavailable,
    LLMUsage,
)
from speakermem.memory.url_masking import mask_url

log = logging.getLogger(__name__)

DETECT_RETRY_S = 30.0
"""After the server could not be identified (down), calls go on without probing it again
for this long: an outage costs one identification attempt per period, not one per call."""

_PROFILES: dict[tuple[str, str], ServerProfile] = {}
"""What each endpoint (base URL, model) turned out to be, for the whole process."""


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
        structured_mode: ModeSetting = "json_schema",
        *,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        context_tokens: int | None = None,
        thinking_tokens: int = 0,
    ) -> None:
        if structured_mode not in ("auto", *MODE_ORDER):
            raise ValueError(f"unknown structured_mode {structured_mode!r}")
        self.model = model
        self.base_url = base_url
        self.auto = structured_mode == "auto"
        self.configured_context = context_tokens
        self.thinking_budget = max(0, thinking_tokens)
        self.max_retries = max(0, max_retries)
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.timeout_s = timeout_s
        self._api_key = api_key or "none"
        # `or "none"`: the client refuses an empty key, local servers ignore it anyway.
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=self._api_key, timeout=timeout_s, max_retries=0
        )
        fixed: StructuredMode | None = None if structured_mode == "auto" else structured_mode
        self.profile: ServerProfile | None = (
            None if fixed is None else ServerProfile(structured_mode=fixed)
        )
        """None until identified (auto); then the server, its mode and context."""
        self.mode_confirmed = not self.auto
        self.thinks = False
        """A reply came with thinking although we asked for none where we could."""
        self._detect_lock = asyncio.Lock()
        self._detect_after = 0.0
        """monotonic() before which an unreachable server is not probed again."""
        self._calls = self._attempts = self._retries = 0
        self._prompt_tokens = self._completion_tokens = self._thinking_tokens = 0
        self._truncations = 0
        self._latency_ms = 0.0
        self._errors: dict[str, int] = {}
        self._parse_errors: dict[str, int] = {}

    def __repr__(self) -> str:  # keep the key out of any accidental repr
        return f"OpenAICompatLLM(base_url={mask_url(self.base_url)!r}, model={self.model!r})"

    @property
    def structured_mode(self) -> StructuredMode:
        mode = self.profile.structured_mode if self.profile is not None else None
        return mode or MODE_ORDER[0]

    @property
    def context_tokens(self) -> int | None:
        """The context prompts are sized to: the setting, else what the server said, and
        never more than a cut or refused prompt proved."""
        p = self.profile
        stated = self.configured_context or (p.context_tokens if p is not None else None)
        learned = p.learned_context if p is not None else None
        known = [n for n in (stated, learned) if n]
        return min(known) if known else None

    @property
    def context_source(self) -> str:
        p = self.profile
        if p is not None and p.learned_context and p.learned_context == self.context_tokens:
            return p.learned_from
        if self.configured_context:
            return "SPEAKERMEM_LLM_CONTEXT_TOKENS"
        return p.context_source if p is not None else "unknown"

    @property
    def thinking_active(self) -> bool:
        """Thinking we cannot switch off: seen in a reply, or a reasoning model without a
        switch on this server."""
        p = self.profile
        return self.thinks or bool(p is not None and p.can_think and not p.thinking_off)

    @property
    def stats(self) -> LLMStats:
        return LLMStats(
            calls=self._calls,
            attempts=self._attempts,
            retries=self._retries,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion_tokens,
            thinking_tokens=self._thinking_tokens,
            latency_ms_total=self._latency_ms,
            truncations=self._truncations,
            errors=dict(self._errors),
            parse_errors=dict(self._parse_errors),
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> OpenAICompatLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the server ---------------------------------------------------------------------------

    async def identify(self) -> ServerProfile:
        """The server's profile (identified once per process and endpoint, in auto mode)."""
        if self.profile is not None:
            return self.profile
        async with self._detect_lock:
            if self.profile is None:
                known = _PROFILES.get((self.base_url, self.model))
                if known is None and time.monotonic() < self._detect_after:
                    return ServerProfile()  # it was down a moment ago: no new probe yet
                if known is None:
                    known = await detect_server(
                        self.base_url, self._api_key, self.model, timeout_s=self.timeout_s
                    )
                    if known is None:  # unreachable: json_schema for now, detect later
                        self._detect_after = time.monotonic() + DETECT_RETRY_S
                        return ServerProfile()
                    _PROFILES[(self.base_url, self.model)] = known
                    log.info(
                        "llm endpoint: %s (mode %s, context %s from %s)",
                        known.name,
                        known.structured_mode or "to be found",
                        known.context_tokens or "unknown",
                        known.context_source,
                    )
                self.profile = known
                self.mode_confirmed = known.structured_mode is not None
        return self.profile

    async def limits(self) -> EndpointLimits:
        """Context, parallelism and thinking budget, for sizing prompts and concurrency."""
        profile = await self.identify() if self.auto else self.profile
        return EndpointLimits(
            context_tokens=self.context_tokens,
            parallel=profile.parallel if profile is not None else None,
            thinking_tokens=self.thinking_budget if self.thinking_active else 0,
        )

    def _remember(self, **changes: Any) -> None:
        base = self.profile or ServerProfile()
        self.profile = replace(base, **changes)
        if self.auto:
            _PROFILES[(self.base_url, self.model)] = self.profile

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
        if self.auto:
            await self.identify()
        payload = [m.model_dump() for m in messages]
        modes = [self.structured_mode]
        if not self.mode_confirmed:  # an unidentified server: offer the others in turn
            modes += [m for m in MODE_ORDER if MODE_ORDER.index(m) > MODE_ORDER.index(modes[0])]
        for i, mode in enumerate(modes):
            last = i == len(modes) - 1
            sent = for_mode(payload, schema, schema_name, mode)
            try:
                completion, latency_ms, sent_tokens = await self._create(
                    sent[0], max_tokens, temperature, sent[1], probing=not last
                )
            except (LLMUnavailable, LLMRequestRejected) as exc:
                if last or not refuses_mode(exc):
                    raise
                log.info("llm endpoint refused structured mode %s (%s); trying the next", mode, exc)
                continue
            if not self.mode_confirmed:
                self.mode_confirmed = True
                self._remember(structured_mode=mode)
                log.info("llm endpoint takes structured mode %s", mode)
            break
        text, finish_reason, usage, thinking = self._account(completion, latency_ms)
        data, error = extract_json(text, finish_reason)
        if error is not None and thinking and (not text.strip() or finish_reason == "length"):
            error = "thinking_budget"  # it thought until the tokens ran out
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
            sent_tokens=sent_tokens,
        )

    async def complete_text(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        """Plain completion; `raw_text` is the answer (thinking removed), `data` is None."""
        if self.auto:
            await self.identify()
        payload = [m.model_dump() for m in messages]
        completion, latency_ms, sent_tokens = await self._create(
            payload, max_tokens, temperature, {}
        )
        text, finish_reason, usage, _ = self._account(completion, latency_ms)
        return LLMResult(
            data=None,
            raw_text=text,
            finish_reason=finish_reason,
            usage=usage,
            model=getattr(completion, "model", None) or self.model,
            sent_tokens=sent_tokens,
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

    def _max_tokens(self, requested: int | None, sent_tokens: int) -> int | None:
        """The answer's tokens, plus the thinking budget of a model that thinks anyway,
        never more than the context leaves after the prompt (vLLM refuses such requests)."""
        if requested is None:
            return None
        total = requested + (self.thinking_budget if self.thinking_active else 0)
        ctx = self.context_tokens
        if ctx is not None:
            room = ctx - int(sent_tokens * (1 + ESTIMATE_MARGIN))
            total = min(total, max(MIN_OUTPUT_TOKENS, room))
        return total

    async def _create(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None,
        temperature: float,
        extra: dict[str, Any],
        *,
        probing: bool = False,
    ) -> tuple[ChatCompletion, float, int]:
        """Call the endpoint with retries; returns the completion, the wall time incl.
        retries, and the estimated prompt tokens sent. A cut or refused prompt raises
        `LLMContextOverflow`; `probing` (a structured mode not yet known to work) gives up
        at the first HTTP 500, the llama.cpp Python server's answer to `json_schema`."""
        self._calls += 1
        sent_tokens = chat_tokens(messages)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            **extra,
        }
        wanted = self._max_tokens(max_tokens, sent_tokens)
        if wanted is not None:
            kwargs["max_tokens"] = wanted
        switch = self.profile.thinking_off if self.profile is not None else {}
        if switch:
            kwargs["extra_body"] = dict(switch)
        started = time.perf_counter()
        try:
            try:
                completion, latency = await self._retry_loop(kwargs, started, probing)
            except LLMContextOverflow as exc:
                self._remember_refusal(exc.context_tokens, sent_tokens)
                raise
            except LLMRequestRejected as exc:
                if not switch:
                    raise
                # the thinking switch itself was refused (an older server): drop it for good
                log.warning("llm endpoint refused the thinking switch (%s); not sent again", exc)
                self._remember(thinking_off={})
                kwargs.pop("extra_body", None)
                completion, latency = await self._retry_loop(kwargs, started, probing)
        finally:
            self._latency_ms += (time.perf_counter() - started) * 1000.0
        self._check_truncation(completion, sent_tokens, latency)
        return completion, latency, sent_tokens

    def _check_truncation(self, completion: ChatCompletion, sent: int, latency_ms: float) -> None:
        """Raise `LLMContextOverflow` when the server read far less than was sent: the reply
        answers a prompt without its beginning (the instructions)."""
        usage = getattr(completion, "usage", None)
        read = int(getattr(usage, "prompt_tokens", 0) or 0)
        if not looks_truncated(sent, read):
            return
        self._truncations += 1
        self._count_error("truncated")
        self._prompt_tokens += read
        done = int(getattr(usage, "completion_tokens", 0) or 0)
        self._completion_tokens += done
        profile = self.profile or ServerProfile()
        if self.context_tokens is None or read < self.context_tokens:
            self._remember(
                learned_context=read,
                learned_from=f"a cut prompt: the server read {read} of ~{sent} tokens",
            )
        fix = profile.context_fix(sent)
        log.warning(
            "llm endpoint (%s) cut a prompt of ~%d tokens to %d: prompts now fit %d "
            "tokens. Fix: %s",
            profile.name,
            sent,
            read,
            read,
            fix,
        )
        raise LLMContextOverflow(
            f"prompt cut by the server: it read {read} of ~{sent} tokens ({fix})",
            context_tokens=read,
            truncated=True,
            usage=LLMUsage(prompt_tokens=read, completion_tokens=done, latency_ms=latency_ms),
        )

    async def _retry_loop(
        self, kwargs: dict[str, Any], started: float, probing: bool = False
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
                wait = failure.retry_after
                long_wait = wait is not None and wait > self.backoff_max_s
                refused = probing and failure.status == 500
                if attempt >= self.max_retries or long_wait or refused:
                    self._count_error("unavailable")
                    (log.info if refused else log.warning)(
                        "llm unavailable after %d attempt(s): %s%s%s",
                        attempt + 1,
                        failure.kind,
                        status,
                        f"; the server asks for {wait:.0f}s" if long_wait and wait else "",
                    )
                    raise LLMUnavailable(
                        f"{failure.kind}{status} after {attempt + 1} attempt(s)",
                        retry_after=wait,
                        overloaded=failure.status in (429, 503),
                        status=failure.status,
                    ) from None
                delay = self._backoff(attempt, wait)
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
            if code in (429, 503):
                kind = "rate_limited" if code == 429 else "server_error"
                raise _Retryable(kind, code, _retry_after(exc)) from None
            if code >= 500 or code == 408:
                raise _Retryable("server_error", code) from None
            too_long, ctx = context_overflow(code, exc.body)
            self._count_error("context_overflow" if too_long else "rejected")
            log.warning("llm request rejected: http %d%s", code, " (context)" if too_long else "")
            if too_long:
                raise LLMContextOverflow(
                    f"http {code}: the prompt exceeds the model's context"
                    + (f" of {ctx} tokens" if ctx else ""),
                    context_tokens=ctx,
                ) from None
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

    def _remember_refusal(self, ctx: int | None, sent: int) -> None:
        """A refused prompt: the context the server named, else three quarters of what was
        sent (the next prompts shrink either way)."""
        learned = ctx or int(sent * 0.75)
        if learned > 0 and (self.context_tokens is None or learned < self.context_tokens):
            self._remember(learned_context=learned, learned_from="the server's context error")

    def _account(
        self, completion: ChatCompletion, latency_ms: float
    ) -> tuple[str, str | None, LLMUsage, str]:
        """(answer text, finish reason, usage, thinking): thinking is counted, not answered."""
        choice = completion.choices[0]
        content = getattr(choice.message, "content", None) or ""
        answer, inline = split_thinking(content)
        thinking = "\n".join(t for t in (field_thinking(choice.message), inline) if t)
        usage = getattr(completion, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        done = int(getattr(usage, "completion_tokens", 0) or 0)
        thought = thinking_tokens(usage, thinking)
        if thinking and not self.thinks:
            self.thinks = True
            log.info(
                "llm endpoint: the model thinks (%d tokens) although asked not to where the"
                " server can; calls get %d more tokens for it",
                thought,
                self.thinking_budget,
            )
        self._prompt_tokens += prompt
        self._completion_tokens += done
        self._thinking_tokens += thought
        return (
            answer,
            getattr(choice, "finish_reason", None),
            LLMUsage(
                prompt_tokens=prompt,
                completion_tokens=done,
                latency_ms=latency_ms,
                thinking_tokens=thought,
            ),
            thinking,
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential with equal jitter; a server's Retry-After (within the cap) wins."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max_s)
        cap = min(self.backoff_max_s, self.backoff_base_s * (2**attempt))
        return cap / 2 + random.uniform(0, cap / 2)

    def _count_error(self, kind: str) -> None:
        self._errors[kind] = self._errors.get(kind, 0) + 1


def _has_choice(completion: ChatCompletion) -> bool:
    try:
        return bool(completion.choices) and completion.choices[0].message is not None
    except (AttributeError, TypeError):
        return False


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        return retry_after_seconds(dict(exc.response.headers))
    except (AttributeError, ValueError):
        return None
