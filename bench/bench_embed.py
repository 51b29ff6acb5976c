"""Throughput of the offline MiniLM embedder on realistic short chat messages, per core.

Reads LoCoMo dialogue turns (not copied into the repo) and, for each combination of
precision (fp32, int8 dynamic quantisation), background threads (the bot's `embed()` path),
ONNX Runtime intra-op threads per run, batch size and order, reports messages/s (wall), CPU
milliseconds per message and so messages per core-second (CPU time: on a shared machine the
wall figure moves with the load, the CPU figure much less), plus the int8 cosine to fp32.

Orders: `arrival` embeds the messages in chunks of --batch as the background worker takes
them from the backlog (each chunk padded to its own longest message after sorting within
it); `sorted` hands all of them to one call, which sorts by token length before cutting
batches, so each batch pads to similar lengths. Settings run interleaved, --repeat rounds:
the median CPU per message and the best wall time are kept. The 1-minute load average is
recorded with every row.

    python bench/bench_embed.py --n 1000 --threads 1 2 --batch 16 64 --order arrival sorted \
        --json docs/benchmarks/embed.json

`--questions K [K ...]` measures the /recall side instead: LoCoMo's questions through
`embed_query`, K asked at once (as K members' /recall in flight together), with each
`--precision` as the question graph (int8 is the bot's default, `query_quantize`), reporting
CPU milliseconds per question and how many shared each model run:

    python bench/bench_embed.py --questions 1 2 4 8 --json docs/benchmarks/embed-questions.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import benchlib  # noqa: F401 - puts the repository root on the path
import numpy as np
from benchlib.cli import write_json
from benchlib.host import host_info
from benchmark_docs import commit

from speakermem.integrations.embeddings.minilm import DEFAULT_CACHE_DIR, MiniLMEmbedder

DEFAULT_DATA = Path("/work/shared/data/locomo/locomo-dev.json")


def load_turns(path: Path, n: int) -> list[str]:
    """The first n dialogue turns of the LoCoMo conversations, in order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    turns: list[str] = []
    for sample in data:
        conv = sample["conversation"]
        for key, value in conv.items():
            if key.startswith("session_") and isinstance(value, list):
                turns += [t["text"] for t in value if t.get("text")]
    if not turns:
        raise SystemExit(f"no dialogue turns found in {path}")
    while len(turns) < n:
        turns += turns
    return turns[:n]


def write_rows(
    args: argparse.Namespace, benchmark: str, rows: list[dict[str, Any]], **what: Any
) -> None:
    """The rows as JSON (`--json`), with the run they came from: command, date, commit,
    machine, what was embedded (`what`), the data and the rounds."""
    if not args.json:
        return
    info = host_info()
    run = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(short=True),
        "machine": f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores",
        **what,
        "data": str(args.data),
        "repeat": args.repeat,
    }
    write_json(
        args.json,
        {
            "benchmark": benchmark,
            "command": "python bench/bench_embed.py " + " ".join(sys.argv[1:]),
            "run": run,
            "rows": rows,
        },
    )
    print(f"JSON written to {args.json}")


