"""/recall: Project -> System 1 (Select/Expand/ASK) -> System 2 rows -> Compose -> Answer.

Every stage has a deterministic path, so the pipeline answers without an LLM; with one,
Project, Select, Sufficiency and Answer use it and fall back on any failure. Access
control happens first: only channels the asker may read are searched, and a private
channel's memory never answers in another channel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, Field

from memory.config import RecallConfig
from memory.context_budget import approx_tokens, endpoint_limits, prompt_budget, scaled_budgets
from memory.engine import MemoryEngine
from memory.interactions import interaction_names
from memory.models import RosterMember, Scope, StoredMessage
from memory.ports import LLM, ChatMessage, LLMError
from memory.query.answer import (
    ANSWER_PROMPT_VERSION,
    ANSWER_SYSTEM,
    ExtractiveReason,
    RecallAnswer,
    check_citations,
    citations_for,
    extractive_answer,
    render_answer_messages,
)
from memory.query.breadth import Breadth, question_breadth
from memory.query.claims import check_claims
from memory.query.compose import EvidencePack, compose
from memory.query.links import LinkResolver, default_link
from memory.query.projection import (
    PROJECT_PROMPT_VERSION,
    PROJECT_SCHEMA,
    Projection,
    fallback_projection,
    name_keys,
    projection_from_llm,
    render_project_messages,
)
from memory.query.rerank import RERANK_WEIGHTS, Candidate, rerank, term_weights
from memory.query.rerank import features as rerank_features
from memory.query.select import (
    SELECT_PROMPT_VERSION,
    SELECT_SCHEMA,
    SUFFICIENCY_PROMPT_VERSION,
    SUFFICIENCY_SCHEMA,
    parse_select,
    parse_sufficiency,
    render_select_messages,
    render_sufficiency_messages,
)
from memory.query.spread import spread_evidence
from memory.query.system1 import (
    RANKING_WEIGHTS,
    Rankings,
    context_ranking,
    dominant_session,
    expand_order,
    focus_ranking,
    fuse,
    linked_context,
    name_terms,
    recall_rankings,
    reply_slots,
    rerank_by_sessions,
    session_scores,
    session_term_counts,
)
from memory.query.system2 import Row, fill_rows, people_need_evidence, read_candidates
from memory.query.timewords import TimeWindow, resolve_time
from memory.roster_cache import derived, display_names
from memory.search.fts_query import query_terms
from memory.search.fusion import rrf

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 4_000
COMMON_WORD_MIN_SEEN = 3
COMMON_WORD_LOWER_SHARE = 0.5
PROMPT_VERSIONS = {
    "project": PROJECT_PROMPT_VERSION,
    "select": SELECT_PROMPT_VERSION,
    "sufficiency": SUFFICIENCY_PROMPT_VERSION,
    "answer": ANSWER_PROMPT_VERSION,
}
"""Recorded in every trace, so an evaluation says which prompts produced it."""


def channel_of_pk(
    messages: dict[int, StoredMessage], scopes: Sequence[Scope], pks: Sequence[int]
) -> dict[int, int]:
    """Message pk -> its channel pk (sessions are numbered per channel)."""
    by_scope = dict(zip(scopes, pks, strict=True))
    return {pk: by_scope.get(m.scope, 0) for pk, m in messages.items()}


ANSWER_FRAME_TOKENS = 32
"""The answer prompt's wrapper around the pack and the question (tags, the closing ask)."""


class AccessDenied(PermissionError):
    """The asker may not read the channel they asked in."""


@dataclass(frozen=True)
class RecallRequest:
    question: str
    scope: Scope
    asker: str | None = None
    """User id of the asker; None = operator (CLI without --as): the channel itself only."""
    readable: Sequence[Scope] | None = None
    """Channels the platform says the asker can read; None = derive from rosters."""
    answer_note: str | None = None
    """Shown to the answerer after the question, never searched (an evaluation's options)."""


