"""System 1's candidate pool (SPEC §5.2): the rankings fused, re-ranked, and spread.

The rankings of `memory.query.system1` are fused by reciprocal rank; then, each stage on
when its setting gives it weight: the session signals (`rerank_by_sessions`), the turns
around the top picks (soft Expand, along reply links with `context_structure`), the turns
of a clearly dominant session (focus), the feature re-ranker over the pool's head
(`memory.query.rerank`), and the spread of a broad question's evidence over sessions or
speakers (`memory.query.spread`). The rules are pure functions in those modules; this
module fetches what they need from the store and applies them in order. Select, ASK and
Expand then work on the pool (`memory.query.select_expand`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope, StoredMessage
from speakermem.memory.query.breadth import Breadth
from speakermem.memory.query.people_rank import PeopleCandidate, name_terms_by_person, people_order
from speakermem.memory.query.projection import Projection
from speakermem.memory.query.rerank import RERANK_WEIGHTS, Candidate, rerank, term_weights
from speakermem.memory.query.rerank import features as rerank_features
from speakermem.memory.query.spread import spread_evidence
from speakermem.memory.query.system1 import (
    RANKING_WEIGHTS,
    Rankings,
    context_ranking,
    dominant_session,
    focus_ranking,
    fuse,
    linked_context,
    recall_rankings,
    rerank_by_sessions,
    session_scores,
    session_term_counts,
)
from speakermem.memory.query.timewords import TimeWindow
from speakermem.memory.search.fts_query import build_match, query_terms
from speakermem.memory.search.fusion import rrf

LEXICAL_RANKINGS = ("issue", "phrase", "speaker", "time")
"""The word rankings `broad_lexical_weight` scales for a broad question."""

PEOPLE_POOL_FACTOR = 5
"""The named people's own messages a people question scores: this many times the pool."""

STRONG_LINKS = frozenset({"explicit", "addressed"})
"""Reply links soft Expand follows: tagged ones and those to a person addressed by name."""


@dataclass
class Pool:
    """System 1's candidate pool, best first, with what Select and the trace need."""

    pks: list[int]
    messages: dict[int, StoredMessage]
    """Every message fetched so far, by pk (Select, ASK and Expand add to it)."""
    rankings: Rankings


def channel_of_pk(
    messages: dict[int, StoredMessage], scopes: Sequence[Scope], pks: Sequence[int]
) -> dict[int, int]:
    """Message pk -> its channel pk (sessions are numbered per channel)."""
    by_scope = dict(zip(scopes, pks, strict=True))
    return {pk: by_scope.get(m.scope, 0) for pk, m in messages.items()}


async def candidate_pool(
    engine: MemoryEngine,
    cfg: RecallConfig,
    question: str,
    projection: Projection,
    scopes: list[Scope],
    pks: list[int],
    window: TimeWindow | None,
    *,
    names: frozenset[str],
    display: dict[str, str] | None,
    breadth: Breadth,
    vector_task: asyncio.Future[np.ndarray | None] | None,
) -> Pool:
    """The ranked pool of the question's candidates in the channels `pks` (of `scopes`)."""
    # The evidence of a pattern, a change or everyone's view is spread over sessions
    # (memory.query.breadth): sessions still rank by how well they match, but none
    # draws the others' turns to it (no pool-share boost, no focus on one session).
    broad = breadth != "one"
    want_sessions = cfg.session_bm25_weight > 0 or cfg.focus_weight > 0
    counts_task = (
        asyncio.create_task(session_term_counts(engine, question, pks)) if want_sessions else None
    )
    rankings = await recall_rankings(
        engine,
        question,
        projection,
        pks,
        pool=cfg.pool,
        window=window,
        name_terms=names,
        display_names=display,
        speaker_dense=cfg.speaker_dense,
        speaker_dense_max=cfg.speaker_dense_max_messages,
        relation=cfg.relation_weight > 0,
        relation_max=cfg.relation_max_messages,
        speaker_candidates=cfg.speaker_candidates,
        pair=broad,
        vector_task=vector_task,
    )
    named = [p for p in projection.speakers if p not in ("GROUP", "ALL")]
    if cfg.people_rank and breadth in ("person", "change") and named and vector_task:
        vector = await vector_task
        if vector is not None:
            if counts_task is not None:
                counts_task.cancel()  # the people model reads no session scores
            return await _people_pool(engine, cfg, rankings, pks, named, display, vector)
    weights = {**RANKING_WEIGHTS, "relation": cfg.relation_weight}
    if broad:
        for name in LEXICAL_RANKINGS:
            weights[name] *= cfg.broad_lexical_weight
    fused = fuse(rankings, k0=cfg.rrf_k0, weights=weights)
    messages = await engine.store.messages.get_many([pk for pk, _ in fused])
    fused = [(pk, sc) for pk, sc in fused if pk in messages]
    channel_of = channel_of_pk(messages, scopes, pks)
    session_of = {pk: (channel_of[pk], m.session_id) for pk, m in messages.items()}
    bm25: dict[tuple[int, int], float] = {}
    counts: dict[str, dict[tuple[int, int], int]] = {}
    if counts_task is not None:
        counts = await counts_task
        bm25 = await session_scores(
            engine,
            question,
            pks,
            sorted(set(session_of.values())),
            length_norm=cfg.session_length_norm,
            counts=counts,
        )
    if cfg.session_bm25_weight > 0 or cfg.session_aggregate_weight > 0:
        fused = rerank_by_sessions(
            fused,
            session_of,
            bm25=bm25 if cfg.session_bm25_weight > 0 else {},
            k0=cfg.rrf_k0,
            aggregate_top=cfg.session_aggregate_top,
            aggregate_weight=0.0 if broad else cfg.session_aggregate_weight,
            bm25_weight=cfg.session_bm25_weight * (cfg.broad_lexical_weight if broad else 1.0),
        )
    context: list[int] = []
    if cfg.context_anchors > 0 and cfg.context_weight > 0 and fused:
        fused, context = await _with_context(engine, cfg, fused, messages, channel_of)
    if not broad and cfg.focus_weight > 0 and fused:
        fused = await _with_focus(engine, cfg, fused, messages, channel_of, bm25)
    pool = [pk for pk, _ in fused][: cfg.pool]
    if cfg.rerank_depth > 0 and RERANK_WEIGHTS and pool:
        pool = _rerank(
            cfg, question, projection, pool, rankings, messages, channel_of, bm25, context, counts
        )
    pool = spread_evidence(
        pool,
        messages,
        channel_of,
        breadth,
        session_cap=cfg.broad_session_cap,
        speaker_cap=cfg.group_speaker_cap,
        top_k=cfg.top_k,
    )
    return Pool(pool, messages, rankings)


