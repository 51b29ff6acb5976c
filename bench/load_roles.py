"""The load benchmark's other processes: the bot (`speakermem run`'s code path with a lag
ticker and per-recall stage timings, optionally profiled or heap-logged) and the Slack sender
(signed message events at a steady rate)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import Ticker, event_bodies
from benchlib.slack_events import post_event

SECRET = "bench-load-signing-secret"


async def bot_main(cfg: dict[str, Any]) -> int:
    """Run the bot with a 10 ms lag ticker, appending its samples to `lag_out` every 5 s
    (so they survive a bot that has to be killed)."""
    from speakermem.bot.settings import Settings
    from speakermem.integrations import runtime

    stages_out = Path(cfg["stages_out"])
    stage_rows: list[dict[str, float]] = []
    recall_llm = cfg["recall_llm"]

    class Timed:
        """Records each recall's stage timings (the pipeline's own time, apart from Slack
        transport and the wait for the event loop) to a file."""

        async def run(self, req: Any, *, answer: bool = True) -> Any:
            started = time.perf_counter()
            result = await super().run(req, answer=answer)  # type: ignore[misc]
            stage_rows.append(
                {"total": (time.perf_counter() - started) * 1000, **result.trace.latency_ms}
            )
            return result

    class MeasuredRecall(Timed, runtime.RecallPipeline):
        """The runtime's pipeline, timed. Without --recall-llm it gets no LLM (the issue's
        "recall with no LLM"): the runtime builds one client for the Writer and for
        answers; only the recall pipeline is given none."""

        def __init__(self, engine: Any, *, llm: Any = None, **kw: Any) -> None:
            super().__init__(engine, llm=llm if recall_llm else None, **kw)

    class MeasuredProcesses(Timed, runtime.RecallProcesses):
        """The same for recalls in worker processes (--recall-processes): the children get
        an LLM only with --recall-llm; their stage timings come back in the trace."""

        def __init__(self, *a: Any, answer_llm: Any = None, **kw: Any) -> None:
            super().__init__(*a, answer_llm=answer_llm if recall_llm else None, **kw)

    runtime.RecallPipeline = MeasuredRecall  # type: ignore[misc]
    runtime.RecallProcesses = MeasuredProcesses  # type: ignore[misc]
    settings = Settings(_env_file=None, **cfg["settings"])  # type: ignore[call-arg]
    ticker = Ticker(clock=time.monotonic)
    ticker.start()
    out = Path(cfg["lag_out"])

    def flush() -> None:
        # hand the samples over to the file and drop them here: kept in the bot, they would
        # themselves grow its memory (~100 per second) while RSS is being measured
        batch = list(ticker.samples)
        ticker.samples.clear()
        with out.open("a") as fh:
            fh.write(json.dumps(batch) + "\n")
        rows, stage_rows[:] = list(stage_rows), []
        with stages_out.open("a") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)

    trace_to = cfg.get("tracemalloc")
    if trace_to:
        import tracemalloc

        tracemalloc.start(3)
    baseline: list[Any] = []
    last_trace = [0.0]
    started = time.monotonic()

    def trace_growth() -> None:
        """--tracemalloc: the Python allocations that grew since the first minute, by call
        site (rewritten every flush, so a killed bot still leaves the latest)."""
        import tracemalloc

        if time.monotonic() - last_trace[0] < 60:  # a snapshot stalls the loop for seconds
            return
        last_trace[0] = time.monotonic()
        snap = tracemalloc.take_snapshot()
        if not baseline:
            if time.monotonic() - started >= 60:
                baseline.append(snap)
            return
        stats = snap.compare_to(baseline[0], "traceback")[:30]
        lines = [f"after {time.monotonic() - started:.0f} s; growth since the first minute"]
        for st in stats:
            lines.append(f"{st.size_diff / 1e6:+8.2f} MB {st.count_diff:+8d} blocks")
            lines.extend(f"      {frame}" for frame in st.traceback.format())
        Path(str(trace_to)).write_text("\n".join(lines) + "\n")

    heap_to = cfg.get("heap_log")

    async def flusher() -> None:
        while True:
            await asyncio.sleep(5.0)
            flush()
            if trace_to:
                trace_growth()
            if heap_to:
                await asyncio.to_thread(heap_sample, time.monotonic() - started, Path(heap_to))

    task = asyncio.create_task(flusher())
    try:
        return await runtime.run(settings)
    finally:
        task.cancel()
        await ticker.stop()
        flush()


def heap_sample(t: float, to: Path) -> None:
    """--heap-log: append where the bot's anonymous memory is, for finding what grows:
    glibc's counters (`mallinfo2`, KB), Python's live blocks, the threads, and each anonymous
    mapping's resident KB keyed `start:size KB[:name]` (those under 512 KB summed), and
    SQLite's own memory."""
    import ctypes
    import threading

    from speakermem.integrations.ops.heap import mallinfo

    row: dict[str, Any] = {"t": round(t, 1), "py_blocks": sys.getallocatedblocks()}
    row["py_threads"] = threading.active_count()
    info = mallinfo()
    if info is not None:
        row.update({f: info[f] >> 10 for f in ("arena", "hblkhd", "uordblks", "fordblks")})
    with contextlib.suppress(ImportError, OSError, AttributeError):
        from sqlean import _sqlite3  # the store's SQLite (bundled), not the system's

        sqlite = ctypes.CDLL(_sqlite3.__file__)
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        row["sqlite_kb"] = sqlite.sqlite3_memory_used() >> 10
    maps: dict[str, int] = {}
    small = 0
    key, anon = "", False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if line[0].isupper():  # a field of the current mapping
                if anon and line.startswith("Rss:"):
                    kb = int(line.split()[1])
                    if kb >= 512:
                        maps[key] = kb
                    else:
                        small += kb
                continue
            parts = line.split()  # a mapping: start-end perms offset dev inode [path]
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            name = parts[5] if len(parts) > 5 else ""
            anon = name in ("", "[heap]", "[stack]")
            key = f"{lo:x}:{(hi - lo) >> 10}" + (f":{name}" if name else "")
    row["maps"] = maps
    row["small_anon_kb"] = small
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon", "Threads")):
                row[line.split(":")[0]] = int(line.split()[1])
    with to.open("a") as out:
        out.write(json.dumps(row) + "\n")