def load_questions(path: Path, n: int) -> list[str]:
    """The first n questions of the LoCoMo samples, in order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    questions = [
        q["question"] for sample in data for q in sample.get("qa", []) if q.get("question")
    ]
    if not questions:
        raise SystemExit(f"no questions found in {path}")
    while len(questions) < n:
        questions += questions
    return questions[:n]


async def ask(emb: MiniLMEmbedder, questions: list[str], at_once: int) -> None:
    """`at_once` questions asked together, group after group."""
    for i in range(0, len(questions), at_once):
        await asyncio.gather(*(emb.embed_query(q) for q in questions[i : i + at_once]))


def measure_questions(args: argparse.Namespace) -> None:
    """Each `--precision` is the question graph (int8: `query_quantize`, the bot's default;
    messages keep fp32 either way), each K of `--questions` run interleaved."""
    questions = load_questions(args.data, args.n)
    print(
        f"{len(questions)} questions, mean {statistics.mean(len(q) for q in questions):.0f} chars"
    )
    embedders = {
        p: MiniLMEmbedder(cache_dir=args.cache_dir, query_quantize=p == "int8")
        for p in args.precision
    }
    for emb in embedders.values():
        emb.embed_questions_sync(questions[:8])  # load + warm up
    keys = [(p, k) for p in args.precision for k in args.questions]
    cpus: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    walls: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    runs: dict[tuple[str, int], int] = {}
    loads: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    for _ in range(args.repeat):
        for key in keys:  # interleaved, so drift in the machine's load spreads evenly
            emb = embedders[key[0]]
            runs_before = emb.query_runs
            c0, t0 = time.process_time(), time.perf_counter()
            asyncio.run(ask(emb, questions, key[1]))
            walls[key].append(time.perf_counter() - t0)
            cpus[key].append(time.process_time() - c0)
            runs[key] = emb.query_runs - runs_before
            loads[key].append(os.getloadavg()[0])
    for emb in embedders.values():
        emb.close()
    rows = []
    print(f"{'graph':>5} {'at once':>7} {'cpu ms/q':>8} {'wall ms/q':>9} {'q/run':>6} {'load':>5}")
    for key in keys:
        precision, k = key
        row = {
            "question_graph": precision,
            "at_once": k,
            "cpu_ms_per_question": round(statistics.median(cpus[key]) * 1000 / len(questions), 3),
            "wall_ms_per_question": round(min(walls[key]) * 1000 / len(questions), 3),
            "questions_per_run": round(len(questions) / runs[key], 2),
            "loadavg_1m": [round(x, 2) for x in loads[key]],
        }
        rows.append(row)
        print(
            f"{precision:>5} {k:>7} {row['cpu_ms_per_question']:>8.2f}"
            f" {row['wall_ms_per_question']:>9.2f} {row['questions_per_run']:>6.2f}"
            f" {statistics.mean(loads[key]):>5.1f}",
            flush=True,
        )
    write_rows(
        args,
        "bench/bench_embed.py --questions",
        rows,
        questions=len(questions),
        mean_chars=round(statistics.mean(len(q) for q in questions), 1),
    )


async def embed_all(emb: MiniLMEmbedder, texts: list[str], order: str, batch: int) -> np.ndarray:
    if order == "sorted":
        return await emb.embed(texts)
    parts = [await emb.embed(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    return np.concatenate(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--n", type=int, default=2000, help="messages per run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--intra-op", type=int, nargs="+", default=[1], help="ORT threads/run")
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--order", choices=["arrival", "sorted"], nargs="+", default=["sorted"])
    parser.add_argument(
        "--precision", choices=["fp32", "int8"], nargs="+", default=["fp32", "int8"]
    )
    parser.add_argument(
        "--graph",
        choices=["fused", "plain"],
        nargs="+",
        default=["fused"],
        help="fused: onnxruntime contrib ops (default); plain: standard ONNX ops only",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--questions",
        type=int,
        nargs="+",
        metavar="K",
        help="measure questions (embed_query), K asked at once, instead of messages",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.questions:
        measure_questions(args)
        return

    texts = load_turns(args.data, args.n)
    print(f"{len(texts)} messages, mean {statistics.mean(len(t) for t in texts):.0f} chars")
    settings = list(
        itertools.product(
            args.graph, args.precision, args.threads, args.intra_op, args.batch, args.order
        )
    )
    embedders: dict[tuple[Any, ...], MiniLMEmbedder] = {}
    for graph, precision, threads, intra, batch, _ in settings:
        key = (graph, precision, threads, intra, batch)
        if key not in embedders:
            emb = MiniLMEmbedder(
                cache_dir=args.cache_dir,
                quantize=precision == "int8",
                fused=graph == "fused",
                threads=threads,
                batch_size=batch,
                intra_op_threads=intra,
            )
            emb.embed_sync(texts[:batch])  # load + warm up
            embedders[key] = emb
    walls: dict[tuple[Any, ...], list[float]] = {s: [] for s in settings}
    cpus: dict[tuple[Any, ...], list[float]] = {s: [] for s in settings}
    loads: dict[tuple[Any, ...], list[float]] = {s: [] for s in settings}
    vecs: dict[tuple[Any, ...], np.ndarray] = {}
    for _ in range(args.repeat):
        for s in settings:
            emb = embedders[s[:5]]
            c0, t0 = time.process_time(), time.perf_counter()
            vecs[s] = asyncio.run(embed_all(emb, texts, s[5], s[4]))
            walls[s].append(time.perf_counter() - t0)
            cpus[s].append(time.process_time() - c0)
            loads[s].append(os.getloadavg()[0])
    for emb in embedders.values():
        emb.close()
    reference = next((v for s, v in vecs.items() if s[1] == "fp32"), None)
    rows: list[dict[str, Any]] = []
    print(
        f"{'graph':6} {'prec':5} {'thr':>3} {'intra':>5} {'batch':>5} {'order':8} {'msg/s':>7}"
        f" {'cpu ms/msg':>10} {'msg/core-s':>10} {'load':>5}  cos-to-fp32 min/mean"
    )
    for s in settings:
        graph, precision, threads, intra, batch, order = s
        cpu_ms = statistics.median(cpus[s]) * 1000 / len(texts)
        row: dict[str, Any] = {
            "graph": graph,
            "precision": precision,
            "threads": threads,
            "intra_op_threads": intra,
            "batch": batch,
            "order": order,
            "msgs_per_s": round(len(texts) / min(walls[s]), 1),
            "cpu_ms_per_msg": round(cpu_ms, 3),
            "msgs_per_core_s": round(1000 / cpu_ms, 1),
            "loadavg_1m": [round(x, 2) for x in loads[s]],
        }
        if reference is not None:
            c = (vecs[s] * reference).sum(axis=1)
            row["cos_to_fp32_min"] = round(float(c.min()), 4)
            row["cos_to_fp32_mean"] = round(float(c.mean()), 4)
        rows.append(row)
        print(
            f"{graph:6} {precision:5} {threads:>3} {intra:>5} {batch:>5} {order:8}"
            f" {row['msgs_per_s']:>7.0f} {row['cpu_ms_per_msg']:>10.2f}"
            f" {row['msgs_per_core_s']:>10.0f} {statistics.mean(loads[s]):>5.1f}"
            f"  {row.get('cos_to_fp32_min', '')}/{row.get('cos_to_fp32_mean', '')}",
            flush=True,
        )
    write_rows(args, "bench/bench_embed.py", rows, messages=len(texts))


if __name__ == "__main__":
    main()
