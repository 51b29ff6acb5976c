"""System 1 path of /recall: recall a pool, Select, Expand, (ASK), top-k.

Recall fuses several rankings of the verbatim track by reciprocal rank: BM25 on the
issue, BM25 on the issue restricted to the people the question names (speaker-aware),
BM25 inside a resolved time window, and dense similarity to the whole question.
The fusion and selection rules are pure functions so they can be tested and tuned
without a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory.config import RecallConfig, SearchConfig
from memory.engine import MemoryEngine
from memory.models import StoredMessage
from memory.query.projection import Projection
from memory.query.timewords import TimeWindow
from memory.search.fts_query import build_match
from memory.search.fusion import rrf


@dataclass
class Rankings:
    """Raw ranked lists of message pks (best first), by signal."""

    lists: dict[str, list[int]] = field(default_factory=dict)

    def add(self, name: str, pks: Sequence[int]) -> None:
        if pks:
            self.lists[name] = list(pks)


RANKING_WEIGHTS: dict[str, float] = {
    "issue": 1.0,
    "question": 0.5,
    "speaker": 1.0,
    "time": 1.0,
    "dense": 1.0,
}


def fuse(rankings: Rankings, *, k0: int, weights: dict[str, float]) -> list[tuple[int, float]]:
    """Weighted RRF over whatever rankings were produced."""
    names = list(rankings.lists)
    return rrf(
        [rankings.lists[n] for n in names], k0=k0, weights=[weights.get(n, 1.0) for n in names]
    )


def expand_order(
    selected: Sequence[int],
    neighbours: dict[int, list[int]],
    *,
    anchors: int,
    top_k: int,
) -> list[int]:
    """Final evidence order: each of the first `anchors` picks followed by its neighbours,
    then the rest of the selection; de-duplicated and cut to `top_k`."""
    out: list[int] = []
    seen: set[int] = set()

    def push(pk: int) -> None:
        if pk not in seen:
            seen.add(pk)
            out.append(pk)

    for i, pk in enumerate(selected):
        push(pk)
        if i < anchors:
            for n in neighbours.get(pk, []):
                push(n)
    return out[:top_k]


@dataclass
class S1Result:
    evidence: list[StoredMessage]
    pool: list[tuple[int, float]]
    rankings: Rankings
    anchors: list[int]
    time_window: TimeWindow | None


async def recall_rankings(
    engine: MemoryEngine,
    question: str,
    projection: Projection,
    channel_pks: Sequence[int],
    *,
    pool: int,
    window: TimeWindow | None,
    extra_terms: list[str] | None = None,
) -> Rankings:
    store = engine.store.messages
    rankings = Rankings()
    issue_match = build_match(projection.issue, extra=extra_terms)
    question_match = build_match(question)
    rankings.add("issue", [pk for pk, _ in await store.lexical(issue_match, channel_pks, pool)])
    if question_match and question_match != issue_match:
        rankings.add(
            "question", [pk for pk, _ in await store.lexical(question_match, channel_pks, pool)]
        )
    people = [p for p in projection.speakers if p not in ("GROUP", "ALL")]
    if people and issue_match:
        rankings.add(
            "speaker",
            [pk for pk, _ in await store.lexical(issue_match, channel_pks, pool, speakers=people)],
        )
    if window is not None:
        rankings.add(
            "time",
            [
                pk
                for pk, _ in await store.lexical(
                    issue_match or question_match,
                    channel_pks,
                    pool,
                    since=window.start.timestamp(),
                    until=window.end.timestamp(),
                )
            ],
        )
    vector = await engine.embed_query(question)
    if vector is not None:
        dense = await store.dense(vector, channel_pks, pool, engine.config.store.dense_oversample)
        rankings.add("dense", [pk for pk, _ in dense])
    return rankings


async def system1(
    engine: MemoryEngine,
    question: str,
    projection: Projection,
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    search_cfg: SearchConfig,
    *,
    window: TimeWindow | None = None,
    weights: dict[str, float] | None = None,
) -> S1Result:
    """Recall n candidates, select (fused order), expand ≤ `expand_anchors`, cut to top-k."""
    rankings = await recall_rankings(
        engine, question, projection, channel_pks, pool=cfg.pool, window=window
    )
    fused = fuse(rankings, k0=search_cfg.rrf_k0, weights=weights or RANKING_WEIGHTS)[: cfg.pool]
    selected = [pk for pk, _ in fused]
    anchors = selected[: cfg.expand_anchors]
    messages = await engine.store.messages.get_many(selected)
    neighbours: dict[int, list[int]] = {}
    if cfg.expand_radius > 0:
        for pk in anchors:
            msg = messages.get(pk)
            if msg is None:
                continue
            around = await engine.store.messages.neighbours(msg, cfg.expand_radius)
            for m in around:
                messages.setdefault(m.pk, m)
            neighbours[pk] = [m.pk for m in around if m.pk != pk]
    final = expand_order(selected, neighbours, anchors=cfg.expand_anchors, top_k=cfg.top_k)
    return S1Result(
        evidence=[messages[pk] for pk in final if pk in messages],
        pool=fused,
        rankings=rankings,
        anchors=anchors,
        time_window=window,
    )
