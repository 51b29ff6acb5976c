"""Trial: a per-channel HNSW index against the sign-bit scan, each query from a cold start.

    python bench/pg_dense_trial.py --db-dir DIR --db bench_scale_1m --channels 12 \\
        --doc docs/benchmarks/postgresql-cold.json --key random_10k --label "..."

Runs on a database `bench_store.py --backend postgres --keep-dbs --db-dir DIR` kept
(pgserver data in DIR/pgdata). For each of the first `--channels` channels it builds a
partial HNSW index on `messages_vec` (`WHERE channel_pk = N`, inner product, pgvector's
defaults m = 16, ef_construction = 64), then times `--queries` searches (query i on
channel i mod channels), each from a cold start (the local PostgreSQL restarted, the page
cache dropped, a new engine: root only), then warm (every query run once untimed, then
timed):
- the store's dense search (`MessageRepo.dense`: sign-bit scan of the channel, candidates
  re-scored by numpy), with the configured oversampling;
- the HNSW index at each `--ef` (`hnsw.ef_search` for the transaction), the 40 nearest
  rows by the index, their payloads re-scored by numpy.
recall@40 of each is against exact cosine (numpy over the channel's stored vectors).

Queries are random unit vectors, or with `--real-queries Q.npy` those vectors;
`--real-vectors V.npy` first writes the given vectors (float32 unit rows, one per message
of the first channel in id order; which message holds which vector does not change the
search) into that channel, e.g. MiniLM embeddings of the 100k stage's texts. The indexes
are dropped at the end unless `--keep-index`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from benchlib.host import drop_page_cache, host_info
from benchlib.pg import restart_local_server, start_pgserver, stop_local_server, with_database
from benchlib.stats import percentile
from benchmark_docs import commit
from psycopg import AsyncCursor

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.store.pg.message_vectors import vector_literal
from speakermem.memory.store.vectors import rescore

K = 40
OVERSAMPLE_FRACTION = 0.016  # SearchConfig.hybrid_oversample_fraction, as search passes it


def sql(url: str, statement: str, params: Any = ()) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def index_name(pk: int) -> str:
    return f"trial_hnsw_{int(pk)}"


def load_vectors(url: str, pk: int, vecs: np.ndarray) -> bool:
    """Write `vecs` as the channel's vectors (in id order) unless it holds them already."""
    ids = [
        r[0]
        for r in sql(
            url, "SELECT rowid FROM messages_vec WHERE channel_pk = %s ORDER BY rowid", (pk,)
        )
    ]
    if len(ids) != len(vecs):
        raise SystemExit(f"channel {pk} holds {len(ids)} vectors, the file {len(vecs)}")
    first = sql(url, "SELECT embedding FROM message_vectors WHERE id = %s", (ids[0],))
    if first and bytes(first[0][0]) == vecs[0].astype(np.float32).tobytes():
        return False
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(0, len(ids), 5000):
            chunk, rows = ids[start : start + 5000], vecs[start : start + 5000]
            with conn.transaction():
                conn.execute(
                    "UPDATE messages_vec e SET embedding = u.v::vector FROM"
                    " unnest(%s::bigint[], %s::text[]) AS u(id, v) WHERE e.rowid = u.id",
                    (chunk, [vector_literal(v) for v in rows]),
                )
                conn.execute(
                    "UPDATE message_vectors m SET embedding = u.b FROM"
                    " unnest(%s::bigint[], %s::bytea[]) AS u(id, b) WHERE m.id = u.id",
                    (chunk, [v.astype(np.float32).tobytes() for v in rows]),
                )
        for table in ("messages_vec", "messages_bits", "message_vectors"):
            conn.execute(f"VACUUM (ANALYZE) {table}")  # type: ignore[arg-type]
    return True


async def hnsw_search(
    eng: MemoryEngine, pk: int, q: np.ndarray, ef: int
) -> list[tuple[int, float]]:
    async with eng.store.db.reader() as conn, conn.transaction(), AsyncCursor(conn) as cur:
        await cur.execute(f"SET LOCAL hnsw.ef_search = {int(ef)}")  # type: ignore[arg-type]
        await cur.execute(
            "SELECT v.id, v.embedding FROM message_vectors v WHERE v.id = ANY(ARRAY("  # type: ignore[arg-type]
            f"SELECT rowid FROM messages_vec WHERE channel_pk = {int(pk)}"
            f" ORDER BY embedding <#> %s::vector LIMIT {K})) ORDER BY v.id",
            (vector_literal(q),),
            binary=True,
        )
        rows = await cur.fetchall()
    return rescore([(int(r[0]), bytes(r[1])) for r in rows], q, K)


async def timed(
    url: str, pks: list[int], qs: np.ndarray, exact: list[set[int]], ef: int | None, cold: bool
) -> dict[str, float]:
    ms: list[float] = []
    recall: list[float] = []
    eng: MemoryEngine | None = None
    cfg = MemoryConfig(store=StoreConfig(db_path=Path("unused.db"), db_url=url))
    # warm: every query once untimed first, so each channel's pages are in the caches
    work = list(enumerate(qs)) if cold else [*enumerate(qs), *enumerate(qs)]
    for n, (i, q) in enumerate(work):
        if cold or eng is None:
            if eng is not None:
                await eng.close()
            if cold:
                restart_local_server(url)
                drop_page_cache()
            eng = await MemoryEngine.open(cfg, None)
        pk = pks[i % len(pks)]
        t0 = time.perf_counter()
        if ef is None:
            got = await eng.store.messages.dense(
                q, [pk], K, cfg.store.dense_oversample, OVERSAMPLE_FRACTION
            )
        else:
            got = await hnsw_search(eng, pk, q, ef)
        if n >= len(work) - len(qs):
            ms.append((time.perf_counter() - t0) * 1000)
            recall.append(len(exact[i] & {g for g, _ in got}) / K)
    if eng is not None:
        await eng.close()
    return {
        "p50": round(percentile(ms, 50), 1),
        "p95": round(percentile(ms, 95), 1),
        "recall_at_40": round(float(np.mean(recall)), 3),
    }


