"""The operations HTTP endpoint: ``/healthz`` (JSON, 503 when the bot cannot serve) and
``/metrics`` (Prometheus text), on its own port so a probe never queues behind Slack.

Each request measures afresh (three small queries with a timeout) and `bot.health.decide`
turns the facts into a status; the same measurement refreshes the queue-depth gauges.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from speakermem.bot.health import (
    QUEUE_WARN,
    HealthFacts,
    HealthReport,
    LLMHealth,
    WriterQueue,
    decide,
    measure_writer_queue,
)
from speakermem.bot.spill import Spill
from speakermem.integrations.ops.metrics import CONTENT_TYPE, MeteredLLM, Metrics
from speakermem.memory.engine import MemoryEngine

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0


class OpsServer:
    """Serves /healthz and /metrics for one running bot."""

    def __init__(
        self,
        engine: MemoryEngine,
        metrics: Metrics,
        adapters: Mapping[str, Any],
        *,
        llm: MeteredLLM | None = None,
        spill: Spill | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        queue_warn: int = QUEUE_WARN,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.adapters = adapters
        self.llm = llm
        self.spill = spill
        self.host = host
        self.port = port
        self.queue_warn = queue_warn
        self._runner: web.AppRunner | None = None
        self._queues: tuple[WriterQueue, int, int] = (WriterQueue(), 0, 0)
        """The last Writer queue and embedding backlog measured."""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("ops endpoint on http://%s:%s (/healthz, /metrics)", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def facts(self) -> HealthFacts:
        db_ok, db_error, latency = True, None, None
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self.engine.admin.ping()
            latency = round((time.perf_counter() - started) * 1000, 1)
        except Exception as exc:  # any failure here means the store cannot serve
            db_ok, db_error = False, f"{type(exc).__name__}: {str(exc)[:120]}"
        queue, embed_pending, embed_drafts = self._queues
        if db_ok:
            # Counting a long queue under load can outlast the probe: that is a slow count,
            # not a store that cannot serve, so the last counts stand until one finishes.
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    queue = await measure_writer_queue(self.engine.segments)
                    embed_pending = await self.engine.count_unembedded()
                    embed_drafts = await self.engine.count_draft_vectors()
                    usage = await self.engine.admin.writer_usage()
                    stats = await self.engine.admin.writer_stats()
                self._queues = (queue, embed_pending, embed_drafts)
                self.metrics.set_writer_usage(usage.tokens_per_run, usage.tokens_per_1k_messages)
                rejected = stats.get("rejected")
                if isinstance(rejected, dict):
                    self.metrics.set_writer_rejected(rejected)
            except Exception as exc:
                log.warning("queue depths not measured this time (%s)", type(exc).__name__)
                queue, embed_pending, embed_drafts = self._queues
        platforms: dict[str, bool] = {}
        for name, adapter in self.adapters.items():
            try:
                platforms[name] = bool(await adapter.connected())
            except Exception:
                platforms[name] = False
        m = self.metrics
        m.db_up.set(1 if db_ok else 0)
        m.set_writer_queue(queue)
        m.embed_pending.set(embed_pending)
        m.embed_drafts.set(embed_drafts)
        for name, up in platforms.items():
            m.platform_up.labels(name).set(1 if up else 0)
        return HealthFacts(
            db_ok=db_ok,
            db_error=db_error,
            db_latency_ms=latency,
            platforms=platforms,
            writer_pending=queue.pending,
            writer_queue=queue,
            embed_pending=embed_pending,
            embed_drafts=embed_drafts,
            spilled=self.spill.count if self.spill is not None else 0,
            llm=self.llm.health if self.llm is not None else LLMHealth(configured=False),
        )

    async def report(self) -> HealthReport:
        return decide(await self.facts(), queue_warn=self.queue_warn)

    async def _healthz(self, request: web.Request) -> web.Response:
        report = await self.report()
        return web.json_response(report.model_dump(mode="json"), status=report.http_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        await self.facts()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})
