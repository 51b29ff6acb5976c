"""The store benchmark's stages (bench/bench_store.py runs each in its own process, so peak
RSS is per stage): what each builds, times and returns as its part of the JSON."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from benchlib.build import ingest_timed, store_random_vectors
from benchlib.host import RssSampler, drop_page_cache
from benchlib.pg import pg_admin, pg_exists, restart_local_server, with_database
from benchlib.stats import latency_summary, percentile
from benchlib.vectors import LookupEmbedder, load_minilm, unit_vectors
from store_chat import ChatGen

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope

NAN = float("nan")
PG_URLS: dict[str, str] = {}
"""Benchmark "paths" of the PostgreSQL backend -> the URL of the database made for them."""


def make_minilm(args: argparse.Namespace) -> Any:
    """The real MiniLM embedder as the options ask for it, or None (with a message)."""
    return load_minilm(quantize=args.embed_int8, threads=args.embed_threads)


def db_path(args: argparse.Namespace, name: str) -> Path:
    d = Path(args.db_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.db"
    if args.backend == "postgres":  # a fresh database instead of a file
        dbname = f"bench_{name}"
        PG_URLS[str(p)] = with_database(args.db_url, dbname)
        if args.reuse_dbs and pg_exists(args.db_url, dbname):
            return p
        pg_admin(args.db_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        pg_admin(args.db_url, f'CREATE DATABASE "{dbname}"')
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
    url = PG_URLS.pop(str(path), None)
    if url is not None:
        dbname = url.split("?")[0].rsplit("/", 1)[1]
        pg_admin(args.db_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        return
    for suffix in ("", "-wal", "-shm"):
        q = path.with_name(path.name + suffix)
        if q.exists():
            q.unlink()


async def open_engine(path: Path, embedder: Any = None, **store_kw: Any) -> MemoryEngine:
    url = PG_URLS.get(str(path))
    cfg = MemoryConfig(store=StoreConfig(db_path=path, db_url=url, **store_kw))
    return await MemoryEngine.open(cfg, embedder)


async def db_bytes(engine: MemoryEngine) -> int:
    if engine.store.driver_name != "postgres":
        await engine.store.db.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return await engine.store.db_size_bytes()


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
        summ["cpu_p50_ms"] = round(percentile(cpu, 50, NAN), 2)
        summ["cpu_p95_ms"] = round(percentile(cpu, 95, NAN), 2)
        summ["with_hits"] = hits
        out[mode] = summ
    return out


async def cold_search_latencies(
    args: argparse.Namespace,
    path: Path,
    lookup: LookupEmbedder,
    work: list[tuple[Scope, str, np.ndarray]],
    modes: Sequence[str] = ("lexical", "dense", "hybrid"),
) -> dict[str, Any]:
    """Time `engine.search` in each mode from a cold start: before each mode the local
    PostgreSQL restarts (its shared buffers empty), the kernel's page cache is dropped and
    a new engine opens (SQLite's page cache is per connection), and no warm-up query runs.
    A channel's first query reads its pages from the disk; `first_in_channel` times those
    alone (later queries of a channel find some of its pages cached)."""
    for _, q, v in work:
        lookup.vectors[q] = v
    out: dict[str, Any] = {"queries": len(work)}
    for mode in modes:
        url = PG_URLS.get(str(path))
        out["server_restarted"] = url is not None and restart_local_server(url)
        if not drop_page_cache():
            return {"skipped": "dropping the page cache needs root"}
        engine = await open_engine(path, lookup)
        ms: list[float] = []
        first: list[float] = []
        seen: set[Scope] = set()
        try:
            for scope, q, _ in work:
                t0 = time.perf_counter()
                await engine.search(q, [scope], mode=mode)  # type: ignore[arg-type]
                ms.append((time.perf_counter() - t0) * 1000)
                if scope not in seen:
                    seen.add(scope)
                    first.append(ms[-1])
        finally:
            await engine.close()
        out[mode] = latency_summary(ms) | {"first_in_channel": latency_summary(first)}
        print(
            f"    cold {mode}: p50 {out[mode]['p50_ms']} ms, p95 {out[mode]['p95_ms']} ms"
            f" (first query in a channel: p95 {out[mode]['first_in_channel']['p95_ms']} ms)",
            flush=True,
        )
    return out


async def lexical_match_stats(engine: MemoryEngine, pk: int, queries: Sequence[str]) -> dict:
    """How many channel rows the lexical queries match (to show common words are included)."""
    from speakermem.memory.search.fts_query import build_match

    counts = []
    for q in queries[:50]:
        m = build_match(q)
        if not m:
            counts.append(0)
            continue
        rows = await engine.store.messages.lexical(m, [pk], 1_000_000)
        counts.append(len(rows))
    return {
        "matches_per_query_p50": int(percentile(counts, 50, NAN)),
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
            "p50_ms": round(percentile(ms, 50, NAN), 2),
            "p95_ms": round(percentile(ms, 95, NAN), 2),
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


async def stage_ingest(args: argparse.Namespace) -> dict[str, Any]:
    n = args.ingest_n
    path = db_path(args, "ingest")
    gen = ChatGen(args.seed, args.channels)
    engine = await open_engine(path)
    res = await ingest_timed(engine, gen.events, n, progress="ingest")
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
        await ingest_timed(engine, gen.events, n)
        res = await store_random_vectors(
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
                engine,
                lambda n: gen.events(n, channels=channels),
                total,
                progress=f"{name} ingest",
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
            v = await store_random_vectors(
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
    if args.cold:
        res["search_cold"] = await cold_search_latencies(args, path, lookup, work)
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


STAGE_FUNCS = {
    "ingest": stage_ingest,
    "embed": stage_embed,
    "vecinsert": stage_vecinsert,
    "10k": stage_10k,
    "100k": stage_100k,
    "1m": stage_1m,
}
"""The in-process stages; bench/store_stages_processes.py adds the multi-process ones."""
