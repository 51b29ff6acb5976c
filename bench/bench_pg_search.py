"""Hybrid search latency on PostgreSQL at N messages in one channel (issue #13).

Usage: python bench/bench_pg_search.py [--n 100000] [--pgdata DIR] [--queries 60]

Starts its own PostgreSQL (pgserver) in DIR (a new temp dir unless given; an existing DIR
with a built `bench_search` database is reused, so a second run skips the ingest), ingests
N synthetic chat messages into ONE channel (words from a Zipf-like 20,000-word vocabulary,
3-12 words each, 50 speakers) through MemoryEngine.ingest_many, embeds them with a
word-hash embedder (384 dimensions, unit length: the cost of a dense scan does not depend
on what the vectors mean), then times per query:
  lexical  MessageRepo.lexical(build_match(q), [channel], pool)
  dense    MessageRepo.dense(vector, [channel], pool, dense_oversample, fraction)
  hybrid   MemoryEngine.search(q, [scope]) (lexical + dense + RRF + message fetch)
and prints p50/p95 of each. Queries are 4 vocabulary words drawn with the same Zipf law.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from benchlib.pg import pg_admin, pg_exists, with_database
from pydantic import SecretStr

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.search.fts_query import build_match

T0 = datetime(2024, 1, 1, tzinfo=UTC)
SCOPE = Scope(platform="b", workspace="w", channel="big")
VOCAB = 20_000
_WORD = re.compile(r"\w+")


class WordHashEmbedder:
    """Sum of per-word pseudo-random vectors, normalised (cached per word)."""

    name = "bench-hash"
    dim = 384

    def __init__(self) -> None:
        self._cache: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        v = self._cache.get(word)
        if v is None:
            seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            self._cache[word] = v
        return v

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in _WORD.findall(text.casefold()):
                out[i] += self._word(w)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
        return out


def zipf(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    p = 1 / np.arange(1, VOCAB + 1) ** 1.05
    return rng.choice(VOCAB, size=shape, p=p / p.sum())


def corpus(n: int) -> list[MessageEvent]:
    rng = np.random.default_rng(5)
    words = zipf(rng, (n, 12))
    lengths = rng.integers(3, 13, n)
    speakers = rng.integers(0, 50, n)
    return [
        MessageEvent(
            scope=SCOPE,
            message_id=f"m{i}",
            speaker_id=f"u{speakers[i]}",
            speaker_name=f"u{speakers[i]}",
            text=" ".join(f"w{w}" for w in words[i, : lengths[i]]),
            ts=T0 + timedelta(seconds=30 * i),
        )
        for i in range(n)
    ]


def pct(times: list[float], p: float) -> float:
    times = sorted(times)
    return times[max(0, round(p * len(times)) - 1)]


async def bench(url: str, n: int, queries: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    cfg = MemoryConfig(store=StoreConfig(db_path=tmp / "unused.db", db_url=SecretStr(url)))
    eng = await MemoryEngine.open(cfg, WordHashEmbedder())
    try:
        have = (await eng.store.messages.counts())["messages"]
        if have < n:
            t = time.perf_counter()
            await eng.ingest_many(corpus(n)[have:], batch_size=1000)
            print(f"ingest {n - have}: {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        stored = await eng.embed_pending(batch_size=2000)
        if stored:
            print(f"embed+store {stored}: {time.perf_counter() - t:.0f} s")
        async with eng.store.db.transaction() as tx:
            await tx.execute("ANALYZE")
        (pk,) = await eng.channel_pks([SCOPE])
        rng = np.random.default_rng(11)
        qs = [" ".join(f"w{w}" for w in row) for row in zipf(rng, (queries, 4))]
        pool = max(cfg.search.pool, 10)
        times: dict[str, list[float]] = {"lexical": [], "dense": [], "hybrid": []}
        for i, q in enumerate(qs):
            vec = (await eng.embedder.embed([q]))[0]  # type: ignore[union-attr]
            t0 = time.perf_counter()
            await eng.store.messages.lexical(build_match(q), [pk], pool)
            t1 = time.perf_counter()
            await eng.store.messages.dense(
                vec, [pk], pool, cfg.store.dense_oversample, cfg.search.hybrid_oversample_fraction
            )
            t2 = time.perf_counter()
            await eng.search(q, [SCOPE])
            t3 = time.perf_counter()
            if i >= 3:  # the first queries warm caches (statistics, buffers)
                times["lexical"].append((t1 - t0) * 1000)
                times["dense"].append((t2 - t1) * 1000)
                times["hybrid"].append((t3 - t2) * 1000)
        print(f"{n} messages in one channel, {len(times['hybrid'])} queries, pool {pool}")
        for name, ts in times.items():
            print(
                f"  {name:8s} p50 {statistics.median(ts):6.1f} ms  p95 {pct(ts, 0.95):6.1f} ms"
                f"  max {max(ts):6.1f} ms"
            )
    finally:
        await eng.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--pgdata", default=None)
    ap.add_argument("--queries", type=int, default=60)
    args = ap.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    import pgserver

    pgdata = args.pgdata or tempfile.mkdtemp(prefix="bench-pg-")
    server = pgserver.get_server(pgdata, cleanup_mode=None if args.pgdata else "delete")
    admin = str(server.get_uri())
    if not pg_exists(admin, "bench_search"):
        pg_admin(admin, "CREATE DATABASE bench_search")
    url = with_database(admin, "bench_search")
    asyncio.run(bench(url, args.n, args.queries))


if __name__ == "__main__":
    main()
