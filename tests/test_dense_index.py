"""The coarse Hamming KNN over vec0's packed chunks matches a brute-force computation."""

from __future__ import annotations

import numpy as np
import pytest

from speakermem.memory.store.vectors import coarse_top_k, hamming_top_k, pack_chunks, quantize_bits


def chunk_rows(bits: np.ndarray, rowids: np.ndarray, live: np.ndarray, chunk: int) -> list:
    """Build (validity, rowids, vectors) rows the way vec0 lays out a partition."""
    rows = []
    for start in range(0, len(rowids), chunk):
        ids = np.zeros(chunk, dtype="<i8")
        vec = np.zeros((chunk, bits.shape[1]), dtype=np.uint8)
        ok = np.zeros(chunk, dtype=bool)
        n = min(chunk, len(rowids) - start)
        ids[:n] = rowids[start : start + n]
        vec[:n] = bits[start : start + n]
        ok[:n] = live[start : start + n]
        rows.append((np.packbits(ok, bitorder="little").tobytes(), ids.tobytes(), vec.tobytes()))
    return rows


@pytest.mark.parametrize("dim", [384, 100])  # 48 bytes (uint64 path) and 13 bytes (byte path)
def test_hamming_top_k_matches_brute_force(dim: int) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((1000, dim)).astype(np.float32)
    bits = np.frombuffer(b"".join(quantize_bits(vectors)), dtype=np.uint8).reshape(1000, -1)
    rowids = np.arange(10, 1010, dtype="<i8")
    live = rng.random(1000) > 0.1  # some deleted slots
    packed = pack_chunks(chunk_rows(bits, rowids, live, 64), bits.shape[1])
    assert packed is not None
    query = quantize_bits(rng.standard_normal((1, dim)).astype(np.float32))[0]
    q = np.frombuffer(query, dtype=np.uint8)
    dist = np.unpackbits(bits ^ q, axis=1).sum(axis=1)
    got = hamming_top_k(packed, query, 50)
    assert len(got) == 50 and all(live[r - 10] for r in got)
    got_d = [int(dist[r - 10]) for r in got]
    assert got_d == sorted(got_d)
    best = sorted(int(d) for d, ok in zip(dist, live, strict=True) if ok)[:50]
    assert got_d == best


def test_pack_chunks_rejects_unknown_layouts() -> None:
    assert pack_chunks([(b"\x01", b"\x00" * 8, b"\x00" * 7)], 48) is None
    empty = pack_chunks([], 48)
    assert empty is not None and hamming_top_k(empty, b"\x00" * 48, 5) == []


@pytest.mark.parametrize("dim", [384, 100])
def test_coarse_top_k_reranks_the_hamming_candidates_by_the_float_query(dim: int) -> None:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((1000, dim)).astype(np.float32)
    bits = np.frombuffer(b"".join(quantize_bits(vectors)), dtype=np.uint8).reshape(1000, -1)
    rowids = np.arange(10, 1010, dtype="<i8")
    live = rng.random(1000) > 0.1
    packed = pack_chunks(chunk_rows(bits, rowids, live, 64), bits.shape[1])
    assert packed is not None
    q = rng.standard_normal(dim).astype(np.float32)
    qbits = quantize_bits(q.reshape(1, -1))[0]
    wide = hamming_top_k(packed, qbits, 300)
    got = coarse_top_k(packed, qbits, q, 300, 60)
    # the asymmetric score: the query's components, each with its stored bit's sign
    signs = np.where(vectors > 0, 1.0, -1.0)
    score = {int(r): float(signs[r - 10] @ q) for r in wide}
    best = sorted(wide, key=lambda r: -score[r])[:60]
    assert len(got) == 60 and set(got) <= set(wide)
    assert got == best
    # keeping everything leaves the Hamming order alone
    assert coarse_top_k(packed, qbits, q, 300, 300) == wide
