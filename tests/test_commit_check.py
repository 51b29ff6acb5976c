"""The Writer's commit-time check (issue 27, defects 1 and 5).

The Writer reads a segment, waits seconds for the LLM, then commits. A forget (or a platform
delete) that returns while the LLM is answering used to leave records quoting the forgotten
text: 11 such records in the issue's trial. Here the scripted LLM server holds its answer
until the test has forgotten something, through the real openai client, on both backends,
for the in-process Writer and for a Writer worker; and the Writer's prompt no longer shows
forgotten or opted-out people (roster) nor their records as current memory.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import DeleteEvent, Layer, NewRecord, RecordScope, Scope
from speakermem.memory.writer.runner import FlushOutcome, Writer
from tests.conftest import T0, msg
from tests.llm_server import Handler, Item, LLMServer, Reply
from tests.test_writer import FAST, llm_for, user_prompt

pytestmark = pytest.mark.contract

CHAT = Scope(platform="test", workspace="w1", channel="chat")
_REF = re.compile(r"^(m\d+) \[[^\]]*\] \S+ \(([^)]+)\)(?: \[[^\]]*\])?: (.*)$", re.M)
NAMES = {"alice": "Alice", "bob": "Bob", "carol": "Carol"}


def derive_everything(body: dict[str, Any]) -> Reply:
    """A Writer model that derives a record from every message it is shown (its speaker as
    owner and source, quoting it), plus one GROUP record naming every speaker."""
    actions: list[dict[str, Any]] = []
    refs = _REF.findall(user_prompt(body))
    for ref, uid, text in refs:
        actions.append(
            {
                "type": "ADD",
                "layer": "core",
                "source": uid,
                "owner": uid,
                "content": f"{NAMES[uid]} said: {text}",
                "refs": [ref],
            }
        )
    if refs:
        who = sorted({NAMES[uid] for _, uid, _ in refs})
        actions.append(
            {
                "type": "ADD",
                "layer": "interaction",
                "source": refs[0][1],
                "owner": "GROUP",
                "content": f"{' and '.join(who)} talked: " + "; ".join(t for _, _, t in refs),
                "refs": [r for r, _, _ in refs],
            }
        )
    return Reply(content=json.dumps({"actions": actions or [{"type": "NOOP"}]}))


class HeldAnswer:
    """The LLM's answer waits until the test releases it (a forget returns meanwhile)."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Item:
        self.arrived.set()
        await self.release.wait()
        return derive_everything(body)


async def seed(engine: MemoryEngine) -> None:
    await engine.ingest_many(
        [
            msg(CHAT, "a1", "Alice", "I am moving to Quillfort next spring", 0),
            msg(CHAT, "b1", "Bob", "I bought a red kayak for the lake", 1),
            msg(CHAT, "a2", "Alice", "my sister runs the Quillfort bakery", 2),
        ]
    )
    await engine.store.segments.close_channel(CHAT)


async def records(engine: MemoryEngine) -> list[tuple[str, str, str, str]]:
    rows = await engine.store.db.read(
        "SELECT owner, source, content, from_ids FROM records ORDER BY id"
    )
    return [tuple(r) for r in rows]


async def during_the_call(
    server: LLMServer, write: Awaitable[list[FlushOutcome]], act: Callable[[], Awaitable[Any]]
) -> list[FlushOutcome]:
    """Start a Writer run, do `act` while the LLM holds its answer, then let it answer."""
    held = HeldAnswer()
    server.default = Handler(held)
    task = asyncio.ensure_future(write)
    await asyncio.wait_for(held.arrived.wait(), 10)
    await act()  # it returns before the LLM answers
    held.release.set()
    return await asyncio.wait_for(task, 10)


