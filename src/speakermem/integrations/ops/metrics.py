"""Prometheus metrics (prometheus-client), kept out of bot/ and memory/.

Counters that bot/ already keeps (the dispatcher's handled/ignored/error counts, each
adapter's stats) are read at scrape time by a custom collector, so the core needs no
metrics calls. What must be observed as it happens comes in through small hooks: the
dispatcher's `on_recall(seconds, outcome)`, and `MeteredLLM`, a wrapper around the LLM
port that times every Writer and answer call and counts its tokens and cost. Queue depths,
the backlog's age, catch-up lag and the Writer's tokens per run and per 1,000 messages are
gauges the health sampler sets; the Writer's adaptive concurrency is read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.health import LLMHealth, WriterQueue
from speakermem.memory.context_budget import EndpointLimits, endpoint_limits
from speakermem.memory.ports import LLM, ChatMessage, LLMError, LLMResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RECALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
LLM_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class _DispatchCollector(Collector):
    """events in / stored / rejected from the dispatcher's counters, at scrape time."""

    def __init__(self, dispatcher: Dispatcher, adapters: Mapping[str, Any]) -> None:
        self.dispatcher = dispatcher
        self.adapters = adapters

    def collect(self) -> Iterable[Metric]:
        stats = self.dispatcher.stats
        handled = CounterMetricFamily(
            "speakermem_events_handled",
            "Events the dispatcher applied, by kind and outcome (message_stored, "
            "message_duplicate, edit_applied, delete_unknown, roster_join, recall, ...)",
            labels=["outcome"],
        )
        for key, n in sorted(stats.handled.items()):
            handled.add_metric([key], n)
        yield handled
        rejected = CounterMetricFamily(
            "speakermem_events_rejected",
            "Events not stored: ignored (bot messages) or failed to apply (errors)",
            labels=["reason"],
        )
        for key, n in sorted(stats.ignored.items()):
            rejected.add_metric([f"ignored_{key}"], n)
        for key, n in sorted(stats.errors.items()):
            rejected.add_metric([f"error_{key}"], n)
        yield rejected
        adapter = CounterMetricFamily(
            "speakermem_adapter_events",
            "Per-platform adapter counters (received by kind, malformed, bad signatures, ...)",
            labels=["platform", "counter"],
        )
        for platform, ad in self.adapters.items():
            for key, n in sorted(getattr(ad, "stats", {}).items()):
                if isinstance(n, int | float):
                    adapter.add_metric([platform, str(key)], n)
        yield adapter
        yield from self._catchup()
        spill = getattr(self.dispatcher, "spill", None)
        spilled = GaugeMetricFamily(
            "speakermem_spill_events",
            "Events kept in the disk-full spill, waiting to be stored",
        )
        spilled.add_metric([], spill.count if spill is not None else 0)
        yield spilled

    def _catchup(self) -> Iterable[Metric]:
        """Per channel of each adapter's catch-up runs: how far behind the present it still
        is (0 once caught up) and how many messages it fetched."""
        lag = GaugeMetricFamily(
            "speakermem_catchup_lag_seconds",
            "Per channel: now minus the newest message catch-up has reached (0 when done)",
            labels=["platform", "channel"],
        )
        fetched = CounterMetricFamily(
            "speakermem_catchup_messages",
            "Messages fetched by catch-up and backfill runs since start",
            labels=["platform"],
        )
        now = time.time()
        for platform, ad in self.adapters.items():
            runner = getattr(getattr(ad, "catchup", None), "catchup", None)
            progress = getattr(runner, "progress", None) or {}
            total = 0
            for scope, prog in progress.items():
                total += prog.fetched
                behind = 0.0 if prog.done or prog.newest_ts is None else now - prog.newest_ts
                lag.add_metric([platform, scope.channel], max(0.0, behind))
            fetched.add_metric([platform], total)
        yield lag
        yield fetched


