"""/recall: Project -> System 1 (Select/Expand/ASK) -> System 2 rows -> Compose -> Answer.

Every stage has a deterministic path, so the pipeline answers without an LLM; with one,
Project, Select, Sufficiency and Answer use it and fall back on any failure. Access
control happens first: only channels the asker may read are searched, and a private
channel's memory never answers in another channel.

This module checks access, runs the stages in order and keeps the trace. The stages:
Project (`memory.query.projection`), System 1's pool (`memory.query.pool`) then Select,
ASK and Expand (`memory.query.select_expand`), System 2 (`memory.query.system2`), Compose
(`memory.query.compose`) and Answer (`memory.query.answering`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import numpy as np

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.identity import identities
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import RosterMember, Scope, StoredMessage
from speakermem.memory.ports import LLM
from speakermem.memory.query.answer import ANSWER_PROMPT_VERSION, RecallAnswer, ambiguity_note
from speakermem.memory.query.answering import answer_pack, pack_budgets
from speakermem.memory.query.breadth import Breadth, question_breadth
from speakermem.memory.query.compose import EvidencePack, compose
from speakermem.memory.query.links import LinkResolver, default_link
from speakermem.memory.query.pool import candidate_pool
from speakermem.memory.query.projection import (
    PROJECT_PROMPT_VERSION,
    PROJECT_SCHEMA,
    Projection,
    fallback_projection,
    name_keys,
    projection_from_llm,
    render_project_messages,
)
from speakermem.memory.query.select import SELECT_PROMPT_VERSION, SUFFICIENCY_PROMPT_VERSION
from speakermem.memory.query.select_expand import select_and_expand
from speakermem.memory.query.system1 import name_terms
from speakermem.memory.query.system2 import (
    Row,
    fill_rows,
    people_need_evidence,
    read_candidates,
    support_messages,
)
from speakermem.memory.query.thread_focus import newest_first, thread_first
from speakermem.memory.query.timewords import TimeWindow, resolve_time
from speakermem.memory.query.trace import RecallTrace, llm_json
from speakermem.memory.roster_cache import derived, display_names

log = logging.getLogger(__name__)

COMMON_WORD_MIN_SEEN = 3
COMMON_WORD_LOWER_SHARE = 0.5
PROMPT_VERSIONS = {
    "project": PROJECT_PROMPT_VERSION,
    "select": SELECT_PROMPT_VERSION,
    "sufficiency": SUFFICIENCY_PROMPT_VERSION,
    "answer": ANSWER_PROMPT_VERSION,
}
"""Recorded in every trace, so an evaluation says which prompts produced it."""


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
    thread: str | None = None
    """Asked in this thread of `scope` (its id): the thread's messages come first."""
    asked_in: str | None = None
    """The id of the message in `scope` that asked (a mention is stored like any message):
    never its own evidence."""
    direct: bool = False
    """Asked in a direct message to the bot: only the asker sees the answer, so it draws on
    every channel in `readable` (or the asker's rosters in `scope`'s workspace) where memory
    is on, private ones included, whatever `recall.scope` says; `scope` itself is not
    searched unless it is one of them."""
    locale: str | None = None
    """The asker's platform locale ("zh-CN", "ja"): the extractive answer's language."""


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
        if req.direct:
            return await self._direct_scopes(req)
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

    async def _direct_scopes(self, req: RecallRequest) -> list[Scope]:
        """A direct message's channels: every readable one whose memory is on (fail closed:
        no asker, or nothing readable, is a refusal)."""
        if req.asker is None:
            raise AccessDenied("a direct question needs an asker")
        readable = (
            list(req.readable)
            if req.readable is not None
            else await self.engine.store.channels.readable_channels(
                req.scope.platform, req.scope.workspace, req.asker
            )
        )
        governance = self.engine.store.governance
        default_on = self.engine.config.governance.channel_default_enabled
        out = [
            scope
            for scope in dict.fromkeys(readable)
            if await governance.is_enabled(scope, default=default_on)
        ]
        if not out:
            raise AccessDenied("I remember no channel you can read")
        return out

    # ---- stages -------------------------------------------------------------------------

    async def project(
        self,
        question: str,
        roster: list[RosterMember],
        trace: RecallTrace,
        pks: Sequence[int] = (),
    ) -> Projection:
        common = await self._common_words(question, roster, pks)
        if self.llm is not None:
            data = await llm_json(
                self.llm,
                trace,
                "project",
                render_project_messages(question, roster),
                PROJECT_SCHEMA,
                256,
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
        thread: tuple[Scope, str] | None = None,
        asked_in: tuple[Scope, str] | None = None,
    ) -> list[StoredMessage]:
        """System 1: the candidate pool (`thread`'s messages first, when asked in one),
        then Select, ASK and Expand to the top-k evidence."""
        pool = await candidate_pool(
            self.engine,
            self.cfg,
            question,
            projection,
            scopes,
            pks,
            window,
            names=names,
            display=display,
            breadth=breadth,
            vector_task=vector_task,
        )
        if thread is not None:
            found = await self.engine.thread_messages(*thread)
            pool.messages.update({m.pk: m for m in found})
            pool.pks = thread_first(pool.pks, newest_first(found), size=self.cfg.pool)
        if asked_in is not None:
            pool.pks = [
                pk
                for pk in pool.pks
                if (m := pool.messages.get(pk)) is None or (m.scope, m.message_id) != asked_in
            ]
        evidence = await select_and_expand(
            self.engine, self.cfg, self.llm, trace, question, projection, pool, pks, window, names
        )
        if asked_in is not None:  # nor as a neighbour that Expand brought in
            evidence = [m for m in evidence if (m.scope, m.message_id) != asked_in]
        trace.rankings = {name: len(lst) for name, lst in pool.rankings.lists.items()}
        trace.pool = [pool.messages[pk].message_id for pk in pool.pks[:10] if pk in pool.messages]
        return evidence

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

        question = req.question.strip()[: self.cfg.max_question_chars]
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
                        (req.scope, req.thread) if req.thread and req.scope in known else None,
                        (req.scope, req.asked_in) if req.asked_in else None,
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
            support = await support_messages(self.engine, rows)
        trace.s2_people = {
            "how": s2.people.how,
            "considered": s2.people.considered,
            "left_out": s2.people.left_out,
            "queries": s2.queries,
        }
        who = identities(display_names(roster))  # two rows of one name stay two rows
        trace.s2_rows = {
            (who.person(r.key) if r.key in who.current else r.label): [
                rr.record.content[:80] for rr in r.records
            ]
            or [f"(fallback) {m.message_id}" for m in r.fallback]
            or ["(none)"]
            for r in rows
        }
        s1_budget, s2_budget = await pack_budgets(self.llm, self.cfg, question, answer)
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
                await answer_pack(
                    self.llm, self.cfg, self.link, pack, trace, req.answer_note, req.locale
                )
                if answer
                else RecallAnswer(text="")
            )
        result.searched = list(scopes)
        note = ambiguity_note(projection.candidates, names)
        if note and result.text:
            result.text = f"{result.text}\n{note}"
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