async def test_forget_user_while_the_llm_answers_commits_nothing_about_them(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await seed(engine)
    gov = Governance(engine)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        (outcome,) = await during_the_call(
            llm_server,
            writer.flush_due(),
            lambda: gov.forget_user("test", "w1", "alice", actor="cli"),
        )
    assert "Quillfort" in user_prompt(llm_server.requests[-1])  # the LLM saw her words
    left = await records(engine)
    assert [(o, s) for o, s, _, _ in left] == [("bob", "bob")]
    assert not any("Quillfort" in c or "Alice" in c for _, _, c, _ in left)
    # dropped (her two records and the GROUP one she is the source of), counted with their
    # reasons in the run log and the outcome
    assert outcome.status == "committed" and outcome.accepted == 1
    assert sum(outcome.rejected.values()) == 3
    runs = await engine.store.db.read("SELECT accepted, rejected FROM writer_runs")
    assert [(r[0], json.loads(r[1])) for r in runs] == [(1, outcome.rejected)]


async def test_a_platform_delete_while_the_llm_answers_drops_what_cites_it(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await seed(engine)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        (outcome,) = await during_the_call(
            llm_server,
            writer.flush_due(),
            lambda: engine.delete(DeleteEvent(scope=CHAT, message_id="b1")),
        )
    left = await records(engine)
    assert sorted(json.loads(f)[0] for _, _, _, f in left) == ["a1", "a2"]
    assert not any("kayak" in c for _, _, c, _ in left)
    assert outcome.rejected == {"commit_cites_forgotten": 2}  # Bob's and the GROUP record


async def test_a_writer_worker_checks_at_commit_too(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await seed(engine)
    gov = Governance(engine)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        (outcome,) = await during_the_call(
            llm_server,
            writer.write_claimed("worker-1", lease_s=30.0),
            lambda: gov.opt_out("test", "w1", "bob", forget=False, actor="test:bob"),
        )
    left = await records(engine)
    # an opted-out person is no owner or source of anything new; the others' records stand
    assert sorted(o for o, _, _, _ in left) == ["GROUP", "alice", "alice"]
    assert outcome.status == "committed" and sum(outcome.rejected.values()) == 1


def rec(content: str, from_ids: tuple[str, ...], owner: str) -> NewRecord:
    return NewRecord(
        layer=Layer.CORE,
        record_scope=RecordScope.PERSON,
        content=content,
        source=owner,
        owner=owner,
        event="",
        time=T0,
        session_id=0,
        from_ids=from_ids,
        writer_model="test",
        prompt_version="t1",
    )


async def test_the_prompt_shows_no_forgotten_or_opted_out_person(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    """Their roster line and their records ("current memory") are not shown, and nothing
    about them can be committed: a GROUP record naming a forgotten person is dropped too."""
    gov = Governance(engine)
    await engine.ingest_many(
        [
            msg(CHAT, "a1", "Alice", "alice likes Quillfort", 0),
            msg(CHAT, "c1", "Carol", "carol plays the zither", 1),
            msg(CHAT, "b1", "Bob", "bob has a kayak", 2),
        ]
    )
    await engine.store.segments.close_channel(CHAT)
    (carol_rec,) = await engine.store.records.add_records(
        CHAT, [rec("Carol plays the zither", ("c1",), "carol")], None
    )
    await gov.forget_user("test", "w1", "alice", actor="cli")
    await gov.opt_out("test", "w1", "carol", forget=False, actor="test:carol")
    await engine.ingest_many(
        [
            msg(CHAT, "b2", "Bob", "Alice told me about Quillfort", 30),
            msg(CHAT, "b3", "Bob", "and Carol played the zither", 31),
        ]
    )
    await engine.store.segments.close_channel(CHAT)
    llm_server.default = Handler(derive_everything)
    async with llm_for(llm_server) as llm:
        outcomes = await Writer(engine, llm, FAST).flush_due()
    prompts = [user_prompt(r) for r in llm_server.requests]
    for prompt in prompts:
        assert "- alice:" not in prompt and "- carol:" not in prompt
        assert f"#{carol_rec} " not in prompt and "zither" not in prompt.split("## New")[0]
        assert "carol plays" not in prompt  # an opted-out member's old messages are not input
    left = await records(engine)
    assert {o for o, _, _, _ in left} == {"bob", "carol", "GROUP"}  # carol's from before
    assert not any("Alice" in c or "Quillfort" in c for _, _, c, _ in left)
    # "Bob said: Alice told me..." and the GROUP record of that segment name her
    dropped = [o.rejected.get("commit_names_forgotten", 0) for o in outcomes]
    assert dropped == [0, 2]


async def test_commit_segment_checks_inside_its_transaction(engine: MemoryEngine) -> None:
    """The store's own check, whatever the Writer validated before: a record citing a
    forgotten or deleted message, or owned by (or sourced from) a forgotten or opted-out
    person, or naming a forgotten person, is dropped and counted; the rest commit."""
    from speakermem.memory.store import WriterRunLog

    gov = Governance(engine)
    await seed(engine)
    await engine.ingest_many([msg(CHAT, "c1", "Carol", "carol plays the zither", 3)])
    (segment,) = await engine.store.segments.due(limit=5, scope=CHAT)
    group = rec("Alice and Bob went paddling", ("b1",), "GROUP")
    group = group.model_copy(
        update={"record_scope": RecordScope.GROUP, "layer": Layer.INTERACTION, "source": "bob"}
    )
    proposed = [
        rec("Alice is moving to Quillfort", ("a1",), "alice"),
        rec("Bob bought a red kayak", ("b1",), "bob"),
        rec("Carol plays the zither", ("c1",), "carol"),
        rec("Bob likes lakes", ("b1", "b9"), "bob"),  # b9 was never stored
        group,
    ]
    await gov.forget_user("test", "w1", "alice", actor="cli")
    await gov.opt_out("test", "w1", "carol", forget=False, actor="test:carol")
    run = WriterRunLog(model="m", prompt_version="t", started_at=0.0, accepted=5)
    ids = await engine.store.records.commit_segment(segment.id, CHAT, proposed, None, run)
    committed = await engine.store.records.get_many(ids)
    assert [r.content for r in committed.values()] == ["Bob bought a red kayak"]
    assert run.accepted == 1
    assert run.rejected == {
        "commit_cites_forgotten": 2,
        "commit_opted_out_person": 1,
        "commit_names_forgotten": 1,
    }
    # add_records (re-derivation, tools) runs the same check
    dropped: dict[str, int] = {}
    assert await engine.store.records.add_records(CHAT, proposed[:1], None, dropped=dropped) == []
    assert dropped == {"commit_cites_forgotten": 1}