async def sender_main(args: argparse.Namespace) -> None:
    """Wait for 'go' on stdin, send signed events at `--rate` for `--seconds`; print a JSON
    summary (sent ids per channel, HTTP statuses) on stdout."""
    import aiohttp

    from tests.standins.slack_api import TEAM_ID, sign

    n = int(args.rate * args.seconds)
    bodies = event_bodies(n, args.channels, TEAM_ID)
    loop = asyncio.get_running_loop()
    print("READY", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    start = time.time()
    for i, body in enumerate(bodies):  # live timestamps, increasing per channel
        at = start + i / args.rate
        body["event"]["ts"] = f"{at:.6f}"
        body["event_time"] = int(at)
    sem = asyncio.Semaphore(64)
    statuses: dict[str, int] = {}
    sent: dict[str, list[str]] = {}
    t0 = time.monotonic()

    async def send(http: aiohttp.ClientSession, i: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        headers = {**sign(SECRET, int(time.time()), raw), "Content-Type": "application/json"}
        async with sem:
            key = await post_event(http, args.sender_url, raw, headers)
        statuses[key] = statuses.get(key, 0) + 1
        if key == "200":
            sent.setdefault(body["event"]["channel"], []).append(body["event"]["ts"])

    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        for i, body in enumerate(bodies):
            delay = t0 + i / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(http, i, body)))
        await asyncio.gather(*tasks)
    print(json.dumps({"statuses": statuses, "sent": sent, "send_s": time.monotonic() - t0}))