async def _people_pool(
    engine: MemoryEngine,
    cfg: RecallConfig,
    rankings: Rankings,
    pks: list[int],
    named: list[str],
    display: dict[str, str] | None,
    vector: np.ndarray,
) -> Pool:
    """A pattern, relationship or change of named people (`memory.query.people_rank`):
    their own messages, the messages naming them and the channel's dense top, ranked by
    the fitted people model."""
    store = engine.store.messages
    names = {p: [(display or {}).get(p, p)] for p in named}
    terms = name_terms_by_person(names)
    mention_terms = sorted({t for ts in terms.values() for t in ts})
    own, mentions = await asyncio.gather(
        store.speaker_dense(
            vector,
            pks,
            named,
            cfg.pool * PEOPLE_POOL_FACTOR,
            max_messages=cfg.speaker_dense_max_messages,
        ),
        store.lexical(
            build_match(" ".join(mention_terms), text_only=frozenset(mention_terms)),
            pks,
            cfg.pool,
        )
        if mention_terms
        else _no_hits(),
    )
    ordered = dict.fromkeys(
        [
            *(pk for pk, _ in own),
            *rankings.lists.get("speaker", []),
            *(pk for pk, _ in mentions),
            *rankings.lists.get("dense", []),
        ]
    )
    cand_pks = list(ordered)
    messages, vectors = await asyncio.gather(store.get_many(cand_pks), store.vectors(cand_pks))
    q = np.asarray(vector, dtype=np.float32).reshape(-1)
    cands = [
        PeopleCandidate(
            pk=pk,
            speaker=m.speaker_id,
            text=m.text,
            addressees=m.addressees,
            similarity=float(vectors[pk] @ q) if pk in vectors else 0.0,
        )
        for pk in cand_pks
        if (m := messages.get(pk)) is not None
    ]
    order = people_order(cands, named, terms)
    return Pool(order[: cfg.pool], messages, rankings)


async def _no_hits() -> list[tuple[int, float]]:
    return []


def _rerank(
    cfg: RecallConfig,
    question: str,
    projection: Projection,
    pool: list[int],
    rankings: Rankings,
    messages: dict[int, StoredMessage],
    channel_of: dict[int, int],
    bm25: dict[tuple[int, int], float],
    context: list[int],
    counts: dict[str, dict[tuple[int, int], int]],
) -> list[int]:
    """The head of the pool re-ordered by the fitted feature re-ranker."""
    head = pool[: cfg.rerank_depth]
    candidates = {
        pk: Candidate(
            pk=pk,
            terms=frozenset(query_terms(m.text)),
            speaker=m.speaker_id,
            session=(channel_of.get(pk, 0), m.session_id),
            turn=m.turn_index,
        )
        for pk in head
        if (m := messages.get(pk)) is not None
    }
    named = [p for p in (*projection.speakers, *projection.candidates) if p not in ("GROUP", "ALL")]
    matrix = rerank_features(
        head,
        candidates,
        rankings=rankings.lists,
        dense_scores=rankings.scores.get("dense", {}),
        session_bm25=bm25,
        dominant=dominant_session(bm25, margin=cfg.focus_margin),
        context=context,
        question_terms=query_terms(question),
        named=named,
        term_weights=term_weights(counts),
    )
    return rerank(pool, matrix, RERANK_WEIGHTS, depth=cfg.rerank_depth)


