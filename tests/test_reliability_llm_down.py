"""The LLM endpoint goes down for a while (issue 9, fault scenarios): the Writer backs off with
jitter and does not spin, the queue depth is visible, /recall answers extractively and says
so, and every segment is written exactly once after the endpoint returns.

The clock is compressed (retry base 0.4 s, ceiling 1.2 s) so the outage lasts seconds; the
full-length run is bench/scenario_llm_down.py. Everything crosses real edges: the openai
client against the local test server, real SQLite, the real scheduler.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.health import LLMHealth, decide
from speakermem.bot.scheduler import WriterScheduler
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.integrations.ops.metrics import MeteredLLM, Metrics
from speakermem.integrations.ops.server import OpsServer
from speakermem.integrations.slack.render import render_blocks
from speakermem.memory.config import MemoryConfig, StoreConfig, WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.writer.runner import Writer as SegmentWriter
from speakermem.memory.writer.runner import backoff_seconds
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.llm_server import Delay, LLMServer, Reply

FAST = WriterConfig(retry_base_s=0.4, retry_max_s=1.2, concurrency=2)
CHANNELS = 6
OUTAGE_S = 4.0


# --- backoff: bounds and spread, without sleeping -------------------------------------------


def test_backoff_is_jittered_within_bounds_and_spread() -> None:
    cfg = WriterConfig(retry_base_s=30.0, retry_max_s=1800.0)
    for attempts in range(12):
        ceiling = min(1800.0, 30.0 * 2**attempts)
        assert backoff_seconds(attempts, cfg, lambda: 0.0) == ceiling / 2
        assert ceiling / 2 < backoff_seconds(attempts, cfg, lambda: 0.999999) <= ceiling
    rng = random.Random(7)
    draws = [backoff_seconds(3, cfg, rng.random) for _ in range(2_000)]
    assert min(draws) >= 120.0 and max(draws) <= 240.0
    assert len({round(d, 3) for d in draws}) > 1_900  # retries of many segments spread out
    # uniform over [120, 240]: mean 180, standard deviation 120 / sqrt(12) ~ 34.6
    assert abs(statistics.mean(draws) - 180.0) < 4.0
    assert 30.0 < statistics.stdev(draws) < 39.0
    # at the ceiling too: a long outage does not bring every channel back in step
    capped = [backoff_seconds(40, cfg, rng.random) for _ in range(500)]
    assert min(capped) >= 900.0 and max(capped) <= 1800.0 and statistics.stdev(capped) > 200


# --- the outage, end to end ---------------------------------------------------------------------


def writer_call_times(server: LLMServer, start: float, end: float) -> list[float]:
    """Arrival times of Writer calls (its JSON schema is named writer_actions) in [start, end)."""
    out = []
    for at, body in zip(server.times, server.requests, strict=True):
        if start <= at < end and "writer_actions" in json.dumps(body.get("response_format")):
            out.append(at)
    return out


def rounds(times: list[float], gap: float = 0.1) -> list[list[float]]:
    """Group call times into attempt rounds (calls less than `gap` apart belong together)."""
    out: list[list[float]] = []
    for t in sorted(times):
        if out and t - out[-1][-1] < gap:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def most_rounds(cfg: WriterConfig, window: float) -> int:
    """The most attempt rounds backoff allows in `window` s: each pause lasts at least half
    its ceiling, and the ceiling doubles per consecutive failure."""
    n, elapsed = 1, 0.0
    while True:
        elapsed += backoff_seconds(n - 1, cfg, lambda: 0.0)
        if elapsed > window:
            return n
        n += 1


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float) -> bool:
    for _ in range(int(seconds / 0.02)):
        if await check():
            return True
        await asyncio.sleep(0.02)
    return await check()


class Up:
    async def connected(self) -> bool:
        return True


async def seed(engine: MemoryEngine) -> list[Scope]:
    scopes = [Scope(platform="test", workspace="w", channel=f"c{i}") for i in range(CHANNELS)]
    for i, scope in enumerate(scopes):
        await engine.ingest_many(
            [
                msg(scope, f"{scope.channel}-1", "Alice", f"The deploy of service {i} moved.", 0),
                msg(scope, f"{scope.channel}-2", "Bob", f"Service {i} now deploys on Friday.", 1),
                msg(scope, f"{scope.channel}-3", "Alice", "Thanks, noted.", 2),
            ]
        )
        await engine.store.segments.close_channel(scope)
    return scopes


@pytest.mark.slow
async def test_llm_down_backs_off_reports_queue_answers_extractively_and_catches_up(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "down.db"), writer=FAST)
    engine = await MemoryEngine.open(config, HashEmbedder())
    llm_server.default = Reply(content=json.dumps({"actions": []}))
    base = OpenAICompatLLM(
        llm_server.base_url, "k", "test-model", 2.0, "json_schema", max_retries=0
    )
    metrics = Metrics()
    health = LLMHealth(configured=True)
    writer_llm = MeteredLLM(base, metrics, role="writer", health=health)
    answer_llm = MeteredLLM(base, metrics, role="answer", health=health)
    writer = SegmentWriter(engine, writer_llm)
    # a long interval: every retry below comes from the scheduler's wake-up at the due time
    scheduler = WriterScheduler(engine, writer, idle_seconds=3600, write_interval_s=60)
    ops = OpsServer(engine, metrics, {"test": Up()}, llm=writer_llm)
    try:
        scopes = await seed(engine)
        llm_server.down(503)
        started = time.monotonic()
        scheduler.start()
        await asyncio.sleep(OUTAGE_S / 2)

        # queue depth while the endpoint is down: health, its decision, the metrics
        facts = await ops.facts()
        q = facts.writer_queue
        assert q.pending == CHANNELS and facts.writer_pending == CHANNELS
        assert 1 <= q.deferred <= CHANNELS
        assert q.oldest_pending_age_s is not None and q.oldest_pending_age_s > 0
        assert q.next_attempt_in_s is not None and q.next_attempt_in_s <= FAST.retry_max_s
        report = decide(facts)
        assert report.status == "degraded" and report.http_status == 200
        assert any("extractive" in r for r in report.reasons)
        assert any("backing off" in r for r in report.reasons)
        text = metrics.render().decode()
        assert f"speakermem_writer_queue_segments {float(CHANNELS)}" in text
        assert f"speakermem_writer_deferred_segments {float(q.deferred)}" in text
        assert "speakermem_writer_oldest_pending_seconds 0.0" not in text

        # /recall during the outage: extractive, cited, and the Slack reply says so and why
        result = await RecallPipeline(engine, llm=answer_llm).run(
            RecallRequest("When does service 2 deploy?", scopes[2])
        )
        answer = result.answer
        assert not answer.used_llm and answer.citations
        assert answer.extractive_reason == "llm_failed", (answer, result.trace.llm_errors)
        blocks = json.dumps(render_blocks(answer, {}))
        assert "Extractive answer: quoted from the cited messages" in blocks
        assert "not answering" in blocks

        await asyncio.sleep(max(0.0, started + OUTAGE_S - time.monotonic()))
        recovered = time.monotonic()
        llm_server.up()

        # no spin: attempts come in rounds of at most `concurrency` calls (the breaker stops
        # the other channels), rounds spaced by the backoff, and only as many as it allows
        during = writer_call_times(llm_server, started, recovered)
        grouped = rounds(during)
        assert len(grouped) >= 3, grouped  # it kept retrying through the outage
        assert len(grouped) <= most_rounds(FAST, OUTAGE_S), grouped
        assert all(len(g) <= FAST.concurrency for g in grouped), grouped
        gaps = [b[0] - a[-1] for a, b in itertools.pairwise(grouped)]
        assert min(gaps) >= backoff_seconds(0, FAST, lambda: 0.0) - 0.02, gaps
        assert len(during) < CHANNELS * len(grouped)  # one probe per round, not one per channel
        assert (
            f'speakermem_llm_calls_total{{result="error",role="writer"}} {float(len(during))}'
            in (metrics.render().decode())
        )

        # catch-up: every segment written, each exactly once
        async def written() -> bool:
            return not (await engine.store.segments.counts())["segments_pending"]

        assert await eventually(written, 15)
        counts = await engine.store.segments.counts()
        assert counts["segments_pending"] == 0 and counts["segments_done"] == CHANNELS
        assert len(writer_call_times(llm_server, recovered, time.monotonic())) == CHANNELS
        runs = await engine.store.db.read(
            "SELECT segment_id, sum(outcome != 'deferred'), sum(outcome = 'deferred')"
            " FROM writer_runs GROUP BY segment_id"
        )
        assert len(runs) == CHANNELS
        assert all(int(done) == 1 for _, done, _ in runs), runs
        assert sum(int(failed) for _, _, failed in runs) == len(during)
        assert health.failing_since is None and writer.failures == 0
        after = await ops.facts()
        assert after.writer_queue.pending == 0 and after.writer_queue.deferred == 0
        assert decide(after).status == "ok"
    finally:
        await scheduler.shutdown()
        await base.aclose()
        await engine.close()


async def test_a_kicked_scheduler_makes_no_calls_while_the_breaker_is_open(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    """New segments closing during an outage (each kicks the write job) add no LLM calls
    until the pause ends: kicks find the breaker open and return at once."""
    config = MemoryConfig(
        store=StoreConfig(db_path=tmp_path / "kick.db"),
        writer=WriterConfig(retry_base_s=2.0, retry_max_s=4.0),
    )
    engine = await MemoryEngine.open(config, HashEmbedder())
    base = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 2.0, max_retries=0)
    writer = SegmentWriter(engine, base)
    scheduler = WriterScheduler(engine, writer, idle_seconds=3600, write_interval_s=60)
    try:
        llm_server.down(None)  # connection refused-like: dropped without an answer
        scope = Scope(platform="test", workspace="w", channel="first")
        await engine.ingest_many([msg(scope, "a", "Alice", "first message here", 0)])
        await engine.store.segments.close_channel(scope)
        scheduler.start()

        async def paused() -> bool:
            return writer.paused

        assert await eventually(paused, 5)
        calls = len(llm_server.times)
        assert calls == 1
        for i in range(20):  # other channels fill segments and kick the Writer
            other = Scope(platform="test", workspace="w", channel=f"k{i}")
            await engine.ingest_many([msg(other, f"k{i}", "Bob", f"message {i}", 0)])
            await engine.store.segments.close_channel(other)
            scheduler.kick()
            await asyncio.sleep(0.02)
        assert len(llm_server.times) == calls
        assert scheduler.runs["write"] >= 2  # the kicks did run the job
        pending = (await engine.store.segments.counts())["segments_pending"]
        assert pending == 21
        rows: list[Any] = await engine.store.db.read(
            "SELECT count(*) FROM segments WHERE attempts > 0"
        )
        assert int(rows[0][0]) == 1  # untried segments keep their attempt count at 0
    finally:
        await scheduler.shutdown()
        await base.aclose()
        await engine.close()


async def test_shutdown_finishes_the_segments_in_flight_not_the_backlog(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    """SIGTERM during a long drain: the run ends after the calls in flight (each segment
    commits or stays pending), instead of writing the whole backlog first."""
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "drain.db"), writer=FAST)
    engine = await MemoryEngine.open(config, HashEmbedder())
    llm_server.default = Delay(0.5, then=Reply(content=json.dumps({"actions": []})))
    base = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, max_retries=0)
    writer = SegmentWriter(engine, base)
    scheduler = WriterScheduler(engine, writer, idle_seconds=3600, write_interval_s=60)
    try:
        await seed(engine)  # one pending segment in each of CHANNELS channels
        scheduler.start()

        async def calling() -> bool:
            return len(llm_server.times) >= 1

        assert await eventually(calling, 5)
        started = time.monotonic()
        await scheduler.shutdown()
        took = time.monotonic() - started
        counts = await engine.store.segments.counts()
        # at most one round of `concurrency` calls finished; the backlog was left pending
        assert len(llm_server.times) <= FAST.concurrency
        assert counts["segments_done"] == len(llm_server.times)
        assert counts["segments_pending"] == CHANNELS - len(llm_server.times)
        assert took < 0.5 * CHANNELS / FAST.concurrency  # not the time to write them all
    finally:
        await base.aclose()
        await engine.close()
