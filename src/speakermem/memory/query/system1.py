"""System 1 path of /recall: the recall pool, its fusion, and session-aware re-ranking.

Recall fuses several rankings of the verbatim track by reciprocal rank: BM25 on the
issue, on the whole question (names included), on adjacent word pairs as phrases, on
the issue restricted to the people the question names, inside a resolved time window,
and dense similarity. Conversations answer questions in sessions, so the fused pool is
re-ranked with two session signals: how much of the pool's weight a session holds,
and a BM25 score of the whole session for the question's terms (a session matching
several terms in different messages beats one message matching one term, with
session length normalised as in BM25). When one session clearly dominates that score, its
other turns join the fusion as one more ranking ("focus"): the right session known, most
answers are within reach. The fusion and re-ranking rules are pure functions, tested
without a database.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Awaitable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeVar

import numpy as np

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.projection import Projection
from speakermem.memory.query.timewords import TimeWindow
from speakermem.memory.search.fts_query import build_match, query_terms, quote
from speakermem.memory.search.fusion import rrf

SessionKey = tuple[int, int]
"""(channel pk, session id)"""

RANKING_WEIGHTS: dict[str, float] = {
    "issue": 1.0,
    "phrase": 1.0,
    "speaker": 1.0,
    "speaker_dense": 1.0,
    "relation": 1.0,
    "time": 1.0,
    "dense": 1.0,
}
MAX_SESSION_TERMS = 12
K = TypeVar("K", bound=Hashable)


@dataclass
class Rankings:
    """Raw ranked lists of message pks (best first), by signal."""

    lists: dict[str, list[int]] = field(default_factory=dict)
    scores: dict[str, dict[int, float]] = field(default_factory=dict)
    """Raw scores by signal (kept for the re-ranker: the dense ranking's cosines)."""

    def add(self, name: str, pks: Sequence[int], scores: Sequence[float] | None = None) -> None:
        if pks:
            self.lists[name] = list(pks)
            if scores is not None:
                self.scores[name] = dict(zip(pks, scores, strict=True))


def fuse(
    rankings: Rankings, *, k0: int, weights: dict[str, float], depth: int | None = None
) -> list[tuple[int, float]]:
    """Weighted RRF over whatever rankings were produced (each cut to `depth`)."""
    names = list(rankings.lists)
    return rrf(
        [rankings.lists[n][:depth] for n in names],
        k0=k0,
        weights=[weights.get(n, 1.0) for n in names],
    )


def name_terms(names: Iterable[str]) -> frozenset[str]:
    """The search terms of people's display names and aliases."""
    return frozenset(t for name in names for t in query_terms(name))


def phrase_match(question: str) -> str:
    """Adjacent content-word pairs as FTS5 phrases ("count faster" OR "faster dana"); a CJK
    run gives its adjacent bigrams (a phrase of three characters), not its characters."""
    terms = query_terms(question, unigrams=False)
    return " OR ".join(quote(f"{a} {b}") for a, b in pairwise(terms))


def session_bm25(
    term_counts: dict[str, dict[K, int]],
    n_sessions: int,
    *,
    k1: float = 1.2,
    lengths: dict[K, int] | None = None,
    b: float = 0.0,
) -> dict[K, float]:
    """BM25 of whole sessions: term frequency = matching messages in the session.

    With `lengths` (messages per session) only those sessions are scored, and `b`
    normalises term frequency by session length against their mean, as in message
    BM25: a long session matches a name or common word in many messages by sheer size
    (measured: b=0.5 put the gold FriendsQA scene first 50% of the time instead of 44%).
    IDF always uses the channel-wide document frequency.
    """
    scores: dict[K, float] = defaultdict(float)
    n = max(n_sessions, 1)
    avg = sum(lengths.values()) / len(lengths) if lengths else 0.0
    for counts in term_counts.values():
        df = len(counts)
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for key, tf in counts.items():
            norm = 1.0
            if lengths is not None:
                size = lengths.get(key)
                if size is None:
                    continue
                if b > 0 and avg > 0:
                    norm = 1 - b + b * size / avg
            scores[key] += idf * tf * (k1 + 1) / (tf + k1 * norm)
    return dict(scores)


def dominant_session(scores: dict[K, float], *, margin: float) -> K | None:
    """The best-scoring session if it beats the runner-up by the factor `margin`, else None.

    Session identification is the bottleneck of recall (with the right session known,
    FriendsQA recall@10 is about 0.91 against 0.54 overall), but the top session is
    right only about half the time: committing slots to it pays only when it clearly
    dominates, so the gate is a ratio of scores (scale-free, unlike a difference).
    """
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    if not ranked or ranked[0][1] <= 0:
        return None
    if len(ranked) > 1 and ranked[1][1] > 0 and ranked[0][1] < margin * ranked[1][1]:
        return None
    return ranked[0][0]


def focus_ranking(fused: Sequence[tuple[int, float]], members: dict[int, int]) -> list[int]:
    """All turns of the dominant session, best fused first, the rest by turn distance
    from the session's best pick (answers sit near the matching turn).

    members: pk -> turn index of the session's messages (those fetched).
    """
    if not members:
        return []
    score = dict(fused)
    best = max(members, key=lambda pk: (score.get(pk, 0.0), -members[pk]))
    t0 = members[best]
    return sorted(members, key=lambda pk: (-score.get(pk, 0.0), abs(members[pk] - t0), members[pk]))


def rerank_by_sessions(
    fused: Sequence[tuple[int, float]],
    session_of: dict[int, K],
    *,
    bm25: dict[K, float],
    k0: int,
    aggregate_top: int,
    aggregate_weight: float,
    bm25_weight: float,
) -> list[tuple[int, float]]:
    """Fuse the pool's order with two session orders (pool weight held, session BM25)."""
    base = [pk for pk, _ in fused]
    lists: list[list[int]] = [base]
    weights: list[float] = [1.0]
    score = dict(fused)
    if aggregate_weight > 0:
        held: dict[K, float] = defaultdict(float)
        for pk, sc in fused[:aggregate_top]:
            held[session_of[pk]] += sc
        lists.append(sorted(base, key=lambda pk: (-held.get(session_of[pk], 0.0), -score[pk])))
        weights.append(aggregate_weight)
    if bm25_weight > 0 and bm25:
        lists.append(sorted(base, key=lambda pk: (-bm25.get(session_of[pk], 0.0), -score[pk])))
        weights.append(bm25_weight)
    if len(lists) == 1:
        return list(fused)
    return rrf(lists, k0=k0, weights=weights)


def context_ranking(
    fused: Sequence[tuple[int, float]],
    position: dict[int, tuple[int, int, int]],
    at: dict[tuple[int, int, int], int],
    *,
    anchors: int,
) -> list[int]:
    """The turn after, then the turn before, each of the top `anchors` picks.

    position: pk -> (channel pk, session, turn); at: the reverse map. Answers often sit
    in the reply to the message that matches the question.
    """
    out: list[int] = []
    for pk, _ in fused[:anchors]:
        where = position.get(pk)
        if where is None:
            continue
        channel, session, turn = where
        for delta in (1, -1):
            n = at.get((channel, session, turn + delta))
            if n is not None and n not in out:
                out.append(n)
    return out


def linked_context(
    anchors: Sequence[int],
    parents: dict[int, int],
    replies: dict[int, list[int]],
    around: dict[int, tuple[int | None, int | None]],
) -> list[int]:
    """The conversation around each anchor, by reply structure: its replies (earliest
    first), then the turn it answers; the turns just after and before when it has no
    links. In a many-party channel the answer to a message is often not the next turn.

    parents: pk -> parent pk; replies: pk -> reply pks; around: pk -> (next, previous).
    """
    out: list[int] = []
    for pk in anchors:
        linked = [*replies.get(pk, []), *([parents[pk]] if pk in parents else [])]
        if not linked:
            nxt, prev = around.get(pk, (None, None))
            linked = [n for n in (nxt, prev) if n is not None]
        for n in linked:
            if n != pk and n not in out:
                out.append(n)
    return out


def reply_slots(
    order: Sequence[int], replies: dict[int, list[int]], *, slots: int, top_k: int
) -> list[int]:
    """Evidence order where each of the first `slots` picks is followed by its first reply
    (moved up, or brought in ahead of the lowest picks), cut to `top_k`.

    The reply to a retrieved question is often the answer, but no ranking scores it: as
    one more fused ranking it cannot climb above about rank 20, so it gets a slot.
    """
    out = list(dict.fromkeys(order))
    for pk in list(out[:slots]):
        reply = next(iter(replies.get(pk, [])), None)
        if reply is None:
            continue
        at = out.index(pk)
        if reply in out[:top_k]:
            continue
        if reply in out:
            out.remove(reply)
        out.insert(at + 1, reply)
    return out[:top_k]


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
    for i, pk in enumerate(selected):
        if pk not in seen:
            seen.add(pk)
            out.append(pk)
        if i < anchors:
            for n in neighbours.get(pk, []):
                if n not in seen:
                    seen.add(n)
                    out.append(n)
    return out[:top_k]


async def recall_rankings(
    engine: MemoryEngine,
    question: str,
    projection: Projection,
    channel_pks: Sequence[int],
    *,
    pool: int,
    window: TimeWindow | None,
    extra_terms: list[str] | None = None,
    name_terms: Collection[str] = (),
    display_names: dict[str, str] | None = None,
    speaker_dense: str = "off",
    speaker_dense_max: int = 400,
    relation: bool = False,
    relation_max: int = 3_000,
    speaker_candidates: bool = False,
    pair: bool = False,
    vector_task: Awaitable[np.ndarray | None] | None = None,
) -> Rankings:
    """Every ranking of the pool, queried concurrently (each on its own reader connection).

    `name_terms` (words of roster names) match message text only in the word ranking;
    who spoke is the speaker ranking's job. `speaker_dense` ranks the named people's own
    messages by dense similarity ("fallback": only when their BM25 ranking is empty, as
    for a question with no word they used); `relation` ranks the messages the question's
    speaker addressed to its addressee, with the addressee's replies.
    """
    store = engine.store.messages
    if vector_task is None:
        vector_task = asyncio.ensure_future(engine.embed_query(question))
    issue_match = build_match(projection.issue, extra=extra_terms)
    people = [p for p in projection.speakers if p not in ("GROUP", "ALL")]
    if speaker_candidates:
        people += [p for p in projection.candidates if p not in people]
    # One BM25 ranking over the question's words, names matching message text only
    # (measured: better on both dev sets than separate issue and question rankings).
    words = build_match(question, text_only=name_terms, extra=extra_terms) or issue_match
    queries: dict[str, Awaitable[list[tuple[int, float]]]] = {
        "issue": store.lexical(words, channel_pks, pool),
    }
    phrases = phrase_match(question)
    if phrases:
        queries["phrase"] = store.lexical(phrases, channel_pks, pool)
    speaker_task = None
    if people and issue_match:
        speaker_task = asyncio.ensure_future(
            store.lexical(
                issue_match,
                channel_pks,
                pool,
                speakers=people,
                speaker_names=[
                    (display_names or {})[p] for p in people if p in (display_names or {})
                ],
            )
        )
        queries["speaker"] = speaker_task
    if people and speaker_dense != "off":
        queries["speaker_dense"] = _speaker_dense(
            engine,
            vector_task,
            speaker_task if speaker_dense == "fallback" else None,
            channel_pks,
            people,
            pool,
            speaker_dense_max,
        )
    if relation and projection.addressee:
        queries["relation"] = _relation(
            engine,
            vector_task,
            channel_pks,
            projection.addressee,
            people,
            pool,
            relation_max,
        )
    elif relation and pair and len(projection.speakers) == 2:
        queries["relation"] = _pair(
            engine, vector_task, channel_pks, projection.speakers, pool, relation_max
        )
    if window is not None:
        queries["time"] = store.lexical(
            issue_match or words,
            channel_pks,
            pool,
            since=window.start.timestamp(),
            until=window.end.timestamp(),
        )
    queries["dense"] = _dense(engine, vector_task, channel_pks, pool)
    results = await asyncio.gather(*queries.values())
    rankings = Rankings()
    for name, hits in zip(queries, results, strict=True):
        rankings.add(name, [pk for pk, _ in hits], [float(sc) for _, sc in hits])
    return rankings


async def _speaker_dense(
    engine: MemoryEngine,
    vector_task: Awaitable[np.ndarray | None],
    lexical: Awaitable[list[tuple[int, float]]] | None,
    channel_pks: Sequence[int],
    people: Sequence[str],
    pool: int,
    max_messages: int,
) -> list[tuple[int, float]]:
    if lexical is not None and await lexical:
        return []
    vector = await vector_task
    if vector is None:
        return []
    return await engine.store.messages.speaker_dense(
        vector, channel_pks, people, pool, max_messages=max_messages
    )


async def _relation(
    engine: MemoryEngine,
    vector_task: Awaitable[np.ndarray | None],
    channel_pks: Sequence[int],
    addressee: str,
    people: Sequence[str],
    pool: int,
    max_messages: int,
) -> list[tuple[int, float]]:
    vector = await vector_task
    if vector is None:
        return []
    return await engine.store.interactions.relation_dense(
        vector, channel_pks, addressee, people, pool, max_messages=max_messages
    )


async def _pair(
    engine: MemoryEngine,
    vector_task: Awaitable[np.ndarray | None],
    channel_pks: Sequence[int],
    people: Sequence[str],
    pool: int,
    max_messages: int,
) -> list[tuple[int, float]]:
    """What two people said to each other, both ways (their replies and the messages that
    address the other), by dense similarity: where their relationship shows."""
    vector = await vector_task
    if vector is None:
        return []
    a, b = people[0], people[1]
    found = await asyncio.gather(
        engine.store.interactions.relation_dense(
            vector, channel_pks, b, [a], pool, max_messages=max_messages
        ),
        engine.store.interactions.relation_dense(
            vector, channel_pks, a, [b], pool, max_messages=max_messages
        ),
    )
    best: dict[int, float] = {}
    for pk, score in (*found[0], *found[1]):
        best[pk] = max(score, best.get(pk, score))
    return sorted(best.items(), key=lambda kv: -kv[1])[:pool]


async def _dense(
    engine: MemoryEngine,
    vector_task: Awaitable[np.ndarray | None],
    channel_pks: Sequence[int],
    pool: int,
) -> list[tuple[int, float]]:
    vector = await vector_task
    if vector is None:
        return []
    return await engine.store.messages.dense(
        vector,
        channel_pks,
        pool,
        engine.config.store.dense_oversample,
        # /recall fuses the dense ranking with five others, so it keeps the fixed candidate
        # count: 1.6% of a 100k channel would cost ~25 ms for a little more dense recall
        engine.config.recall.dense_oversample_fraction,
    )


async def session_term_counts(
    engine: MemoryEngine, question: str, channel_pks: Sequence[int]
) -> dict[str, dict[SessionKey, int]]:
    """Per question term, matching messages per session (independent of the pool, so it
    can run while the rankings are queried)."""
    terms = query_terms(question)[:MAX_SESSION_TERMS]
    if not terms:
        return {}
    return await engine.store.messages.session_term_counts([quote(t) for t in terms], channel_pks)


async def session_scores(
    engine: MemoryEngine,
    question: str,
    channel_pks: Sequence[int],
    sessions: Sequence[SessionKey] | None = None,
    *,
    length_norm: float = 0.0,
    counts: dict[str, dict[SessionKey, int]] | None = None,
) -> dict[SessionKey, float]:
    """Session BM25 for the question's terms; with `sessions`, only those are scored
    (the pool's sessions: one cheap size lookup, then length normalisation `length_norm`).
    `counts` may come from `session_term_counts` started earlier."""
    if counts is None:
        counts = await session_term_counts(engine, question, channel_pks)
    if not counts:
        return {}
    store = engine.store.messages
    lengths = await store.session_sizes(list(sessions)) if sessions is not None else None
    return session_bm25(
        counts, await store.session_total(channel_pks), lengths=lengths, b=length_norm
    )