class _WriterCollector(Collector):
    """The Writer's current concurrency (it adapts), read at scrape time."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def collect(self) -> Iterable[Metric]:
        pacer = getattr(self.writer, "pacer", None)
        limit = GaugeMetricFamily(
            "speakermem_writer_concurrency",
            "Writer LLM calls allowed at once now (adapted to the endpoint's latency, 429s)",
        )
        limit.add_metric([], pacer.limit if pacer is not None else 0)
        yield limit
        busy = GaugeMetricFamily("speakermem_writer_calls_in_flight", "Writer LLM calls running")
        busy.add_metric([], pacer.in_flight if pacer is not None else 0)
        yield busy


class Metrics:
    """One registry per process run; `render()` is the /metrics body."""

    def __init__(
        self, *, prompt_price_per_mtok: float = 0.0, completion_price_per_mtok: float = 0.0
    ) -> None:
        self.prices = (prompt_price_per_mtok, completion_price_per_mtok)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.recall_seconds = Histogram(
            "speakermem_recall_seconds",
            "/recall latency from the dispatcher's point of view",
            ["outcome"],
            buckets=RECALL_BUCKETS,
            registry=r,
        )
        self.llm_calls = Counter(
            "speakermem_llm_calls", "LLM calls by role and result", ["role", "result"], registry=r
        )
        self.llm_seconds = Histogram(
            "speakermem_llm_seconds", "LLM call latency", ["role"], buckets=LLM_BUCKETS, registry=r
        )
        self.llm_tokens = Counter(
            "speakermem_llm_tokens",
            "LLM tokens by role and kind (prompt, completion; thinking is part of completion)",
            ["role", "kind"],
            registry=r,
        )
        self.llm_cost = Counter(
            "speakermem_llm_cost_usd",
            "What the LLM calls cost at SPEAKERMEM_LLM_*_PRICE_PER_MTOK (0 on your own server)",
            ["role"],
            registry=r,
        )
        self.writer_tokens_per_run = Gauge(
            "speakermem_writer_tokens_per_run",
            "Writer LLM tokens per run (prompt + completion), over its whole run log",
            registry=r,
        )
        self.writer_tokens_per_1k = Gauge(
            "speakermem_writer_tokens_per_1k_messages",
            "Writer LLM tokens per 1,000 messages written, over its whole run log",
            registry=r,
        )
        self.writer_pending = Gauge(
            "speakermem_writer_queue_segments",
            "Closed segments waiting for the Writer (the Writer queue depth)",
            registry=r,
        )
        self.writer_deferred = Gauge(
            "speakermem_writer_deferred_segments",
            "Pending segments backing off after a failed Writer attempt",
            registry=r,
        )
        self.writer_oldest_age = Gauge(
            "speakermem_writer_oldest_pending_seconds",
            "Age of the first message of the oldest segment waiting for the Writer (0: none)",
            registry=r,
        )
        self.writer_rejected = Gauge(
            "speakermem_writer_rejected_actions",
            "Writer actions refused, by reason (validation's codes; commit_* at the commit),"
            " over its whole run log",
            ["reason"],
            registry=r,
        )
        self.embed_pending = Gauge(
            "speakermem_embed_queue_messages", "Messages waiting for a vector", registry=r
        )
        self.embed_drafts = Gauge(
            "speakermem_embed_draft_messages",
            "Messages whose vector is an int8 draft, waiting for the full-precision one",
            registry=r,
        )
        self.db_up = Gauge("speakermem_db_up", "1 when the database answered the probe", registry=r)
        self.platform_up = Gauge(
            "speakermem_platform_connected",
            "1 when the platform is connected",
            ["platform"],
            registry=r,
        )

    def watch(self, dispatcher: Dispatcher, adapters: Mapping[str, Any]) -> None:
        """Expose the dispatcher's and adapters' own counters."""
        self.registry.register(_DispatchCollector(dispatcher, adapters))

    def watch_writer(self, writer: Any) -> None:
        """Expose the Writer's adaptive concurrency."""
        self.registry.register(_WriterCollector(writer))

    def set_writer_usage(self, tokens_per_run: float, tokens_per_1k_messages: float) -> None:
        self.writer_tokens_per_run.set(tokens_per_run)
        self.writer_tokens_per_1k.set(tokens_per_1k_messages)

    def set_writer_rejected(self, by_reason: Mapping[str, int]) -> None:
        """The run log's refusals per reason (attribution ones included), as last read."""
        for reason, n in by_reason.items():
            self.writer_rejected.labels(reason).set(n)

    def observe_tokens(self, role: str, call: LLMCall) -> None:
        self.llm_tokens.labels(role, "prompt").inc(call.prompt_tokens)
        self.llm_tokens.labels(role, "completion").inc(call.completion_tokens)
        self.llm_tokens.labels(role, "thinking").inc(call.thinking_tokens)
        prompt, completion = self.prices
        cost = (call.prompt_tokens * prompt + call.completion_tokens * completion) / 1e6
        self.llm_cost.labels(role).inc(cost)

    def set_writer_queue(self, queue: WriterQueue) -> None:
        self.writer_pending.set(queue.pending)
        self.writer_deferred.set(queue.deferred)
        self.writer_oldest_age.set(queue.oldest_pending_age_s or 0.0)

    def observe_recall(self, seconds: float, outcome: str) -> None:
        self.recall_seconds.labels(outcome).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LLMCall(NamedTuple):
    """One finished LLM call, as `MeteredLLM` observes it (picklable: it crosses processes)."""

    seconds: float
    error: str | None = None
    """The exception's class name; None when the call succeeded."""
    endpoint_error: bool = False
    """The endpoint failed (`LLMError`), as opposed to a bug on our side."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    thinking_tokens: int = 0


class MeteredLLM:
    """The LLM port with every call counted and timed, and failure state kept for /healthz."""

    def __init__(
        self,
        inner: LLM,
        metrics: Metrics | None,
        *,
        role: str,
        health: LLMHealth | None = None,
        on_call: Callable[[LLMCall], None] | None = None,
    ) -> None:
        """`health` may be shared by the wrappers of one endpoint (Writer and answers).
        `on_call` also hears every call: a recall process hands its calls to the bot's
        own wrapper this way (`observe`), whose metrics and health are the exported ones."""
        self.inner = inner
        self.metrics = metrics
        self.role = role
        self.model = inner.model
        self.health = health if health is not None else LLMHealth(configured=True)
        self.on_call = on_call

    async def limits(self) -> EndpointLimits:
        """The wrapped LLM's limits (context, parallel slots, thinking budget)."""
        return await endpoint_limits(self.inner)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> LLMResult:
        started = time.perf_counter()
        try:
            result: LLMResult = await fn(*args, **kwargs)
        except LLMError as exc:
            spent = getattr(exc, "usage", None)  # a cut prompt was still read and answered
            self._heard(
                LLMCall(
                    time.perf_counter() - started,
                    type(exc).__name__,
                    True,
                    getattr(spent, "prompt_tokens", 0),
                    getattr(spent, "completion_tokens", 0),
                )
            )
            raise
        except Exception as exc:
            self._heard(LLMCall(time.perf_counter() - started, type(exc).__name__, False))
            raise
        u = result.usage
        self._heard(
            LLMCall(
                time.perf_counter() - started,
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                thinking_tokens=u.thinking_tokens,
            )
        )
        return result

    def _heard(self, call: LLMCall) -> None:
        self.observe(call)
        if self.on_call is not None:
            self.on_call(call)

    def observe(self, call: LLMCall) -> None:
        """Count and time one finished call, and keep the endpoint's failure state: only
        the endpoint's own errors (`LLMError`) mark it failing, any success clears it."""
        if self.metrics is not None:
            self.metrics.llm_calls.labels(self.role, "ok" if call.error is None else "error").inc()
            self.metrics.llm_seconds.labels(self.role).observe(call.seconds)
            self.metrics.observe_tokens(self.role, call)
        if call.error is None:
            self.health.failing_since = None
            self.health.last_error = None
        elif call.endpoint_error:
            if self.health.failing_since is None:
                self.health.failing_since = time.time()
            self.health.last_error = call.error

    async def complete_json(
        self,
        messages: Sequence[ChatMessage],
        schema: dict[str, Any],
        *,
        schema_name: str,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        return await self._call(
            self.inner.complete_json,
            messages,
            schema,
            schema_name=schema_name,
            max_tokens=max_tokens,
            temperature=temperature,
        )

    async def complete_text(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        return await self._call(
            self.inner.complete_text, messages, max_tokens=max_tokens, temperature=temperature
        )
