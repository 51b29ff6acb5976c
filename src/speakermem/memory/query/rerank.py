"""A feature re-ranker over the head of the fused System 1 pool (no model, CPU only).

The fusion (reciprocal ranks of several rankings, then session and context signals) fixes
one order from ranks alone. The re-ranker scores each of the top `depth` candidates with a
linear model over features the pipeline already has: where each ranking put it, its dense
cosine, how strongly its session matches the question, whether it is in the dominant
session or in the reply structure around the top picks, how many of the question's words
(and of its rare words) it contains, its length, whether its speaker is a person the
question names, and whether the turns just before and after it are candidates too. The
weights are fitted offline (bench/quality/fit_rerank.py: a pairwise logistic loss over
each question's gold and other candidates, on tuning half A of the questions only) and
shipped as constants. Candidates below `depth` keep their fused order. It makes no store
query: a few dozen candidates, one dot product each.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RANKED_SIGNALS = ("issue", "phrase", "speaker", "relation", "time", "dense")
FEATURES: tuple[str, ...] = (
    "fused",
    *(f"rank_{n}" for n in RANKED_SIGNALS),
    "dense_cos",
    "session_bm25",
    "session_top",
    "dominant",
    "context",
    "overlap",
    "overlap_rare",
    "length",
    "named_speaker",
    "prev_turn",
    "next_turn",
    "near_top",
    "session_share",
)
"""Feature order of the weight vector."""

RANK_K0 = 10.0
"""Offset of the reciprocal-rank features: RANK_K0 / (RANK_K0 + rank)."""


@dataclass(frozen=True)
class Candidate:
    """What the re-ranker reads about one candidate message."""

    pk: int
    terms: frozenset[str]
    """The message's search terms (lower case)."""
    speaker: str
    session: Hashable
    turn: int


def rank_feature(rank: int | None) -> float:
    """RANK_K0 / (RANK_K0 + rank) for a 0-based rank (1 for the first); 0 when the ranking
    did not find it."""
    return 0.0 if rank is None else RANK_K0 / (RANK_K0 + rank)


def features(
    order: Sequence[int],
    candidates: Mapping[int, Candidate],
    *,
    rankings: Mapping[str, Sequence[int]],
    dense_scores: Mapping[int, float],
    session_bm25: Mapping[Any, float],
    dominant: Hashable | None,
    context: Collection[int],
    question_terms: Collection[str],
    named: Collection[str],
    term_weights: Mapping[str, float] | None = None,
) -> np.ndarray:
    """The (len(order), len(FEATURES)) feature matrix of the candidates in `order`.

    term_weights: question term -> weight of a rare term (see `term_weights`); terms
    without one count for nothing in `overlap_rare`."""
    positions = {name: {pk: i for i, pk in enumerate(lst)} for name, lst in rankings.items()}
    top_bm25 = max(session_bm25.values(), default=0.0)
    ranked_sessions = sorted(session_bm25, key=lambda s: -session_bm25[s])
    session_rank = {s: i for i, s in enumerate(ranked_sessions)}
    qterms = set(question_terms)
    named_set = set(named)
    ctx = set(context)
    at = {(c.session, c.turn): i for i, pk in enumerate(order) if (c := candidates.get(pk))}
    top = candidates.get(order[0]) if order else None
    share: dict[Hashable, int] = {}
    for pk in order:
        if (c := candidates.get(pk)) is not None:
            share[c.session] = share.get(c.session, 0) + 1
    out = np.zeros((len(order), len(FEATURES)), dtype=np.float64)
    for i, pk in enumerate(order):
        c = candidates.get(pk)
        row = [rank_feature(i)]
        row += [rank_feature(positions.get(n, {}).get(pk)) for n in RANKED_SIGNALS]
        row.append(float(dense_scores.get(pk, 0.0)))
        bm = session_bm25.get(c.session, 0.0) if c is not None else 0.0
        row.append(bm / top_bm25 if top_bm25 > 0 else 0.0)
        srank = session_rank.get(c.session) if c is not None else None
        row.append(rank_feature(srank))
        row.append(1.0 if c is not None and dominant is not None and c.session == dominant else 0.0)
        row.append(1.0 if pk in ctx else 0.0)
        if c is not None and qterms:
            row.append(len(qterms & c.terms) / len(qterms))
        else:
            row.append(0.0)
        total = sum((term_weights or {}).values())
        if c is not None and total > 0:
            row.append(sum(w for t, w in (term_weights or {}).items() if t in c.terms) / total)
        else:
            row.append(0.0)
        row.append(math.log1p(len(c.terms)) if c is not None else 0.0)
        row.append(1.0 if c is not None and c.speaker in named_set else 0.0)
        # the turns just before / after it among the candidates (a reply to a matching
        # turn often holds the answer), and its distance to the best pick's turn
        if c is not None:
            row.append(rank_feature(at.get((c.session, c.turn - 1))))
            row.append(rank_feature(at.get((c.session, c.turn + 1))))
            near = top is not None and top.session == c.session
            row.append(1.0 / (1.0 + abs(c.turn - top.turn)) if near and top else 0.0)
            row.append(share[c.session] / len(order))
        else:
            row += [0.0, 0.0, 0.0, 0.0]
        out[i] = row
    return out


def term_weights(counts: Mapping[str, Mapping[Any, int]]) -> dict[str, float]:
    """Question term -> 1 / log(2 + messages matching it), from the per-session match
    counts of the session scoring, keyed by FTS-quoted term (terms too common to be
    counted there get none)."""
    return {t.strip('"'): 1.0 / math.log(2 + sum(c.values())) for t, c in counts.items() if c}


def rerank(
    order: Sequence[int], matrix: np.ndarray, weights: Mapping[str, float], *, depth: int
) -> list[int]:
    """The first `depth` pks of `order` sorted by the linear score (ties keep their fused
    order), followed by the rest unchanged."""
    head = list(order[:depth])
    if not head:
        return list(order)
    w = np.array([weights.get(f, 0.0) for f in FEATURES], dtype=np.float64)
    scores = matrix[: len(head)] @ w
    ranked = sorted(range(len(head)), key=lambda i: (-scores[i], i))
    return [head[i] for i in ranked] + list(order[depth:])


RERANK_WEIGHTS: dict[str, float] = {
    "fused": 2.2602,
    "rank_issue": 0.2917,
    "rank_phrase": 0.5506,
    "rank_speaker": 0.1181,
    "rank_relation": 0.0,
    "rank_time": 3.2713,
    "rank_dense": 1.1898,
    "dense_cos": -0.7461,
    "session_bm25": 2.221,
    "session_top": -1.5612,
    "dominant": 0.7265,
    "context": 0.9914,
    "overlap": -0.208,
    "overlap_rare": 2.5212,
    "length": 0.9012,
    "named_speaker": 1.2054,
    "prev_turn": 0.9135,
    "next_turn": 0.4704,
    "near_top": -0.5165,
    "session_share": -0.5002,
}
"""Fitted on half A of the LoCoMo and FriendsQA dev questions (FriendsQA with and without
its session markers), pairwise logistic loss, L2 0.001, candidates = the top 40 of the
fused pool, the relation rank's weight held >= 0 (only about 30 questions of each set name
a speaker and an addressee, too few to fit it; unconstrained it came out negative):
`python bench/quality/fit_rerank.py fit ... --loss pairwise --l2 0.001 --nonneg rank_relation`."""
