"""Dense search on PostgreSQL: recall@k against exact search.

The sign-bit scan picks each channel's candidates and numpy re-scores them; with the
store's configured oversampling it must find what exact cosine (numpy over the stored
payloads) finds, on a seeded set of clustered vectors (real embeddings cluster by topic;
uniform random vectors have no neighbours worth the name), and the similarities it returns
must be the exact ones. A per-channel HNSW index was measured against this scan on a cold
cache and kept out (docs/benchmarks/postgresql.md, "Dense index").

Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg

BIG = Scope(platform="test", workspace="w1", channel="big")
DIM = 384
K = 10


LATENT = 24
BASIS = np.random.default_rng(5).standard_normal((LATENT, DIM)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, centers: int = 40) -> np.ndarray:
    """`n` unit vectors around `centers` topics in a LATENT-dimensional subspace, plus a
    little noise in every dimension: the shape of sentence embeddings, whose neighbours
    are far closer than the rest (uniform random vectors in 384 dimensions are all about
    equally far apart)."""
    c = rng.standard_normal((centers, LATENT))
    z = c[rng.integers(0, centers, n)] + 0.5 * rng.standard_normal((n, LATENT))
    v = z @ BASIS + 1.0 * rng.standard_normal((n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


async def build(tmp_path: Path, url: str, sizes: dict[Scope, int]) -> MemoryEngine:
    """An engine whose channels hold `sizes` messages, each with a seeded vector."""
    eng = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db", db_url=url)), None
    )
    events = [
        msg(scope, f"{scope.channel}{i}", f"s{i % 5}", f"message {i}", i)
        for scope, n in sizes.items()
        for i in range(n)
    ]
    await eng.ingest_many(events)
    items = await eng.store.messages.pending_embeddings(len(events) + 1)
    vectors = clustered(np.random.default_rng(7), len(items))
    for start in range(0, len(items), 500):
        await eng.store.messages.store_vectors(
            items[start : start + 500], vectors[start : start + 500]
        )
    return eng


async def payloads(eng: MemoryEngine, pk: int) -> tuple[np.ndarray, np.ndarray]:
    rows = await eng.store.db.read(
        "SELECT m.id, v.embedding FROM messages m JOIN message_vectors v ON v.id = m.id"
        " WHERE m.channel_pk = ? ORDER BY m.id",
        (pk,),
    )
    ids = np.array([r[0] for r in rows])
    return ids, np.stack([np.frombuffer(bytes(r[1]), dtype=np.float32) for r in rows])


def queries(mat: np.ndarray, n: int) -> np.ndarray:
    """Queries near stored vectors (a question about something that was said)."""
    rng = np.random.default_rng(11)
    q = mat[rng.integers(0, len(mat), n)] + 0.05 * rng.standard_normal((n, DIM))
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


async def recall_at_k(eng: MemoryEngine, pk: int, oversample: int) -> float:
    """Mean recall@K of `dense` over one channel against exact cosine; the similarities it
    returns must be the exact ones."""
    ids, mat = await payloads(eng, pk)
    hits = []
    for q in queries(mat, 40):
        sims = mat @ q
        exact = {int(ids[i]) for i in np.argsort(-sims)[:K]}
        got = await eng.store.messages.dense(q, [pk], K, oversample)
        assert len(got) == K
        by_id = dict(zip(ids.tolist(), sims.tolist(), strict=True))
        assert [s for _, s in got] == pytest.approx([by_id[g] for g, _ in got], abs=1e-5)
        hits.append(len(exact & {g for g, _ in got}) / K)
    return float(np.mean(hits))


async def test_the_sign_bit_scan_recalls_what_exact_search_finds(
    tmp_path: Path, pg_url: str
) -> None:
    eng = await build(tmp_path, pg_url, {BIG: 3_000})
    try:
        big = (await eng.channel_pks([BIG]))[0]
        # fewer candidates than rows (the coarse pass narrows), yet what exact search finds
        assert eng.config.store.dense_oversample < 3_000
        assert await recall_at_k(eng, big, eng.config.store.dense_oversample) >= 0.95
        # ... and the bits alone, one candidate per result, find less: the re-score matters
        assert await recall_at_k(eng, big, K) < 0.95
    finally:
        await eng.close()


async def recall_with(eng: MemoryEngine, pk: int, oversample: int, fraction: float) -> float:
    ids, mat = await payloads(eng, pk)
    hits = []
    for q in queries(mat, 40):
        exact = {int(ids[i]) for i in np.argsort(-(mat @ q))[:K]}
        got = await eng.store.messages.dense(q, [pk], K, oversample, fraction)
        hits.append(len(exact & {g for g, _ in got}) / K)
    return float(np.mean(hits))


async def test_a_share_of_a_large_channel_is_chosen_from_more_by_the_query(
    tmp_path: Path, pg_url: str
) -> None:
    """When `oversample_fraction` sets the candidates (search's share of a large channel),
    they are the best of COARSE_WIDEN times as many by the query's score against the bits:
    more of exact search's answers than the same number taken by Hamming distance alone."""
    eng = await build(tmp_path, pg_url, {BIG: 3_000})
    try:
        big = (await eng.channel_pks([BIG]))[0]
        keep = 15  # 0.005 of the channel, more than the fixed oversample below
        by_hamming = await recall_with(eng, big, keep, 0.0)
        widened = await recall_with(eng, big, K, keep / 3_000)
        assert widened >= by_hamming + 0.05, (widened, by_hamming)
    finally:
        await eng.close()
