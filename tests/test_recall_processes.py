"""/recall in worker processes (SPEAKERMEM_RECALL_PROCESSES): real spawned children on the
same SQLite file as the bot's engine; the answers, the access checks, the LLM metrics and
the shutdown must be those of the bot's own pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.integrations.ops.metrics import MeteredLLM, Metrics
from speakermem.integrations.recall_processes import RecallProcesses
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import (
    AccessDenied,
    RecallPipeline,
    RecallRequest,
    RecallResult,
)
from tests.conftest import msg
from tests.llm_server import Handler, LLMServer, Reply
from tests.standins.slack_api import SlackApiStandIn, signed_headers
from tests.test_run import LAUNCH_EVENT, SECRET, free_port, start_bot, wait_for_port

pytestmark = pytest.mark.e2e

TEAM = Scope(platform="test", workspace="w1", channel="team")
QUESTIONS = (
    "When is the budget review?",
    "Who owns the database backup?",
    "What did Bruno say about the launch?",
)
CHAT = [
    ("Alice", "The budget review moved to Thursday at ten."),
    ("Bruno", "I own the database backup from next week on."),
    ("Alice", "Thanks Bruno, the old backup job kept failing."),
    ("Bruno", "The launch slips to March because of the pricing page."),
    ("Chen", "Pricing page copy is ready for review."),
    ("Alice", "Let's keep the launch demo short."),
]


class CountingPipeline(RecallPipeline):
    """The bot's own pipeline as the fallback, counting the recalls it had to answer."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.calls = 0

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        self.calls += 1
        return await super().run(req, answer=answer)


def bot_settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(_env_file=None, db_path=tmp_path / "bot.db", embedder="none", **extra)  # type: ignore[call-arg]


@contextlib.asynccontextmanager
async def llm_children(
    engine: MemoryEngine,
    tmp_path: Path,
    server: LLMServer,
    fallback: CountingPipeline,
    metrics: Metrics | None = None,
) -> AsyncIterator[RecallProcesses]:
    """One recall process whose answers come from `server`; its LLM calls are counted on
    a metered client in this process, as the bot's runtime wires it."""
    settings = bot_settings(tmp_path, llm_base_url=server.base_url, llm_max_retries=0)
    client = OpenAICompatLLM(server.base_url, "k", "test-model", 60.0, max_retries=0)
    answer_llm = MeteredLLM(client, metrics or Metrics(), role="answer")
    procs = RecallProcesses(settings, engine, processes=1, fallback=fallback, answer_llm=answer_llm)
    await procs.start()
    try:
        yield procs
    finally:
        await procs.stop()
        await client.aclose()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(bot_settings(tmp_path).memory_config(), None)
    await eng.ingest_many([msg(TEAM, f"m{i}", who, text, i) for i, (who, text) in enumerate(CHAT)])
    for user in ("alice", "bruno", "chen"):
        await eng.roster(RosterEvent(scope=TEAM, action=RosterAction.JOIN, user_id=user))
    try:
        yield eng
    finally:
        await eng.close()


def fingerprint(result: RecallResult) -> tuple[str, list[str], list[str]]:
    return (
        result.answer.text,
        [c.message_id for c in result.answer.citations],
        [e.message_id for e in result.pack.excerpts],
    )