class RecallTrace(BaseModel):
    """What happened, for --explain and evaluation."""

    projection: dict[str, Any]
    breadth: str = "one"
    """How much of the channel the question spans (memory.query.breadth)."""
    time_window: str | None = None
    channels: list[str] = Field(default_factory=list)
    rankings: dict[str, int] = Field(default_factory=dict)
    pool: list[str] = Field(default_factory=list)
    select: str = "fused"
    anchors: list[str] = Field(default_factory=list)
    ask: str | None = None
    s1_evidence: list[str] = Field(default_factory=list)
    s2_rows: dict[str, list[str]] = Field(default_factory=dict)
    s2_people: dict[str, Any] = Field(default_factory=dict)
    """Who got a row: how they were chosen, how many were considered and left out."""
    cut: list[str] = Field(default_factory=list)
    """What Compose left out or shortened to keep the pack within its budgets."""
    budgets: dict[str, Any] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict)
    latency_ms: dict[str, float] = Field(default_factory=dict)
    llm_errors: list[str] = Field(default_factory=list)
    claims: dict[str, int] = Field(default_factory=dict)
    """The LLM answer's claims: checked, dropped, rewritten (re-cited), abstained (0/1)."""
    dropped_claims: list[str] = Field(default_factory=list)


@dataclass
class RecallResult:
    answer: RecallAnswer
    pack: EvidencePack
    trace: RecallTrace
    rows: list[Row] = field(default_factory=list)


class Recaller(Protocol):
    """What answers /recall: `RecallPipeline` in this process, or the bot's recall
    processes (integrations.recall_processes) running one in each."""

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult: ...