def _fuse_context(
    cfg: RecallConfig, fused: list[tuple[int, float]], ctx: list[int]
) -> tuple[list[tuple[int, float]], list[int]]:
    """The pool with the context turns fused in as one more ranking (weight `context_weight`),
    and those turns; none found leaves the pool as it is."""
    if not ctx:
        return fused, []
    return (
        rrf([[pk for pk, _ in fused], ctx], k0=cfg.rrf_k0, weights=[1.0, cfg.context_weight]),
        ctx,
    )


async def _with_context(
    engine: MemoryEngine,
    cfg: RecallConfig,
    fused: list[tuple[int, float]],
    messages: dict[int, StoredMessage],
    channel_of: dict[int, int],
) -> tuple[list[tuple[int, float]], list[int]]:
    """Fuse in the neighbouring turns of the top picks (soft Expand); also returns
    those turns."""
    if cfg.context_structure:
        return await _with_linked_context(engine, cfg, fused, messages)
    position: dict[int, tuple[int, int, int]] = {}
    at: dict[tuple[int, int, int], int] = {}
    for pk, _ in fused[: cfg.context_anchors]:
        msg = messages[pk]
        position[pk] = (channel_of[pk], msg.session_id, msg.turn_index)
        for m in await engine.store.messages.neighbours(msg, 1):
            messages.setdefault(m.pk, m)
            at[(channel_of[pk], m.session_id, m.turn_index)] = m.pk
    return _fuse_context(
        cfg, fused, context_ranking(fused, position, at, anchors=cfg.context_anchors)
    )


async def _with_linked_context(
    engine: MemoryEngine,
    cfg: RecallConfig,
    fused: list[tuple[int, float]],
    messages: dict[int, StoredMessage],
) -> tuple[list[tuple[int, float]], list[int]]:
    """Soft Expand along reply links: the replies and parent of each top pick join the
    fusion as one more ranking. Only tagged links and links to a person addressed by
    name count; a turn with neither uses the turns just after and before (links guessed
    from shared words or turn order measured worse than plain neighbours)."""
    anchors = [pk for pk, _ in fused[: cfg.context_anchors]]
    store = engine.store
    parents = {
        pk: p
        for pk, (p, how) in (await store.interactions.parents(anchors)).items()
        if how in STRONG_LINKS
    }
    replies = {
        pk: kept
        for pk, kids in (await store.interactions.replies(anchors)).items()
        if (kept := [c for c, how in kids if how in STRONG_LINKS])
    }
    around: dict[int, tuple[int | None, int | None]] = {}
    for pk in anchors:
        if pk in parents or pk in replies:
            continue
        msg = messages[pk]
        near = {m.turn_index: m for m in await store.messages.neighbours(msg, 1)}
        for m in near.values():
            messages.setdefault(m.pk, m)
        nxt, prev = near.get(msg.turn_index + 1), near.get(msg.turn_index - 1)
        around[pk] = (nxt.pk if nxt else None, prev.pk if prev else None)
    ctx = linked_context(anchors, parents, replies, around)
    missing = [pk for pk in ctx if pk not in messages]
    if missing:
        messages.update(await store.messages.get_many(missing))
    return _fuse_context(cfg, fused, [pk for pk in ctx if pk in messages])


async def _with_focus(
    engine: MemoryEngine,
    cfg: RecallConfig,
    fused: list[tuple[int, float]],
    messages: dict[int, StoredMessage],
    channel_of: dict[int, int],
    session_bm25: dict[tuple[int, int], float],
) -> list[tuple[int, float]]:
    """Fuse in the turns of a clearly dominant session (by session BM25) as one more
    ranking: the right session known, most answers are within `focus_radius` turns of
    its best pick, but a wrong guess must not crowd the other sessions out."""
    dominant = dominant_session(session_bm25, margin=cfg.focus_margin)
    if dominant is None:
        return fused
    best = next(
        (
            messages[pk]
            for pk, _ in fused
            if pk in messages and (channel_of.get(pk), messages[pk].session_id) == dominant
        ),
        None,
    )
    if best is None:
        return fused
    members: dict[int, int] = {}
    for m in await engine.store.messages.neighbours(best, cfg.focus_radius):
        messages.setdefault(m.pk, m)
        channel_of.setdefault(m.pk, dominant[0])
        members[m.pk] = m.turn_index
    focus = focus_ranking(fused, members)
    if not focus:
        return fused
    return rrf([[pk for pk, _ in fused], focus], k0=cfg.rrf_k0, weights=[1.0, cfg.focus_weight])
