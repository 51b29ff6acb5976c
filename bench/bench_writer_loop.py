"""Event-loop lag while messages stream in and the Writer flushes against a slow LLM.

Why: the bot answers platform events and /recall on one asyncio loop. Storing, embedding and
writing must never stall it: SQLite runs on aiosqlite's thread, MiniLM on its own worker
thread, the LLM call is network I/O. This benchmark checks that claim end to end.

What it does:
1. starts a scripted OpenAI-compatible endpoint (tests/llm_server.py) in a *separate process*
   that answers every call after `--delay` seconds (default 2 s) with ADD actions grounded in
   the segment's messages, so validation, the evidence gate, record embedding and the commit
   all run;
2. opens a fresh store with the real MiniLM embedder (if its weights are installed; else none)
   and starts background embedding, the APScheduler `WriterScheduler` and the real
   `OpenAICompatLLM` client;
3. ingests `--messages` messages live, one `engine.ingest` per message, paced at `--rate`
   messages per second, round-robin over `--channels` channels (kicking the write job whenever a
   channel fills a window, as the bot does);
4. keeps going until every segment is written, while a 10 ms ticker records loop lag
   (actual - expected interval).

Prints a Markdown table (p50 / p95 / p99 / max lag, during ingestion and over the whole run)
and the machine. Target: p99 <= 50 ms.

Usage (from the repository root):
    python bench/bench_writer_loop.py                      # 1,000 messages, 10 channels, 2 s LLM
    python bench/bench_writer_loop.py --embedder none --delay 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import REPO_ROOT, TICK_S, machine, pct
from benchlib.cli import write_json
from benchlib.slack_events import WORDS
from benchlib.vectors import add_embedder_option, bot_embedder

TARGET_P99_MS = 50.0
NAMES = ("Alice", "Bob", "Carol", "Dan", "Erin", "Femi")


# ---------------------------------------------------------------- the slow endpoint (child)


def serve(delay_s: float) -> None:
    """Child mode: run the scripted server, print its URL, serve until stdin closes."""
    import re

    from tests.llm_server import Delay, Handler, LLMServer, Reply

    line = re.compile(r"^(m\d+) \[[^\]]*\] (\S+) \(([^)]+)\)(?: \[[^\]]*\])?: (.*)$", re.M)

    def answer(body: dict[str, Any]) -> Any:
        prompt = str(body["messages"][-1]["content"])
        firsts: dict[str, tuple[str, str, str]] = {}
        for ref, name, uid, text in line.findall(prompt):
            firsts.setdefault(uid, (ref, name, text))
        actions = [
            {
                "type": "ADD",
                "layer": "profile",
                "source": uid,
                "owner": uid,
                "content": f"{name} talked about {' '.join(text.split()[:6])}",
                "event": "chat",
                "refs": [ref],
            }
            for uid, (ref, name, text) in firsts.items()
        ]
        return Delay(delay_s, Reply(content=json.dumps({"actions": actions})))

    async def main() -> None:
        async with LLMServer(default=Handler(answer)) as server:
            print(server.base_url, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


def start_server(delay_s: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--delay", str(delay_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError("the scripted LLM server did not start")
    return proc, url


# ---------------------------------------------------------------- measurement


class StallSampler:
    """A watchdog thread: when the loop misses its tick by more than `threshold_ms`, sample
    the loop thread's stack every 5 ms until it beats again. Counts frames in our code,
    so the report names what holds the loop (without asyncio debug mode's own overhead)."""

    def __init__(self, threshold_ms: float) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.beat = time.perf_counter()
        self.loop_thread = threading.get_ident()
        self.stacks: Counter[str] = Counter()
        self.stalls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        in_stall = False
        while not self._stop.wait(0.005):
            late = time.perf_counter() - self.beat > TICK_S + self.threshold_s
            if late and not in_stall:
                self.stalls += 1
            in_stall = late
            if not late:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            inner = frame
            ours = []
            while frame is not None and len(ours) < 4:
                name = frame.f_code.co_filename
                if str(REPO_ROOT) in name and "bench_writer_loop" not in name:
                    rel = Path(name).relative_to(REPO_ROOT)
                    ours.append(f"{rel}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            lib = []
            while inner is not None and len(lib) < 3:
                if str(REPO_ROOT) in inner.f_code.co_filename:
                    break
                lib.append(f"{Path(inner.f_code.co_filename).name}:{inner.f_code.co_name}")
                inner = inner.f_back
            where = " <- ".join(ours) or "(outside the project)"
            self.stacks[f"{where} [in {' <- '.join(lib)}]" if lib else where] += 1


@dataclass
class Ticker:
    """Sleeps TICK_S in a loop; lag = how late each wake-up was."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    sampler: StallSampler | None = None

    async def run(self, stop: asyncio.Event) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.samples.append((now, max(0.0, now - last - TICK_S) * 1000.0))
            last = now
            if self.sampler is not None:
                self.sampler.beat = now

    def between(self, start: float, end: float) -> np.ndarray:
        return np.array([lag for t, lag in self.samples if start <= t <= end] or [0.0])


# ---------------------------------------------------------------- the run


async def run(args: argparse.Namespace, url: str, db_path: Path) -> dict[str, Any]:
    from speakermem.bot.scheduler import WriterScheduler
    from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
    from speakermem.memory.config import IngestConfig, MemoryConfig, StoreConfig, WriterConfig
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.models import MessageEvent, Scope
    from speakermem.memory.writer.runner import Writer

    rng = random.Random(args.seed)
    if args.debug_slow:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)  # asyncio logs every callback/step slower than this
        loop.slow_callback_duration = args.debug_slow / 1000.0
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    embedder, _ = bot_embedder(args.embedder)
    cfg = MemoryConfig(
        store=StoreConfig(db_path=db_path),
        ingest=IngestConfig(segment_window=args.window, session_gap_minutes=30.0),
        writer=WriterConfig(concurrency=args.concurrency),
    )
    engine = await MemoryEngine.open(cfg, embedder)
    llm = OpenAICompatLLM(url, "bench", "bench-model", timeout_s=60.0, max_retries=0)
    writer = Writer(engine, llm)
    sched = WriterScheduler(
        engine, writer, idle_seconds=30 * 60, write_interval_s=1.0, idle_check_s=1.0
    )
    scopes = [Scope(platform="bench", workspace="w", channel=f"c{i}") for i in range(args.channels)]
    ticker, stop = Ticker(), asyncio.Event()
    if args.trace_stalls:
        ticker.sampler = StallSampler(args.trace_stalls)
        ticker.sampler.start()
    tick_task = asyncio.create_task(ticker.run(stop))
    await asyncio.sleep(1.0)  # idle baseline
    t_base_end = time.perf_counter()

    engine.start_background_embedding()
    sched.start()
    per_channel = [0] * args.channels
    t0 = time.perf_counter()
    ingest_ms: list[float] = []
    for i in range(args.messages):
        target = t0 + i / args.rate
        now = time.perf_counter()
        if target > now:
            await asyncio.sleep(target - now)
        c = i % args.channels
        name = NAMES[(i // args.channels) % args.speakers]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
        ev = MessageEvent(
            scope=scopes[c],
            message_id=f"m{i}",
            speaker_id=name.lower(),
            speaker_name=name,
            text=text,
            ts=datetime.now(UTC),
        )
        s = time.perf_counter()
        await engine.ingest(ev)
        ingest_ms.append((time.perf_counter() - s) * 1000.0)
        per_channel[c] += 1
        if per_channel[c] % args.window == 0:
            sched.kick()
    t_ingest_end = time.perf_counter()

    await engine.store.segments.close_idle(0.0)  # the remainders, as if the channels went quiet
    sched.kick()
    total_segments = sum((await engine.store.segments.counts()).values())
    deadline = time.perf_counter() + args.max_wait
    while time.perf_counter() < deadline:
        counts = await engine.store.segments.counts()
        pending_embed = await engine.store.messages.count_pending_embeddings()
        if counts["segments_done"] == total_segments and (embedder is None or not pending_embed):
            break
        await asyncio.sleep(0.1)
    t_end = time.perf_counter()
    await sched.shutdown()
    stop.set()
    await tick_task
    stalls: dict[str, Any] = {}
    if ticker.sampler is not None:
        ticker.sampler.stop()
        stalls = {"n": ticker.sampler.stalls, "stacks": ticker.sampler.stacks.most_common(12)}
    stats = await engine.stats()
    await engine.close()
    await llm.aclose()
    if embedder is not None:
        embedder.close()

    writer_stats = stats["writer"]
    assert isinstance(writer_stats, dict)
    return {
        "machine": machine(),
        "sqlite_driver": stats["driver"],
        "embedder": getattr(embedder, "name", "none"),
        "messages": args.messages,
        "channels": args.channels,
        "llm_delay_s": args.delay,
        "writer_concurrency": args.concurrency,
        "ingest_s": t_ingest_end - t0,
        "ingest_rate_per_s": args.messages / max(t_ingest_end - t0, 1e-9),
        "ingest_ms": pct(np.array(ingest_ms)),
        "run_s": t_end - t0,
        "segments": total_segments,
        "segments_done": stats["segments_done"],
        "messages_embedded": stats.get("embedded_messages", stats.get("vectors")),
        "records": stats["records"],
        "writer_flushes": writer_stats["flushes"],
        "writer_rejected": writer_stats["rejected"],
        "llm_calls": llm.stats.calls,
        "lag_baseline_ms": pct(ticker.between(0.0, t_base_end)),
        "lag_ingest_ms": pct(ticker.between(t0, t_ingest_end)),
        "lag_run_ms": pct(ticker.between(t0, t_end)),
        "timed_out": t_end >= deadline,
        "stalls": stalls,
    }


def markdown(r: dict[str, Any]) -> str:
    def lag(key: str) -> str:
        v = r[key]
        return f"{v['p50']:.2f} | {v['p95']:.2f} | {v['p99']:.2f} | {v['max']:.2f} | {v['n']}"

    p99 = r["lag_run_ms"]["p99"]
    verdict = "meets" if p99 <= TARGET_P99_MS else "MISSES"
    lines = [
        f"Machine: {r['machine']}; SQLite driver {r['sqlite_driver']}; embedder {r['embedder']}",
        "",
        "| loop lag (ms), 10 ms ticker | p50 | p95 | p99 | max | samples |",
        "|---|---|---|---|---|---|",
        f"| idle baseline (1 s) | {lag('lag_baseline_ms')} |",
        f"| during live ingestion | {lag('lag_ingest_ms')} |",
        f"| whole run (ingest + writer drain) | {lag('lag_run_ms')} |",
        "",
        "| run | value |",
        "|---|---|",
        f"| messages / channels | {r['messages']} / {r['channels']} |",
        f"| ingestion | {r['ingest_s']:.2f} s ({r['ingest_rate_per_s']:.0f} msg/s) |",
        f"| one `engine.ingest` p50 / p99 | {r['ingest_ms']['p50']:.2f} / "
        f"{r['ingest_ms']['p99']:.2f} ms |",
        f"| LLM delay per call / writer concurrency | {r['llm_delay_s']} s / "
        f"{r['writer_concurrency']} |",
        f"| segments written | {r['segments_done']} / {r['segments']} |",
        f"| LLM calls / records committed | {r['llm_calls']} / {r['records']} |",
        f"| writer rejections | {r['writer_rejected'] or 'none'} |",
        f"| run time | {r['run_s']:.1f} s{' (TIMED OUT)' if r['timed_out'] else ''} |",
        f"| target p99 <= {TARGET_P99_MS:.0f} ms | {verdict} ({p99:.2f} ms) |",
    ]
    if r["stalls"]:
        lines += [
            "",
            f"Stalls over the threshold: {r['stalls']['n']}; loop-thread samples "
            "(5 ms each) by innermost project frames:",
            "",
        ]
        lines += [f"- {n} x {where}" for where, n in r["stalls"]["stacks"]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Event-loop lag while ingesting live and writing against a slow LLM."
    )
    parser.add_argument("--messages", type=int, default=1000, help="messages to ingest")
    parser.add_argument("--channels", type=int, default=10, help="channels (round-robin)")
    parser.add_argument("--speakers", type=int, default=4, help="speakers per channel (<= 6)")
    parser.add_argument("--rate", type=float, default=3000.0, help="target messages per second")
    parser.add_argument("--window", type=int, default=25, help="segment window")
    parser.add_argument("--delay", type=float, default=2.0, help="LLM seconds per call")
    parser.add_argument("--concurrency", type=int, default=2, help="Writer channel concurrency")
    add_embedder_option(parser)
    parser.add_argument("--max-wait", type=float, default=300.0, help="give up after (s)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", type=Path, default=None, help="database file (default: temp)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument(
        "--debug-slow",
        type=float,
        default=0.0,
        metavar="MS",
        help="asyncio debug mode: log each loop step slower than MS (finds what blocks)",
    )
    parser.add_argument(
        "--trace-stalls",
        type=float,
        default=0.0,
        metavar="MS",
        help="sample the loop thread's stack whenever a tick is more than MS late",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.delay)
        return 0
    args.speakers = max(1, min(args.speakers, len(NAMES)))
    # "job skipped: maximum number of running instances" is expected while a flush runs
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    proc, url = start_server(args.delay)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            db = args.db or Path(tmp) / "bench.db"
            result = asyncio.run(run(args, url, db))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(markdown(result))
    if args.out:
        write_json(args.out, result)
    return 0 if result["lag_run_ms"]["p99"] <= TARGET_P99_MS else 1


if __name__ == "__main__":
    sys.exit(main())
