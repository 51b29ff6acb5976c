"""Scenario: the LLM endpoint is down for N minutes while people keep talking (issue 9).

What it shows, with the production Writer settings (retry base/max from WriterConfig unless
overridden) and the real scheduler, Writer, openai client, SQLite store:
- the Writer backs off with jitter and does not spin: LLM calls per minute during the outage;
- the queue depth is visible: pending / deferred / oldest pending age (the same measurement
  /healthz and /metrics use) every `--sample` seconds;
- /recall answers extractively during the outage and says so (the Slack reply's notice);
- everything catches up afterwards: time from recovery to an empty queue, each segment
  written exactly once (one non-deferred Writer run per segment).

The endpoint is the local OpenAI-compatible test server (tests/llm_server.py) answering 503
during the outage and a no-op Writer reply (after `--latency` s) otherwise. Messages arrive
at `--rate` per second over `--channels` channels; segments close after `--idle` s of quiet
per channel (the session gap) or when they fill.

Usage (from the repository root):
    python bench/scenario_llm_down.py                 # 10-minute outage (the README run)
    python bench/scenario_llm_down.py --minutes 1     # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import machine
from benchlib.cli import add_json_option, write_json

from speakermem.bot.health import decide, measure_writer_queue
from speakermem.bot.scheduler import WriterScheduler
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.integrations.ops.metrics import MeteredLLM, Metrics
from speakermem.integrations.ops.server import OpsServer
from speakermem.integrations.slack.render import render_blocks
from speakermem.memory.config import IngestConfig, MemoryConfig, StoreConfig, WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.writer.runner import Writer
from tests.llm_server import Delay, LLMServer, Reply

TOPICS = ("deploy", "budget", "launch", "review", "holiday", "backup", "design", "invoice")


class Up:
    async def connected(self) -> bool:
        return True


def writer_calls(server: LLMServer) -> list[float]:
    return [
        at
        for at, body in zip(server.times, server.requests, strict=True)
        if "writer_actions" in json.dumps(body.get("response_format"))
    ]


async def scenario(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    defaults = WriterConfig()
    wcfg = WriterConfig(
        retry_base_s=args.retry_base or defaults.retry_base_s,
        retry_max_s=args.retry_max or defaults.retry_max_s,
        concurrency=defaults.concurrency,
    )
    config = MemoryConfig(
        store=StoreConfig(db_path=tmp / "llm-down.db"),
        ingest=IngestConfig(segment_window=args.window),
        writer=wcfg,
    )
    engine = await MemoryEngine.open(config)
    server = await LLMServer(
        default=Delay(args.latency, then=Reply(content=json.dumps({"actions": []})))
    ).start()
    base = OpenAICompatLLM(server.base_url, "k", "test-model", 30.0, "json_schema", max_retries=0)
    metrics = Metrics()
    writer_llm = MeteredLLM(base, metrics, role="writer")
    answer_llm = MeteredLLM(base, metrics, role="answer", health=writer_llm.health)
    writer = Writer(engine, writer_llm)
    scheduler = WriterScheduler(engine, writer, idle_seconds=args.idle)
    ops = OpsServer(engine, metrics, {"bench": Up()}, llm=writer_llm)
    pipeline = RecallPipeline(engine, llm=answer_llm)
    scopes = [
        Scope(platform="bench", workspace="w", channel=f"c{i:02d}") for i in range(args.channels)
    ]
    sent = 0
    stop_sending = asyncio.Event()

    async def talk() -> None:
        nonlocal sent
        interval = 1.0 / args.rate
        next_at = time.monotonic()
        while not stop_sending.is_set():
            i = sent
            scope = scopes[i % len(scopes)]
            topic = TOPICS[(i // len(scopes)) % len(TOPICS)]
            event = MessageEvent(
                scope=scope,
                message_id=f"m{i:07d}",
                speaker_id=f"u{i % 7}",
                speaker_name=f"Member {i % 7}",
                text=f"update {i}: the {topic} for {scope.channel} moves to day {i % 28 + 1}",
                ts=datetime.now(UTC),
            )
            await engine.ingest_many([event])
            sent += 1
            if sent % len(scopes) == 0:
                scheduler.kick()
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    timeline: list[dict[str, Any]] = []
    recalls: list[dict[str, Any]] = []
    t0 = time.monotonic()

    async def sample(phase: str) -> None:
        q = await measure_writer_queue(engine.segments)
        report = decide(await ops.facts())
        timeline.append(
            {
                "t_s": round(time.monotonic() - t0, 1),
                "phase": phase,
                "pending": q.pending,
                "deferred": q.deferred,
                "oldest_pending_s": q.oldest_pending_age_s,
                "writer_calls": len(writer_calls(server)),
                "health": report.status,
            }
        )

    async def ask(phase: str) -> None:
        scope = scopes[len(recalls) % len(scopes)]
        started = time.perf_counter()
        result = await pipeline.run(
            RecallRequest(f"When does the deploy for {scope.channel} move?", scope)
        )
        ms = (time.perf_counter() - started) * 1000
        blocks = json.dumps(render_blocks(result.answer, {}))
        notice = result.answer.notice()
        recalls.append(
            {
                "phase": phase,
                "t_s": round(time.monotonic() - t0, 1),
                "ms": round(ms, 1),
                "citations": len(result.answer.citations),
                "used_llm": result.answer.used_llm,
                "notice": notice,
                "notice_in_slack_reply": bool(notice) and "Extractive answer" in blocks,
            }
        )

    talker = asyncio.create_task(talk())
    scheduler.start()
    try:
        await asyncio.sleep(args.warmup)
        await sample("before")
        outage_start = time.monotonic()
        server.down(503)
        outage_s = args.minutes * 60.0
        next_sample = outage_start
        next_ask = outage_start + 5.0
        while (now := time.monotonic()) < outage_start + outage_s:
            if now >= next_sample:
                await sample("outage")
                next_sample += args.sample
            if now >= next_ask:
                await ask("outage")
                next_ask += max(10.0, outage_s / 6)
            await asyncio.sleep(0.5)
        outage_end = time.monotonic()
        server.up()
        stop_sending.set()
        await talker
        # the last segments close at the session gap; then everything must drain
        await asyncio.sleep(args.idle + 1)
        await engine.store.segments.close_idle(0)
        scheduler.kick()
        deadline = outage_end + wcfg.retry_max_s + args.idle + 120
        caught_up_at = None
        next_sample = time.monotonic()
        while time.monotonic() < deadline:
            if time.monotonic() >= next_sample:
                await sample("after")
                next_sample += args.sample
            counts = await engine.store.segments.counts()
            if counts["segments_pending"] == 0 and counts["segments_open"] == 0:
                caught_up_at = time.monotonic()
                break
            await asyncio.sleep(0.5)
        await sample("end")
        await ask("after")
        calls = writer_calls(server)
        during = [t for t in calls if outage_start <= t < outage_end]
        per_minute = [
            sum(1 for t in during if outage_start + 60 * m <= t < outage_start + 60 * (m + 1))
            for m in range(max(1, round(outage_s / 60)))
        ]
        runs = await engine.store.db.read(
            "SELECT segment_id, sum(outcome != 'deferred'), sum(outcome = 'deferred')"
            " FROM writer_runs GROUP BY segment_id"
        )
        segments = await engine.store.segments.counts()
        stored = (await engine.store.messages.counts())["messages"]
    finally:
        stop_sending.set()
        await scheduler.shutdown()
        await server.stop()
        await engine.close()
    return {
        "minutes": args.minutes,
        "rate": args.rate,
        "channels": args.channels,
        "retry_base_s": wcfg.retry_base_s,
        "retry_max_s": wcfg.retry_max_s,
        "latency_s": args.latency,
        "sent": sent,
        "stored": stored,
        "writer_calls_during_outage": len(during),
        "calls_per_minute": per_minute,
        "segments": segments,
        "segments_written_once": sum(1 for _, done, _ in runs if int(done) == 1),
        "segments_written_twice": sum(1 for _, done, _ in runs if int(done) > 1),
        "failed_attempts_logged": sum(int(f) for _, _, f in runs),
        "catch_up_s": None if caught_up_at is None else round(caught_up_at - outage_end, 1),
        "timeline": timeline,
        "recalls": recalls,
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"### LLM endpoint down for {r['minutes']} min "
        f"(retry base {r['retry_base_s']:.0f} s, max {r['retry_max_s']:.0f} s; "
        f"{r['rate']} msg/s over {r['channels']} channels)",
        "",
        f"- Writer calls during the outage: {r['writer_calls_during_outage']} "
        f"(per minute: {r['calls_per_minute']})",
        f"- messages sent / stored: {r['sent']} / {r['stored']}",
        f"- segments: {r['segments']}; written exactly once: {r['segments_written_once']}, "
        f"more than once: {r['segments_written_twice']}; failed attempts logged: "
        f"{r['failed_attempts_logged']}",
        "- catch-up after recovery (queue empty): "
        + ("not within the wait" if r["catch_up_s"] is None else f"{r['catch_up_s']} s"),
        "",
        "| t (s) | phase | pending | deferred | oldest pending (s) | Writer calls so far"
        " | health |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["timeline"]:
        lines.append(
            f"| {row['t_s']} | {row['phase']} | {row['pending']} | {row['deferred']} | "
            f"{row['oldest_pending_s']} | {row['writer_calls']} | {row['health']} |"
        )
    lines += [
        "",
        "| t (s) | phase | /recall ms | citations | notice shown (Slack) |",
        "|---|---|---|---|---|",
    ]
    for a in r["recalls"]:
        shown = "yes" if a["notice_in_slack_reply"] else "no"
        lines.append(
            f"| {a['t_s']} | {a['phase']} | {a['ms']} | {a['citations']} | "
            f"{a['notice'] or 'answered by the LLM'} ({shown}) |"
        )
    lines += ["", f"Machine: {machine()}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="outage length")
    p.add_argument("--rate", type=float, default=5.0, help="messages per second")
    p.add_argument("--channels", type=int, default=10)
    p.add_argument("--window", type=int, default=20, help="messages per segment")
    p.add_argument("--idle", type=float, default=10.0, help="session gap (s) closing segments")
    p.add_argument("--latency", type=float, default=0.5, help="LLM reply latency (s)")
    p.add_argument("--retry-base", type=float, default=None, help="default: WriterConfig's")
    p.add_argument("--retry-max", type=float, default=None, help="default: WriterConfig's")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds of normal operation")
    p.add_argument("--sample", type=float, default=30.0, help="queue sample interval (s)")
    add_json_option(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="scenario-llm-down-") as tmp:
        result = asyncio.run(scenario(args, Path(tmp)))
    print(report(result))
    if args.json:
        write_json(args.json, result)
    ok = (
        result["catch_up_s"] is not None
        and result["segments_written_twice"] == 0
        and result["sent"] == result["stored"]
        and all(a["notice_in_slack_reply"] for a in result["recalls"] if a["phase"] == "outage")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
