"""Limits and defaults written once, in the settings models, and honoured everywhere they
apply: a question's length at every door /recall has, the spill's retry, the embedder's
threads and model cache, the search fusion constant under its new and its former name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import CommandInvocation, RosterAction, RosterEvent
from speakermem.bot.settings import Settings
from speakermem.integrations.embeddings.minilm import MiniLMEmbedder
from speakermem.integrations.runtime import build_dispatcher
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterMember, Scope
from speakermem.memory.query.pipeline import (
    RecallPipeline,
    RecallRequest,
    RecallResult,
    RecallTrace,
)
from speakermem.memory.query.projection import Projection
from tests.conftest import T0, msg
from tests.test_reliability_diskfull import fill_to_the_brim, live_ids, space_returns
from tests.web_fixtures import GENERAL, copy_store, running_console
from tests.web_fixtures import console_store as console_store

QUESTION = "".join(f"word{i:03d} " for i in range(400))  # 3,200 characters
LIMIT = 123
"""Mid-word: a cut there shows, whatever each door strips around it."""


class ProjectionSeen(RecallPipeline):
    """The real pipeline; it notes the question its projection stage was given."""

    seen: list[str]

    async def project(
        self, question: str, roster: list[RosterMember], trace: RecallTrace, pks: Any = ()
    ) -> Projection:
        self.seen.append(question)
        return await super().project(question, roster, trace, pks)


class Asked:
    """A recaller that notes the question the dispatcher hands it, answered by the pipeline."""

    def __init__(self, pipeline: RecallPipeline) -> None:
        self.pipeline = pipeline
        self.questions: list[str] = []

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        self.questions.append(req.question)
        return await self.pipeline.run(req, answer=answer)


async def test_the_chat_command_and_the_pipeline_cut_a_question_at_the_one_limit(
    engine: MemoryEngine, scope: Scope
) -> None:
    await engine.ingest(msg(scope, "m1", "Ann", "word001 word002 are the launch words", 1))
    await engine.roster(
        RosterEvent(scope=scope, action=RosterAction.JOIN, user_id="u1", name="Ann", at=T0)
    )
    engine.config.recall.max_question_chars = LIMIT
    pipeline = ProjectionSeen(engine)
    pipeline.seen = []
    asked = Asked(pipeline)
    d = Dispatcher(engine, asked)
    inv = CommandInvocation(scope=scope, command="recall", user_id="u1", text=QUESTION)
    await d.recall(inv)
    assert asked.questions == [QUESTION[:LIMIT]]
    assert pipeline.seen == [QUESTION[:LIMIT]]

    pipeline.seen = []  # the pipeline cuts on its own, for callers that do not (the CLI)
    await pipeline.run(RecallRequest(QUESTION, scope))
    assert pipeline.seen == [QUESTION[:LIMIT]]

    engine.config.recall.max_question_chars = 4_000
    asked.questions = []
    await d.recall(inv)
    assert asked.questions == [QUESTION.strip()]


async def test_the_web_console_cuts_a_question_at_the_same_limit(
    console_store: Path,
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        rc.engine.config.recall.max_question_chars = LIMIT
        session = rc.session("admin")
        assert session is not None
        data = {"channel": str(GENERAL), "question": QUESTION, "csrf": session.csrf}
        async with http.post(rc.url + "/ask", data=data, headers=rc.cookie_header(session)) as resp:
            assert resp.status == 200
            page = await resp.text()
    assert f'value="{QUESTION[:LIMIT]}"' in page
    assert QUESTION[: LIMIT + 8] not in page


async def test_the_spill_retry_is_a_setting(engine: MemoryEngine, tmp_path: Path) -> None:
    """Past `spill_retry_s` since the last attempt, the next event replays the spill first;
    within it, the event waits behind the spill."""
    await fill_to_the_brim(engine)
    waited: dict[float, list[str]] = {}
    for retry_s in (0.05, 3600.0):
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            db_path=tmp_path / "test.db",
            spill_path=tmp_path / f"spill-{retry_s}.jsonl",
            spill_retry_s=retry_s,
        )
        d = build_dispatcher(settings, engine, RecallPipeline(engine))
        assert d.spill is not None
        where = Scope(platform="test", workspace="w1", channel=f"c{int(retry_s)}")
        await d.handle(msg(where, "a", "Ann", "first", 1))
        assert d.spill.count == 1
        await space_returns(engine)
        await asyncio.sleep(0.06)
        await d.handle(msg(where, "b", "Ann", "second", 2))
        waited[retry_s] = await live_ids(engine, where)
        await fill_to_the_brim(engine)
    assert waited == {0.05: ["a", "b"], 3600.0: []}


def test_a_renamed_setting_still_reads_its_former_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("SPEAKERMEM_RRF_K0", "SPEAKERMEM_SEARCH_RRF_K0"):
        monkeypatch.delenv(key, raising=False)
    assert Settings(_env_file=None).memory_config().search.hybrid_rrf_k0 == 60  # type: ignore[call-arg]
    monkeypatch.setenv("SPEAKERMEM_RRF_K0", "7")
    assert Settings(_env_file=None).memory_config().search.hybrid_rrf_k0 == 7  # type: ignore[call-arg]
    monkeypatch.setenv("SPEAKERMEM_SEARCH_RRF_K0", "9")
    assert Settings(_env_file=None).search_rrf_k0 == 9  # type: ignore[call-arg]


def test_the_embedder_defaults_are_the_settings_defaults() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    emb = MiniLMEmbedder()
    assert emb.threads == settings.embed_threads
    assert emb.cache_dir == settings.model_cache_dir.expanduser()