async def test_children_answer_as_the_bot_process_does(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    fallback = CountingPipeline(engine)
    procs = RecallProcesses(bot_settings(tmp_path), engine, processes=2, fallback=fallback)
    await procs.start()
    try:
        assert len(procs.pids) == 2 and os.getpid() not in procs.pids
        here = RecallPipeline(engine)
        for question in QUESTIONS:
            req = RecallRequest(question, TEAM, asker="alice")
            theirs, ours = await procs.run(req), await here.run(req)
            assert theirs.answer.citations, question  # something was found
            assert fingerprint(theirs) == fingerprint(ours), question
        # concurrent recalls queue for the two children; none fell back to this process
        results = await asyncio.gather(
            *(procs.run(RecallRequest(q, TEAM, asker="bruno")) for q in QUESTIONS * 3)
        )
        assert all(r.answer.citations for r in results)
        assert fallback.calls == 0
    finally:
        await procs.stop()
    assert procs.pids == []


async def test_access_is_checked_in_the_child_against_the_current_roster(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    fallback = CountingPipeline(engine)
    procs = RecallProcesses(bot_settings(tmp_path), engine, processes=1, fallback=fallback)
    await procs.start()
    try:
        ask = RecallRequest("When is the budget review?", TEAM, asker="dana")
        with pytest.raises(AccessDenied):  # the refusal crosses the pipe as itself
            await procs.run(ask)
        await engine.roster(RosterEvent(scope=TEAM, action=RosterAction.JOIN, user_id="dana"))
        assert (await procs.run(ask)).answer.citations  # the child saw the join
        await engine.roster(RosterEvent(scope=TEAM, action=RosterAction.LEAVE, user_id="dana"))
        with pytest.raises(AccessDenied):  # ... and the leave: no stale roster (fail closed)
            await procs.run(ask)
        assert fallback.calls == 0
    finally:
        await procs.stop()


async def test_a_killed_child_costs_one_recall_in_the_bot_and_is_replaced(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    fallback = CountingPipeline(engine)
    procs = RecallProcesses(bot_settings(tmp_path), engine, processes=1, fallback=fallback)
    await procs.start()
    try:
        [first] = procs.pids
        os.kill(first, signal.SIGKILL)
        req = RecallRequest("Who owns the database backup?", TEAM, asker="alice")
        result = await procs.run(req)
        assert result.answer.citations and fallback.calls == 1  # answered here
        for _ in range(600):
            if procs.replaced:
                break
            await asyncio.sleep(0.05)
        [second] = procs.pids
        assert procs.replaced == 1 and second != first
        assert (await procs.run(req)).answer.citations
        assert fallback.calls == 1  # the new child answered
    finally:
        await procs.stop()


async def test_llm_calls_in_children_count_in_the_bots_metrics_and_stop_waits_for_them(
    engine: MemoryEngine, tmp_path: Path, llm_server: LLMServer
) -> None:
    arrived = asyncio.Event()

    async def slow_answer(body: dict[str, Any]) -> Reply:
        arrived.set()
        await asyncio.sleep(1.0)
        return Reply(content="The budget review is on Thursday at ten [1].")

    llm_server.default = Handler(slow_answer)
    metrics = Metrics()
    async with llm_children(
        engine, tmp_path, llm_server, CountingPipeline(engine), metrics
    ) as procs:
        recall = asyncio.create_task(
            procs.run(RecallRequest("When is the budget review?", TEAM, asker="alice"))
        )
        await asyncio.wait_for(arrived.wait(), 60)  # the child waits on the LLM: in flight
        await procs.stop()  # must let it finish
        result = await recall
    assert result.answer.used_llm
    calls = len(llm_server.requests)
    ok = metrics.llm_calls.labels("answer", "ok")._value.get()
    assert calls >= 1 and ok == calls
    assert metrics.llm_seconds.labels("answer")._sum.get() >= 1.0 * calls  # the server's delay
    assert procs.pids == []


async def test_the_bot_answers_slack_recall_from_its_recall_process(tmp_path: Path) -> None:
    """`speakermem run` with SPEAKERMEM_RECALL_PROCESSES=1: a /recall over the Slack HTTP
    path is answered (cited) by the child, and SIGTERM stops the child with the bot."""
    api = await SlackApiStandIn(
        users={"U1": {"id": "U1", "name": "alice", "real_name": "Alice"}},
        members={"C1": ["U1"]},
    ).start()
    port = free_port()
    proc = await start_bot(tmp_path / "run.db", api, port, recall_processes="1")
    url = f"http://127.0.0.1:{port}/slack/events"
    try:
        await wait_for_port(port, proc, limit_s=60)
        event = LAUNCH_EVENT
        command = urlencode(
            {
                "command": "/recall",
                "text": "when is the launch?",
                "user_id": "U1",
                "channel_id": "C1",
                "team_id": "T0STANDIN",
                "response_url": api.response_url("r1"),
                "trigger_id": "1.2.3",
            }
        )
        async with aiohttp.ClientSession() as http:
            ok = await http.post(
                url,
                data=event,
                headers=signed_headers(SECRET, event, content_type="application/json"),
            )
            assert ok.status == 200
            for _ in range(200):  # until the message is stored and the answer cites it
                resp = await http.post(
                    url,
                    data=command,
                    headers=signed_headers(
                        SECRET, command, content_type="application/x-www-form-urlencoded"
                    ),
                )
                assert resp.status == 200
                for _ in range(100):
                    if api.responses:
                        break
                    await asyncio.sleep(0.05)
                if api.responses and "friday" in json.dumps(api.responses[-1][1]):
                    break
                api.responses.clear()
                await asyncio.sleep(0.1)
        answer = json.dumps(api.responses[-1][1]) if api.responses else "(no answer)"
        assert "friday" in answer, answer
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await api.close()
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log
    assert "stopped cleanly" in log
    assert "xoxb-test-token-do-not-log" not in log
    found = re.search(r"recall runs in 1 processes \(pids \[(\d+)\]\)", log)
    assert found, log
    with pytest.raises(ProcessLookupError):  # the child stopped with the bot
        os.kill(int(found[1]), 0)


async def test_a_child_killed_mid_recall_answers_it_in_the_bot(
    engine: MemoryEngine, tmp_path: Path, llm_server: LLMServer
) -> None:
    """The child dies while its recall waits on the LLM: the bot answers that recall itself
    (here extractively) instead of failing it, and a new child takes over."""
    arrived = asyncio.Event()

    async def never_answers(body: dict[str, Any]) -> Reply:
        arrived.set()
        await asyncio.sleep(60)
        return Reply(content="")

    llm_server.default = Handler(never_answers)
    fallback = CountingPipeline(engine)  # no LLM: answers at once
    async with llm_children(engine, tmp_path, llm_server, fallback) as procs:
        [first] = procs.pids
        recall = asyncio.create_task(
            procs.run(RecallRequest("Who owns the database backup?", TEAM, asker="alice"))
        )
        await asyncio.wait_for(arrived.wait(), 60)
        os.kill(first, signal.SIGKILL)
        result = await asyncio.wait_for(recall, 30)
        assert result.answer.citations and not result.answer.used_llm
        assert fallback.calls == 1
        for _ in range(600):
            if procs.replaced:
                break
            await asyncio.sleep(0.05)
        assert procs.replaced == 1 and procs.pids != [first]


async def test_one_child_runs_several_recalls_at_once(
    engine: MemoryEngine, tmp_path: Path, llm_server: LLMServer
) -> None:
    """The LLM holds each call until two are waiting: a child whose recall kept its turn
    while waiting on the LLM would never get there."""
    both = asyncio.Event()
    waiting = 0
    alone: list[int] = []  # calls that waited in vain for a second one

    async def held(body: dict[str, Any]) -> Reply:
        nonlocal waiting
        waiting += 1
        if waiting >= 2:
            both.set()
        try:
            await asyncio.wait_for(both.wait(), 10)
        except TimeoutError:
            alone.append(waiting)
        return Reply(content="")

    llm_server.default = Handler(held)
    fallback = CountingPipeline(engine)
    async with llm_children(engine, tmp_path, llm_server, fallback) as procs:
        results = await asyncio.wait_for(
            asyncio.gather(
                procs.run(RecallRequest("Who owns the database backup?", TEAM, asker="alice")),
                procs.run(RecallRequest("When is the budget review?", TEAM, asker="bruno")),
            ),
            60,
        )
    assert both.is_set() and not alone and fallback.calls == 0
    assert all(r.answer.citations for r in results)
