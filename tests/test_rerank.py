"""The feature re-ranker over the head of the fused pool: its pure functions, and its place
in /recall (real SQLite store, real pipeline, no LLM)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import speakermem.memory.query.pool as pool_module
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.rerank import (
    FEATURES,
    RERANK_WEIGHTS,
    Candidate,
    features,
    rank_feature,
    rerank,
    term_weights,
)
from speakermem.memory.search.fts_query import query_terms
from tests.conftest import msg

pytestmark = pytest.mark.contract


def col(name: str) -> int:
    return FEATURES.index(name)


def cand(pk: int, text: str, speaker: str = "ann", session: int = 1, turn: int = 0) -> Candidate:
    return Candidate(
        pk=pk, terms=frozenset(query_terms(text)), speaker=speaker, session=session, turn=turn
    )


def test_rank_feature_decreases_with_rank_and_is_zero_when_absent() -> None:
    values = [rank_feature(r) for r in range(5)]
    assert values[0] == 1.0
    assert all(a > b > 0 for a, b in itertools.pairwise(values))
    assert rank_feature(None) == 0.0


def test_features_read_rankings_sessions_words_speakers_and_turns() -> None:
    cands = {
        1: cand(1, "the blue car is parked outside", "ann", session=1, turn=4),
        2: cand(2, "yes I saw it this morning", "bob", session=1, turn=5),
        3: cand(3, "blue skies over the harbour", "cid", session=2, turn=9),
    }
    x = features(
        [1, 2, 3],
        cands,
        rankings={"issue": [3, 1], "dense": [2]},
        dense_scores={2: 0.7},
        session_bm25={1: 4.0, 2: 1.0},
        dominant=1,
        context=[2],
        question_terms=["blue", "car", "parked"],
        named=["bob"],
        term_weights={"car": 1.0, "parked": 1.0, "blue": 0.5},
    )
    assert x.shape == (3, len(FEATURES))
    # fused position and each ranking's position
    assert x[0, col("fused")] > x[1, col("fused")] > x[2, col("fused")]
    assert x[2, col("rank_issue")] > x[0, col("rank_issue")] > 0 == x[1, col("rank_issue")]
    assert x[1, col("rank_dense")] == 1.0 and x[1, col("dense_cos")] == pytest.approx(0.7)
    # session strength relative to the best session, dominant session, context membership
    assert x[0, col("session_bm25")] == 1.0 and x[2, col("session_bm25")] == pytest.approx(0.25)
    assert list(x[:, col("dominant")]) == [1.0, 1.0, 0.0]
    assert list(x[:, col("context")]) == [0.0, 1.0, 0.0]
    # the question's words: plain share and the share weighted toward rare words
    assert x[0, col("overlap")] == pytest.approx(1.0)
    assert x[2, col("overlap")] == pytest.approx(1 / 3)
    assert x[2, col("overlap_rare")] == pytest.approx(0.5 / 2.5)
    assert x[0, col("length")] == pytest.approx(math.log1p(len(cands[1].terms)))
    assert list(x[:, col("named_speaker")]) == [0.0, 1.0, 0.0]
    # message 2 is the turn after message 1 (fused first): its previous turn is a candidate
    assert x[1, col("prev_turn")] == 1.0 and x[0, col("next_turn")] == rank_feature(1)
    assert x[2, col("prev_turn")] == 0.0
    assert x[1, col("near_top")] == pytest.approx(0.5) and x[2, col("near_top")] == 0.0
    assert x[0, col("session_share")] == pytest.approx(2 / 3)


def test_features_of_an_unknown_candidate_are_only_its_ranks() -> None:
    x = features(
        [7],
        {},
        rankings={"dense": [7]},
        dense_scores={},
        session_bm25={},
        dominant=None,
        context=[],
        question_terms=["x"],
        named=[],
    )
    nonzero = {FEATURES[i] for i in np.flatnonzero(x[0])}
    assert nonzero == {"fused", "rank_dense"}


def test_rerank_sorts_the_head_by_score_and_keeps_the_tail() -> None:
    m = np.zeros((4, len(FEATURES)))
    m[:, col("overlap")] = [0.1, 0.9, 0.5, 0.9]
    out = rerank([10, 11, 12, 13, 14, 15], m, {"overlap": 1.0}, depth=4)
    # ties (11 and 13) keep their fused order; 14 and 15 were never scored
    assert out == [11, 13, 12, 10, 14, 15]
    assert rerank([10, 11], m[:2], {}, depth=2) == [10, 11]
    assert rerank([], m[:0], {"overlap": 1.0}, depth=5) == []


def test_term_weights_favour_rare_terms_and_drop_fts_quotes() -> None:
    w = term_weights({'"harbour"': {(1, 1): 1}, '"blue"': {(1, 1): 30, (1, 2): 20}, '"x"': {}})
    assert set(w) == {"harbour", "blue"}
    assert w["harbour"] > w["blue"] > 0


def test_shipped_weights_name_only_known_features() -> None:
    assert RERANK_WEIGHTS and set(RERANK_WEIGHTS) <= set(FEATURES)


# ---- in the pipeline --------------------------------------------------------------------


async def test_pipeline_reorders_only_the_head_of_the_pool(
    engine: MemoryEngine, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a weight on message length only, the re-ranked head comes out longest first,
    the rest of the pool in its fused order; depth 0 leaves the fused order."""
    texts = [
        "garden hose",
        "the garden hose is leaking near the shed again today",
        "garden party on sunday",
        "who left the garden gate open last night, the dog got out",
        "garden",
        "new seeds for the garden beds arrived this morning from the shop",
    ]
    await engine.ingest_many(
        [msg(scope, f"m{i}", "Ann" if i % 2 else "Bob", t, i) for i, t in enumerate(texts)]
    )
    await engine.embed_pending()
    request = RecallRequest(question="anything about the garden?", scope=scope)
    base = RecallPipeline(
        engine, config=engine.config.recall.model_copy(update={"rerank_depth": 0})
    )
    fused = (await base.run(request, answer=False)).trace.s1_evidence
    assert len(fused) == len(texts)

    monkeypatch.setattr(pool_module, "RERANK_WEIGHTS", {"length": 1.0})
    depth = 4
    cfg = engine.config.recall.model_copy(update={"rerank_depth": depth})
    got = (await RecallPipeline(engine, config=cfg).run(request, answer=False)).trace.s1_evidence
    size = {f"m{i}": len(query_terms(t)) for i, t in enumerate(texts)}
    head = fused[:depth]
    expected = sorted(head, key=lambda mid: (-size[mid], head.index(mid))) + fused[depth:]
    assert got == expected
    assert got != fused