async def trial(args: argparse.Namespace, url: str) -> dict[str, Any]:
    pks = [
        int(r[0])
        for r in sql(
            url,
            "SELECT DISTINCT channel_pk FROM messages_bits ORDER BY 1 LIMIT %s",
            (args.channels,),
        )
    ]
    loaded = load_vectors(url, pks[0], np.load(args.real_vectors)) if args.real_vectors else False
    build_s: list[float] = []
    for pk in pks:
        if not sql(url, "SELECT 1 FROM pg_class WHERE relname = %s", (index_name(pk),)):
            t0 = time.perf_counter()
            sql(
                url,
                f"CREATE INDEX {index_name(pk)} ON messages_vec"  # type: ignore[arg-type]
                f" USING hnsw (embedding vector_ip_ops) WHERE channel_pk = {pk}",
            )
            build_s.append(time.perf_counter() - t0)
    index_mb = sql(url, "SELECT pg_relation_size(%s::regclass)", (index_name(pks[0]),))[0][0] / 1e6
    if args.real_queries:
        real = np.load(args.real_queries)
        qs = real[np.linspace(0, len(real) - 1, args.queries).astype(int)]
    else:
        qs = np.random.default_rng(99).standard_normal((args.queries, 384))
    qs = np.ascontiguousarray(qs / np.linalg.norm(qs, axis=1, keepdims=True), dtype=np.float32)
    exact: list[set[int]] = [set() for _ in qs]
    sizes = []
    for j, pk in enumerate(pks):
        rows = sql(
            url,
            "SELECT v.id, v.embedding FROM message_vectors v JOIN messages_vec e"
            " ON e.rowid = v.id WHERE e.channel_pk = %s",
            (pk,),
        )
        ids = np.array([r[0] for r in rows])
        mat = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=np.float32)
        mat = mat.reshape(len(rows), -1)
        sizes.append(len(rows))
        for i in range(j, len(qs), len(pks)):
            exact[i] = set(ids[np.argsort(-(mat @ qs[i]))[:K]].tolist())
    methods: list[tuple[str, int | None]] = [("sign-bit scan (the store)", None)]
    methods += [(f"HNSW, ef_search {ef}", ef) for ef in args.ef]
    rows_out = []
    for label, ef in methods:
        c = await timed(url, pks, qs, exact, ef, cold=True)
        w = await timed(url, pks, qs, exact, ef, cold=False)
        rows_out.append({"method": label, "cold": c, "warm": w, "recall_at_40": c["recall_at_40"]})
        print(
            f"  {label}: cold p50 {c['p50']} / p95 {c['p95']} ms, warm p50 {w['p50']} /"
            f" p95 {w['p95']} ms, recall@40 {c['recall_at_40']}",
            flush=True,
        )
    if not args.keep_index:
        for pk in pks:
            sql(url, f"DROP INDEX IF EXISTS {index_name(pk)}")  # type: ignore[arg-type]
    host = host_info()
    return {
        "label": args.label,
        "command": shlex.join(["python", "bench/pg_dense_trial.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(short=True),
        "machine": f"{host['cpu']}, {host['cores']} cores, {host['ram_gb']} GB RAM",
        "database": args.db,
        "channels": len(pks),
        "channel_vectors": int(np.median(sizes)),
        "queries": len(qs),
        "vectors": "given (--real-vectors)" if args.real_vectors else "synthetic random unit",
        "vectors_written_now": loaded,
        "index_build_s_per_channel": round(float(np.mean(build_s)), 1) if build_s else None,
        "index_mb_per_channel": round(index_mb, 1),
        "rows": rows_out,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db-dir", required=True, help="bench_store.py's --db-dir (pgdata inside)")
    p.add_argument("--db", default="bench_scale_1m", help="the kept database")
    p.add_argument("--channels", type=int, default=12)
    p.add_argument("--queries", type=int, default=12)
    p.add_argument("--ef", type=lambda s: [int(x) for x in s.split(",")], default=[40, 100, 200])
    p.add_argument("--real-vectors", type=Path, default=None)
    p.add_argument("--real-queries", type=Path, default=None)
    p.add_argument("--keep-index", action="store_true")
    p.add_argument("--label", default="", help="what the trial's table calls this run")
    p.add_argument("--key", default="trial", help="its key under dense_index_trial in --doc")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--doc", type=Path, default=None, help="add it to FILE's dense_index_trial")
    args = p.parse_args()
    server = start_pgserver(args.db_dir)
    url = with_database(str(server.get_uri()), args.db)
    try:
        res = asyncio.run(trial(args, url))
    finally:
        stop_local_server(url)  # the server running now is the one the trial restarted
        server.cleanup()
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    if args.doc:
        doc = json.loads(args.doc.read_text()) if args.doc.exists() else {}
        doc.setdefault("dense_index_trial", {})[args.key] = res
        args.doc.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
