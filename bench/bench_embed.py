"""Throughput of the offline MiniLM embedder on realistic short chat messages.

Reads LoCoMo dialogue turns (not copied into the repo) and prints messages/s for each
combination of precision, background threads (the bot's `embed()` path) and batch size,
plus the int8 cosine to fp32.

    python bench/bench_embed.py --n 2000 --threads 1 2 --batch 32 64 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from pathlib import Path

import benchlib  # noqa: F401 - puts the repository root on the path
import numpy as np

from integrations.embeddings.minilm import DEFAULT_CACHE_DIR, MiniLMEmbedder

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--n", type=int, default=2000, help="messages per run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128])
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
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting (best wins)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    texts = load_turns(args.data, args.n)
    print(f"{len(texts)} messages, mean {statistics.mean(len(t) for t in texts):.0f} chars")
    reference: np.ndarray | None = None
    print(f"{'graph':6} {'prec':5} {'thr':>3} {'batch':>5} {'msg/s':>7}  cos-to-fp32 min/mean")
    for graph in args.graph:
        for precision in args.precision:
            for threads in args.threads:
                for batch in args.batch:
                    emb = MiniLMEmbedder(
                        cache_dir=args.cache_dir,
                        quantize=precision == "int8",
                        fused=graph == "fused",
                        threads=threads,
                        batch_size=batch,
                    )
                    emb.embed_sync(texts[:batch])  # load + warm up
                    best = float("inf")
                    vecs = np.empty(0)
                    for _ in range(args.repeat):
                        t0 = time.perf_counter()
                        vecs = asyncio.run(emb.embed(texts))
                        best = min(best, time.perf_counter() - t0)
                    emb.close()
                    if reference is None and precision == "fp32":
                        reference = vecs
                    cos = ""
                    if reference is not None:
                        c = (vecs * reference).sum(axis=1)
                        cos = f"{c.min():.4f}/{c.mean():.4f}"
                    print(
                        f"{graph:6} {precision:5} {threads:>3} {batch:>5} "
                        f"{len(texts) / best:>7.0f}  {cos}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