class RecallPipeline:
    def __init__(
        self,
        engine: MemoryEngine,
        *,
        llm: LLM | None = None,
        config: RecallConfig | None = None,
        link: LinkResolver = default_link,
    ) -> None:
        self.engine = engine
        self.llm = llm
        self.cfg = config or engine.config.recall
        self.link = link

    # ---- access -------------------------------------------------------------------------

    async def allowed_scopes(self, req: RecallRequest) -> list[Scope]:
        """Channels this request may draw on; raises AccessDenied for an unreadable channel.

        A channel whose memory is off (`/memory channel off`) gives no answers: asked there,
        the request is refused; elsewhere, it is left out."""
        governance = self.engine.store.governance
        default_on = self.engine.config.governance.channel_default_enabled
        if not await governance.is_enabled(req.scope, default=default_on):
            raise AccessDenied(f"memory is off in {req.scope.channel}")
        if req.asker is None and req.readable is None:
            return [req.scope]
        if req.readable is not None:
            readable = list(req.readable)
        else:
            assert req.asker is not None
            readable = await self.engine.store.channels.readable_channels(
                req.scope.platform, req.scope.workspace, req.asker
            )
        if req.scope not in readable:
            raise AccessDenied(
                f"you cannot read {req.scope.channel}, so I cannot recall anything there"
            )
        if self.cfg.scope == "channel":
            return [req.scope]
        out = [req.scope]
        for scope in readable:
            if (
                scope != req.scope
                and scope.platform == req.scope.platform
                and scope.workspace == req.scope.workspace
                and not await self.engine.store.channels.is_private(scope)
                and await governance.is_enabled(scope, default=default_on)
            ):
                out.append(scope)
        return out

    # ---- stages -------------------------------------------------------------------------

    async def _llm_json(
        self,
        trace: RecallTrace,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        max_tokens: int = 512,
    ) -> dict[str, Any] | None:
        if self.llm is None:
            return None
        try:
            result = await self.llm.complete_json(
                [ChatMessage(**m) for m in messages],
                schema,
                schema_name=stage,
                max_tokens=max_tokens,
            )
        except LLMError as exc:
            trace.llm_errors.append(f"{stage}: {exc}")
            return None
        trace.tokens[f"{stage}_prompt"] = result.usage.prompt_tokens
        trace.tokens[f"{stage}_completion"] = result.usage.completion_tokens
        if result.data is None:
            trace.llm_errors.append(f"{stage}: {result.parse_error}")
        return result.data

    async def project(
        self,
        question: str,
        roster: list[RosterMember],
        trace: RecallTrace,
        pks: Sequence[int] = (),
    ) -> Projection:
        common = await self._common_words(question, roster, pks)
        if self.llm is not None:
            data = await self._llm_json(
                trace, "project", render_project_messages(question, roster), PROJECT_SCHEMA, 256
            )
            projected = projection_from_llm(data, question, roster, common=common)
            if projected is not None:
                return projected
        return fallback_projection(question, roster, common=common)

    async def _common_words(
        self, question: str, roster: list[RosterMember], pks: Sequence[int]
    ) -> frozenset[str]:
        """Roster names the question writes in lower case that the channel mostly writes in
        lower case too: ordinary words there ("man", "big"), not people."""
        out: set[str] = set()
        for key in name_keys(question, roster) if pks else []:
            seen, lower = await self.engine.store.messages.lowercase_share(key, pks)
            if seen >= COMMON_WORD_MIN_SEEN and lower >= COMMON_WORD_LOWER_SHARE:
                out.add(key)
        return frozenset(out)

    async def _select(
        self,
        question: str,
        fused: list[int],
        messages: dict[int, StoredMessage],
        trace: RecallTrace,
    ) -> tuple[list[int], list[int]]:
        """(ordered pks, anchor pks): the LLM's necessity ranking or the fused order."""
        if self.llm is not None and fused:
            cands = [messages[pk] for pk in fused if pk in messages]
            data = await self._llm_json(
                trace, "select", render_select_messages(question, cands), SELECT_SCHEMA
            )
            parsed = parse_select(data, len(cands))
            if parsed is not None:
                ranking, expand = parsed
                trace.select = "llm"
                order = [cands[i].pk for i in ranking]
                rest = [c.pk for c in cands if c.pk not in order]
                return order + rest, [cands[i].pk for i in expand][: self.cfg.expand_anchors]
            trace.select = "fused (llm reply unusable)"
        return fused, fused[: self.cfg.fallback_expand_anchors]

    async def system1(
        self,
        question: str,
        projection: Projection,
        scopes: list[Scope],
        pks: list[int],
        window: TimeWindow | None,
        trace: RecallTrace,
        names: frozenset[str] = frozenset(),
        display: dict[str, str] | None = None,
        breadth: Breadth = "one",
        vector_task: asyncio.Future[np.ndarray | None] | None = None,
    ) -> list[StoredMessage]:
        cfg = self.cfg
        # The evidence of a pattern, a change or everyone's view is spread over sessions
        # (memory.query.breadth): sessions still rank by how well they match, but none
        # draws the others' turns to it (no pool-share boost, no focus on one session).
        broad = breadth != "one"
        want_sessions = cfg.session_bm25_weight > 0 or cfg.focus_weight > 0
        counts_task = (
            asyncio.create_task(session_term_counts(self.engine, question, pks))
            if want_sessions
            else None
        )
        rankings = await recall_rankings(
            self.engine,
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
        weights = {**RANKING_WEIGHTS, "relation": cfg.relation_weight}
        fused = fuse(rankings, k0=cfg.rrf_k0, weights=weights)
        messages = await self.engine.store.messages.get_many([pk for pk, _ in fused])
        fused = [(pk, sc) for pk, sc in fused if pk in messages]
        channel_of = channel_of_pk(messages, scopes, pks)
        session_of = {pk: (channel_of[pk], m.session_id) for pk, m in messages.items()}
        bm25: dict[tuple[int, int], float] = {}
        counts: dict[str, dict[tuple[int, int], int]] = {}
        if counts_task is not None:
            counts = await counts_task
            bm25 = await session_scores(
                self.engine,
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
                bm25_weight=cfg.session_bm25_weight,
            )
        context: list[int] = []
        if cfg.context_anchors > 0 and cfg.context_weight > 0 and fused:
            fused, context = await self._with_context(fused, messages, channel_of)
        if not broad and cfg.focus_weight > 0 and fused:
            fused = await self._with_focus(fused, messages, channel_of, bm25)
        pool = [pk for pk, _ in fused][: cfg.pool]
        if cfg.rerank_depth > 0 and RERANK_WEIGHTS and pool:
            pool = self._rerank(
                question, projection, pool, rankings, messages, channel_of, bm25, context, counts
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
        order, anchors = await self._select(question, pool, messages, trace)
        if cfg.ask and self.llm is not None:
            top = [messages[pk] for pk in order[: cfg.top_k] if pk in messages]
            data = await self._llm_json(
                trace,
                "sufficiency",
                render_sufficiency_messages(question, top),
                SUFFICIENCY_SCHEMA,
                128,
            )
            term = parse_sufficiency(data)
            if term:
                trace.ask = term
                more = await recall_rankings(
                    self.engine,
                    f"{question} {term}",
                    projection,
                    pks,
                    pool=cfg.pool,
                    window=window,
                    extra_terms=[term],
                    name_terms=names,
                )
                merged = Rankings(
                    {"first": order, **{f"ask_{k}": v for k, v in more.lists.items()}}
                )
                order = [pk for pk, _ in fuse(merged, k0=cfg.rrf_k0, weights={"first": 2.0})][
                    : cfg.pool
                ]
                messages.update(await self.engine.store.messages.get_many(order))
                anchors = [pk for pk in anchors if pk in order]
        neighbours: dict[int, list[int]] = {}
        if cfg.expand_radius > 0:
            for pk in anchors:
                msg = messages.get(pk)
                if msg is None:
                    continue
                around = await self.engine.store.messages.neighbours(msg, cfg.expand_radius)
                for m in around:
                    messages.setdefault(m.pk, m)
                neighbours[pk] = [m.pk for m in around if m.pk != pk]
        ordered = [pk for pk in order if pk not in anchors]
        final = expand_order(
            anchors + ordered, neighbours, anchors=len(anchors), top_k=cfg.top_k + cfg.reply_slots
        )
        if cfg.reply_slots > 0 and final:
            linked = await self.engine.store.interactions.replies(final[: cfg.reply_slots])
            replies = {pk: [c for c, _ in kids] for pk, kids in linked.items()}
            firsts = [kids[0] for kids in replies.values() if kids]
            messages.update(await self.engine.store.messages.get_many(firsts))
            final = reply_slots(final, replies, slots=cfg.reply_slots, top_k=cfg.top_k)
        final = final[: cfg.top_k]
        trace.rankings = {name: len(lst) for name, lst in rankings.lists.items()}
        trace.pool = [messages[pk].message_id for pk in pool[:10] if pk in messages]
        trace.anchors = [messages[pk].message_id for pk in anchors if pk in messages]
        return [messages[pk] for pk in final if pk in messages]

    def _rerank(
        self,
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
        cfg = self.cfg
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
        named = [
            p for p in (*projection.speakers, *projection.candidates) if p not in ("GROUP", "ALL")
        ]
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

    async def _with_context(
        self,
        fused: list[tuple[int, float]],
        messages: dict[int, StoredMessage],
        channel_of: dict[int, int],
    ) -> tuple[list[tuple[int, float]], list[int]]:
        """Fuse in the neighbouring turns of the top picks (soft Expand); also returns
        those turns."""
        cfg = self.cfg
        if cfg.context_structure:
            return await self._with_linked_context(fused, messages)
        position: dict[int, tuple[int, int, int]] = {}
        at: dict[tuple[int, int, int], int] = {}
        for pk, _ in fused[: cfg.context_anchors]:
            msg = messages[pk]
            position[pk] = (channel_of[pk], msg.session_id, msg.turn_index)
            for m in await self.engine.store.messages.neighbours(msg, 1):
                messages.setdefault(m.pk, m)
                at[(channel_of[pk], m.session_id, m.turn_index)] = m.pk
        ctx = context_ranking(fused, position, at, anchors=cfg.context_anchors)
        if not ctx:
            return fused, []
        return (
            rrf([[pk for pk, _ in fused], ctx], k0=cfg.rrf_k0, weights=[1.0, cfg.context_weight]),
            ctx,
        )

    async def _with_linked_context(
        self, fused: list[tuple[int, float]], messages: dict[int, StoredMessage]
    ) -> tuple[list[tuple[int, float]], list[int]]:
        """Soft Expand along reply links: the replies and parent of each top pick join the
        fusion as one more ranking. Only tagged links and links to a person addressed by
        name count; a turn with neither uses the turns just after and before (links guessed
        from shared words or turn order measured worse than plain neighbours)."""
        cfg = self.cfg
        anchors = [pk for pk, _ in fused[: cfg.context_anchors]]
        store = self.engine.store
        strong = {"explicit", "addressed"}
        parents = {
            pk: p
            for pk, (p, how) in (await store.interactions.parents(anchors)).items()
            if how in strong
        }
        replies = {
            pk: kept
            for pk, kids in (await store.interactions.replies(anchors)).items()
            if (kept := [c for c, how in kids if how in strong])
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
        ctx = [pk for pk in ctx if pk in messages]
        if not ctx:
            return fused, []
        return (
            rrf([[pk for pk, _ in fused], ctx], k0=cfg.rrf_k0, weights=[1.0, cfg.context_weight]),
            ctx,
        )

    async def _with_focus(
        self,
        fused: list[tuple[int, float]],
        messages: dict[int, StoredMessage],
        channel_of: dict[int, int],
        session_bm25: dict[tuple[int, int], float],
    ) -> list[tuple[int, float]]:
        """Fuse in the turns of a clearly dominant session (by session BM25) as one more
        ranking: the right session known, most answers are within `focus_radius` turns of
        its best pick, but a wrong guess must not crowd the other sessions out."""
        cfg = self.cfg
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
        for m in await self.engine.store.messages.neighbours(best, cfg.focus_radius):
            messages.setdefault(m.pk, m)
            channel_of.setdefault(m.pk, dominant[0])
            members[m.pk] = m.turn_index
        focus = focus_ranking(fused, members)
        if not focus:
            return fused
        return rrf([[pk for pk, _ in fused], focus], k0=cfg.rrf_k0, weights=[1.0, cfg.focus_weight])

    # ---- the whole run ------------------------------------------------------------------

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        """One /recall. A member is waiting: background embedding and graph work give way
        while it runs (`MemoryEngine.foreground`)."""
        async with self.engine.foreground.serving():
            return await self._run(req, answer=answer)

    async def _run(self, req: RecallRequest, *, answer: bool) -> RecallResult:
        timings: dict[str, float] = {}

        @contextmanager
        def stage(name: str):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            yield
            timings[name] = round((time.perf_counter() - started) * 1000, 2)

        question = req.question.strip()[:MAX_QUESTION_CHARS]
        trace = RecallTrace(projection={})
        with stage("access"):
            scopes = await self.allowed_scopes(req)
            pairs = await self.engine.known_channels(scopes)
            known = [scope for scope, _ in pairs]
            pks = [pk for _, pk in pairs]
            roster: list[RosterMember] = []
            if len(scopes) == 1:  # the store's cached list itself (read only)
                roster = await self.engine.members(scopes[0])
            else:
                for scope in scopes:
                    roster.extend(await self.engine.members(scope))
        trace.channels = [str(s) for s in scopes]
        with stage("project"):
            projection = await self.project(question, roster, trace, pks)
            latest = await self.engine.store.messages.latest_ts(pks)
            anchor = datetime.fromtimestamp(latest, UTC) if latest else datetime.now(UTC)
            window = resolve_time(question, anchor)
        trace.projection = projection.model_dump()
        breadth = question_breadth(question, projection)
        trace.breadth = breadth
        trace.time_window = (
            None
            if window is None
            else f"{window.phrase}: {window.start:%Y-%m-%d} .. {window.end:%Y-%m-%d}"
        )
        # The question's embedding: System 1's dense rankings, then System 2's rows. System
        # 2 reads its candidates while System 1 ranks (unless System 1's evidence must choose
        # the people of a large ALL row) and chooses among them after it: each row prefers
        # records that add to the evidence (memory.query.system2).
        qvec = asyncio.ensure_future(self.engine.embed_query(question)) if pks else None
        early_s2 = (
            asyncio.create_task(
                read_candidates(self.engine, projection, roster, pks, self.cfg, query_vector=qvec)
            )
            if not people_need_evidence(projection, roster, self.cfg)
            else None
        )
        with stage("system1"):
            if self.cfg.interaction_catchup > 0 and pks and not self.engine.graph_in_background:
                index = interaction_names(roster)
                for pk in pks:
                    await self.engine.store.interactions.update(
                        pk, index, limit=self.cfg.interaction_catchup, wait=False
                    )
            terms = self._name_terms(roster)
            try:
                s1 = (
                    await self.system1(
                        question,
                        projection,
                        known,
                        pks,
                        window,
                        trace,
                        terms,
                        display_names(roster),
                        breadth,
                        qvec,
                    )
                    if pks
                    else []
                )
            except BaseException:
                for task in (early_s2, qvec):
                    if task is not None:
                        task.cancel()
                raise
        trace.s1_evidence = [m.message_id for m in s1]
        with stage("system2"):
            cands = (
                await early_s2
                if early_s2 is not None
                else await read_candidates(
                    self.engine, projection, roster, pks, self.cfg, query_vector=qvec, evidence=s1
                )
            )
            s2 = await fill_rows(self.engine, cands, projection, pks, self.cfg, evidence=s1)
            rows = s2.rows
            support = await self._support(rows)
        trace.s2_people = {
            "how": s2.people.how,
            "considered": s2.people.considered,
            "left_out": s2.people.left_out,
            "queries": s2.queries,
        }
        trace.s2_rows = {
            r.label: [rr.record.content[:80] for rr in r.records]
            or [f"(fallback) {m.message_id}" for m in r.fallback]
            or ["(none)"]
            for r in rows
        }
        s1_budget, s2_budget = await self._pack_budgets(question, answer)
        with stage("compose"):
            names = display_names(roster)
            pack = compose(
                question,
                projection.tense,
                s1,
                rows,
                support,
                names,
                s1_budget=s1_budget,
                s2_budget=s2_budget,
            )
        trace.tokens["pack"] = pack.tokens
        trace.cut = list(pack.cut)
        trace.budgets = {
            "pool": self.cfg.pool,
            "top_k": self.cfg.top_k,
            "expand_anchors": self.cfg.expand_anchors,
            "expand_radius": self.cfg.expand_radius,
            "ask": self.cfg.ask,
            "s2_k": self.cfg.s2_k,
            "s2_source_k": self.cfg.s2_source_k,
            "s2_max_people": self.cfg.s2_max_people,
            "scope": self.cfg.scope,
            "s1_pack_tokens": s1_budget,
            "s2_pack_tokens": s2_budget,
            "prompts": PROMPT_VERSIONS,
        }
        with stage("answer"):
            result = (
                await self._answer(pack, trace, req.answer_note)
                if answer
                else RecallAnswer(text="")
            )
        trace.latency_ms = timings
        return RecallResult(answer=result, pack=pack, trace=trace, rows=rows)

    @staticmethod
    def _name_terms(roster: list[RosterMember]) -> frozenset[str]:
        """The search terms of the roster's names (once per roster list, `derived`)."""
        return derived(
            roster,
            "name-terms",
            lambda r: name_terms(n for m in r for n in (m.display_name, *m.aliases)),
        )

    async def _support(self, rows: list[Row]) -> dict[str, StoredMessage]:
        wanted: dict[Scope, set[str]] = {}
        for row in rows:
            for rr in row.records:
                for node in rr.chain:
                    wanted.setdefault(node.scope, set()).update(node.from_ids)
        out: dict[str, StoredMessage] = {}
        for scope, ids in wanted.items():
            for mid, msg in (await self.engine.store.messages.by_ids(scope, sorted(ids))).items():
                out[f"{scope}|{mid}"] = msg
        return out

    async def _pack_budgets(self, question: str, answer: bool) -> tuple[int, int]:
        """The evidence pack's budgets, shrunk in proportion when the answer prompt would
        not fit the LLM's context (memory/context_budget.py)."""
        budgets = [self.cfg.s1_pack_tokens, self.cfg.s2_pack_tokens]
        if not answer or self.llm is None:
            return budgets[0], budgets[1]
        room = prompt_budget(await endpoint_limits(self.llm), self.cfg.answer_max_tokens)
        if room.input_tokens is not None:
            fixed = approx_tokens(ANSWER_SYSTEM) + approx_tokens(question) + ANSWER_FRAME_TOKENS
            budgets = scaled_budgets(budgets, room.input_tokens - fixed)
        return budgets[0], budgets[1]

    async def _answer(
        self, pack: EvidencePack, trace: RecallTrace, note: str | None = None
    ) -> RecallAnswer:
        text: str | None = None
        used_llm = False
        reason: ExtractiveReason | None = "no_llm" if self.llm is None else "llm_empty"
        if self.llm is not None:
            try:
                result = await self.llm.complete_text(
                    [ChatMessage(**m) for m in render_answer_messages(pack, note)],
                    max_tokens=self.cfg.answer_max_tokens,
                )
                trace.tokens["answer_prompt"] = result.usage.prompt_tokens
                trace.tokens["answer_completion"] = result.usage.completion_tokens
                if result.raw_text.strip():
                    text, used_llm, reason = result.raw_text.strip(), True, None
            except LLMError as exc:
                trace.llm_errors.append(f"answer: {exc}")
                reason = "llm_failed"
        if text is None:
            text = extractive_answer(pack)
        cleaned, used, stripped = check_citations(text, pack)
        if used_llm and not used and pack.excerpts:
            # an uncited LLM reply cannot be checked: fall back to the extractive one
            trace.llm_errors.append("answer: reply had no valid citations")
            cleaned, used, stripped2 = check_citations(extractive_answer(pack), pack)
            stripped += stripped2
            used_llm, reason = False, "uncited"
        if used_llm and self.cfg.check_claims:
            report = check_claims(cleaned, pack)
            trace.claims = {
                "checked": report.checked,
                "dropped": report.dropped,
                "rewritten": report.rewritten,
                "abstained": int(report.abstained),
            }
            trace.dropped_claims = [
                c.claim.text[:120] for c in report.claims if c.verdict == "dropped"
            ]
            cleaned, used, _ = check_citations(report.text, pack)
        citations = citations_for(pack, used)
        for c in citations:
            excerpt = pack.excerpt(c.n)
            c.link = self.link(c.scope, c.message_id, excerpt.thread_id if excerpt else None)
        return RecallAnswer(
            text=cleaned,
            citations=citations,
            used_llm=used_llm,
            stripped_citations=stripped,
            extractive_reason=reason,
        )
