"""The Writer end to end: real OpenAICompatLLM -> local HTTP server -> validation -> SQLite.

Every test crosses the wire (the scripted server in tests/llm_server.py), so status codes,
odd bodies and retries are the real client's behaviour, not a mock's.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, Layer, MessageEvent, RecordState, Scope
from speakermem.memory.writer.runner import Writer, backoff_seconds
from tests.conftest import T0, msg
from tests.llm_server import Garbage, Handler, Item, LLMServer, Reply

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[1]
FAST = WriterConfig(retry_base_s=0.01, retry_max_s=0.05)
SPEAKERS = ("Alice", "Bob", "Carol", "Dan")
NOOP_JSON = json.dumps({"actions": [{"type": "NOOP"}]})

# The E2E channel: 60 messages, round-robin speakers, a one-hour gap before message 50
# (a new session, so segment 3 lives in session 2). Facts sit at fixed positions.
FACTS = {
    4: "I work as a nurse at the city hospital.",
    9: "I adopted a dog named Rex last week.",
    13: "Rex is a golden retriever puppy.",
    30: "I started learning to play the cello.",
    35: "Alright, we all agreed to meet every Friday for board games.",
    52: "Big news: I left the hospital and now I work as a paramedic.",
}
_REF_LINE = re.compile(r"^(m\d+) \[[^\]]*\] \S+ \(([^)]+)\)(?: \[[^\]]*\])?: (.*)$", re.M)
_HEAD_LINE = re.compile(r"^#(\d+) \[(\w+)\] owner=(\S+)[^:]*: (.*)$", re.M)


def llm_for(server: LLMServer, **kw: Any) -> OpenAICompatLLM:
    """The real client against the test server: no client-side retries, tiny timeouts."""
    opts: dict[str, Any] = {"max_retries": 0, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
    opts.update(kw)
    return OpenAICompatLLM(server.base_url, "test-key", "test-model", 2.0, "json_schema", **opts)


def user_prompt(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def refs_by_text(prompt: str) -> dict[str, str]:
    """Message text -> local ref, read back from the rendered prompt (as a model would)."""
    return {text.strip(): ref for ref, _uid, text in _REF_LINE.findall(prompt)}


def heads_in(prompt: str) -> dict[int, str]:
    """Entry id -> content of the current-memory lines shown in the prompt."""
    return {int(i): content for i, _layer, _owner, content in _HEAD_LINE.findall(prompt)}


def e2e_events(scope: Scope) -> list[MessageEvent]:
    events = []
    for i in range(60):
        name = SPEAKERS[i % 4]
        text = FACTS.get(i, f"small talk {i} from {name} about the weather")
        events.append(msg(scope, f"e{i}", name, text, i + (60 if i >= 50 else 0)))
    return events


def e2e_writer_reply(body: dict[str, Any]) -> Item:
    """What a good Writer model would answer for each E2E segment, from the prompt alone."""
    prompt = user_prompt(body)
    refs = refs_by_text(prompt)
    actions: list[dict[str, Any]] = []

    def ref(i: int) -> str:
        return refs[FACTS[i]]

    if FACTS[4] in refs:
        actions.append(
            {
                "type": "ADD",
                "layer": "core",
                "source": "alice",
                "owner": "alice",
                "content": "Alice works as a nurse at the city hospital.",
                "event": "job",
                "refs": [ref(4)],
            }
        )
    if FACTS[9] in refs:
        actions.append(
            {
                "type": "ADD",
                "layer": "profile",
                "source": "bob",
                "owner": "bob",
                "content": "Bob adopted a golden retriever puppy named Rex.",
                "event": "pet",
                "refs": [ref(13), ref(9)],
            }
        )
    if FACTS[30] in refs:
        actions.append(
            {
                "type": "ADD",
                "layer": "core",
                "source": "Carol",
                "owner": "Carol",
                "content": "Carol is learning to play the cello.",
                "event": "hobby",
                "refs": [ref(30)],
            }
        )
    if FACTS[35] in refs:
        actions.append(
            {
                "type": "ADD",
                "layer": "interaction",
                "source": "dan",
                "owner": "GROUP",
                "content": "The group agreed to meet every Friday for board games.",
                "event": "board games",
                "refs": [ref(35)],
            }
        )
    if FACTS[52] in refs:
        nurse = next(i for i, c in heads_in(prompt).items() if "nurse" in c)
        actions.append(
            {
                "type": "UPDATE",
                "entry_id": nurse,
                "content": "Alice left the hospital and now works as a paramedic.",
                "refs": [ref(52)],
            }
        )
    return Reply(content=json.dumps({"actions": actions or [{"type": "NOOP"}]}))


async def run_e2e(engine: MemoryEngine, server: LLMServer, scope: Scope) -> list[Any]:
    """Ingest the 60-message channel and write it in three segments; returns the outcomes."""
    server.default = Handler(e2e_writer_reply)
    await engine.ingest_many(e2e_events(scope))
    async with llm_for(server) as llm:
        writer = Writer(engine, llm, FAST)
        outcomes = await writer.flush_due()
        assert await engine.store.segments.close_channel(scope) == 1
        outcomes += await writer.flush_due()
    return outcomes


async def segment_row(engine: MemoryEngine, segment_id: int) -> tuple[str, int, str | None]:
    rows = await engine.store.db.read(
        "SELECT state, attempts, last_error FROM segments WHERE id = ?", (segment_id,)
    )
    return rows[0][0], int(rows[0][1]), rows[0][2]


async def record_count(engine: MemoryEngine) -> int:
    return int((await engine.store.db.read("SELECT count(*) FROM records"))[0][0])


async def one_segment(engine: MemoryEngine, scope: Scope, texts: list[tuple[str, str]]) -> int:
    """Ingest (speaker, text) pairs as one closed segment; returns its id."""
    await engine.ingest_many(
        [msg(scope, f"{scope.channel}-{i}", who, text, i) for i, (who, text) in enumerate(texts)]
    )
    await engine.store.segments.close_channel(scope)
    (seg,) = await engine.store.segments.due(limit=10, scope=scope)
    return seg.id


SMALL = [
    ("Alice", "I work as a nurse at the city hospital."),
    ("Bob", "I adopted a dog named Rex."),
    ("Alice", "Nice, see you Friday."),
]
GOOD_ADD = {
    "type": "ADD",
    "layer": "core",
    "source": "alice",
    "owner": "alice",
    "content": "Alice works as a nurse at the city hospital.",
    "refs": ["m1"],
}


# ---------------------------------------------------------------- end to end


async def test_end_to_end_three_segments_roster_heads_and_chain(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    outcomes = await run_e2e(engine, llm_server, scope)

    assert [o.status for o in outcomes] == ["committed"] * 3
    assert len(llm_server.requests) == 3
    segs = await engine.store.db.read("SELECT n_messages, state FROM segments ORDER BY id")
    assert [tuple(r) for r in segs] == [(25, "done"), (25, "done"), (10, "done")]
    prompts = [user_prompt(r) for r in llm_server.requests]
    for prompt in prompts:
        for name in SPEAKERS:
            assert f"- {name.lower()}: {name}" in prompt
    assert [o.accepted for o in outcomes] == [2, 2, 1]
    assert all(o.rejected == {} for o in outcomes)

    pks = await engine.channel_pks([scope])
    records = await engine.store.records.get_many([rid for o in outcomes for rid in o.record_ids])
    nurse, rex = outcomes[0].record_ids
    cello, games = outcomes[1].record_ids
    (paramedic,) = outcomes[2].record_ids
    # segment 2 sees segment 1's heads; segment 3 sees both segments' heads
    assert heads_in(prompts[0]) == {}
    assert set(heads_in(prompts[1])) == {nurse, rex}
    assert set(heads_in(prompts[2])) == {nurse, rex, cello, games}
    for rid in (nurse, rex, cello, games):
        assert f"#{rid} [{records[rid].layer.value}]" in prompts[2]
        assert records[rid].content in prompts[2]

    # the system, not the model, filled the coordinates
    stored = await engine.store.messages.by_ids(scope, [f"e{i}" for i in FACTS])
    r = records[rex]
    assert r.from_ids == ("e9", "e13")
    assert r.time == stored["e13"].ts == T0 + timedelta(minutes=13)
    assert r.session_id == stored["e13"].session_id
    assert (r.layer, r.source, r.owner) == (Layer.PROFILE, "bob", "bob")
    assert records[cello].owner == "carol"  # a display name resolved to the roster id
    g = records[games]
    assert (g.layer, g.owner, g.source, g.from_ids) == (Layer.INTERACTION, GROUP, "dan", ("e35",))

    # the UPDATE appended a node: old -> new chain, heads show only the new one
    chain = await engine.store.records.chain(paramedic)
    assert [c.id for c in chain] == [nurse, paramedic]
    old, new = chain
    assert old.state is RecordState.SUPERSEDED and old.superseded_by == paramedic
    assert new.state is RecordState.ACTIVE and new.supersedes == nurse
    assert new.from_ids == ("e52",) and new.time == stored["e52"].ts
    assert new.session_id == stored["e52"].session_id != old.session_id
    assert (new.layer, new.owner, new.source) == (Layer.CORE, "alice", "alice")
    heads = await engine.store.records.heads(pks, owners=["alice"])
    assert [h.id for h in heads] == [paramedic]
    stats = await engine.store.records.writer_stats()
    assert stats["flushes"] == 3 and stats["accepted"] == 5 and stats["rejected"] == {}
    assert stats["prompt_tokens"] > 0


# ---------------------------------------------------------------- outage and backoff


async def test_endpoint_down_defers_then_commits_once(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    seg = await one_segment(engine, scope, SMALL)
    llm_server.fail_next(2)
    llm_server.default = Reply(content=json.dumps({"actions": [GOOD_ADD]}))
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        for attempt in (1, 2):
            before = time.time()
            (out,) = await writer.flush_due()
            assert out.status == "deferred" and "503" in (out.error or "")
            state, attempts, error = await segment_row(engine, seg)
            assert (state, attempts) == ("pending", attempt) and "503" in (error or "")
            assert await record_count(engine) == 0
            # backing off: the next attempt waits base * 2^(attempts so far)
            (retry_at,) = (
                await engine.store.db.read(
                    "SELECT next_attempt_at FROM segments WHERE id = ?", (seg,)
                )
            )[0]
            assert retry_at >= before + backoff_seconds(attempt - 1, FAST, lambda: 0.0)
            await asyncio.sleep(max(0.0, retry_at - time.time()) + 0.01)
        (out,) = await writer.flush_due()
        assert out.status == "committed" and out.accepted == 1
        await asyncio.sleep(FAST.retry_max_s + 0.01)
        assert await writer.flush_due() == []
    assert len(llm_server.requests) == 3
    assert (await segment_row(engine, seg))[0] == "done"
    assert await record_count(engine) == 1
    stats = await engine.store.records.writer_stats()
    assert stats["failed_flushes"] == 2 and stats["accepted"] == 1


# ---------------------------------------------------------------- bad model output


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(Garbage(), {"invalid_json": 1}, id="garbage-body"),
        pytest.param(
            Reply(
                content='{"actions": [{"type": "ADD", "layer": "core", "sou', finish_reason="length"
            ),
            {"invalid_json": 1},
            id="truncated",
        ),
        pytest.param(
            Reply(
                content=json.dumps(
                    {
                        "actions": [
                            {"type": "FORGET", "entry_id": 1},
                            {"type": "ADD", "layer": "core", "source": "alice", "refs": ["m1"]},
                            {
                                "type": "ADD",
                                "layer": "mood",
                                "source": "alice",
                                "owner": "alice",
                                "content": "Alice is a nurse",
                                "refs": ["m1"],
                            },
                            "not an object",
                        ]
                    }
                )
            ),
            {"unknown_action": 1, "schema_violation": 2, "unknown_layer": 1},
            id="schema-violations",
        ),
        pytest.param(Reply(content='{"memories": []}'), {"schema_violation": 1}, id="no-list"),
    ],
)
async def test_unusable_output_is_counted_and_stores_nothing(
    engine: MemoryEngine,
    scope: Scope,
    llm_server: LLMServer,
    reply: Item,
    expected: dict[str, int],
) -> None:
    seg = await one_segment(engine, scope, SMALL)
    llm_server.script(reply)
    async with llm_for(llm_server) as llm:
        (out,) = await Writer(engine, llm, FAST).flush_due()
    assert out.status == "committed" and out.accepted == 0
    assert out.rejected == expected
    assert (await segment_row(engine, seg))[0] == "done"
    assert await record_count(engine) == 0
    stats = await engine.store.records.writer_stats()
    assert stats["rejected"] == dict(sorted(expected.items()))
    assert stats["failed_flushes"] == 0


async def test_mixed_batch_commits_the_valid_actions(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    await one_segment(engine, scope, SMALL)
    actions = [
        GOOD_ADD,
        {"type": "DELETE", "entry_id": 3},
        {"type": "ADD", "layer": "profile", "source": "bob", "owner": "bob", "refs": ["m2"]},
        {
            "type": "ADD",
            "layer": "profile",
            "source": "bob",
            "owner": "bob",
            "content": "Bob adopted a dog named Rex.",
            "refs": ["m2"],
        },
        {
            "type": "ADD",
            "layer": "profile",
            "source": "bob",
            "owner": "bob",
            "content": "Bob is a professional astronaut in training.",
            "refs": ["m2"],
        },
        {"type": "NOOP"},
    ]
    llm_server.script(Reply(content=json.dumps({"actions": actions})))
    async with llm_for(llm_server) as llm:
        (out,) = await Writer(engine, llm, FAST).flush_due()
    assert out.proposed == 6 and out.accepted == 2
    assert out.rejected == {"unknown_action": 1, "schema_violation": 1, "ungrounded": 1}
    recs = await engine.store.records.get_many(out.record_ids)
    assert sorted(r.content for r in recs.values()) == [
        "Alice works as a nurse at the city hospital.",
        "Bob adopted a dog named Rex.",
    ]
    runs = await engine.store.db.read("SELECT proposed, accepted, noops, rejected FROM writer_runs")
    assert [(r[0], r[1], r[2], json.loads(r[3])) for r in runs] == [(6, 2, 1, out.rejected)]


async def test_ref_to_another_channel_is_rejected(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    other = Scope(platform=scope.platform, workspace=scope.workspace, channel="random")
    await engine.ingest_many([msg(other, "r1", "Alice", "I work as a nurse at the hospital.", 0)])
    await one_segment(engine, scope, SMALL)
    foreign = dict(GOOD_ADD, refs=["r1"])
    missing = dict(GOOD_ADD, refs=["m9"])
    llm_server.script(Reply(content=json.dumps({"actions": [foreign, missing]})))
    async with llm_for(llm_server) as llm:
        (out,) = await Writer(engine, llm, FAST).flush_due(scope=scope)
    assert out.status == "committed" and out.accepted == 0
    assert out.rejected == {"unknown_ref": 2}
    assert await record_count(engine) == 0


async def test_source_outside_roster_is_rejected(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    await one_segment(engine, scope, SMALL)
    stranger = dict(GOOD_ADD, source="zed", owner="alice")
    named = dict(GOOD_ADD, source="Mallory")
    llm_server.script(Reply(content=json.dumps({"actions": [stranger, named]})))
    async with llm_for(llm_server) as llm:
        (out,) = await Writer(engine, llm, FAST).flush_due()
    assert out.rejected == {"unknown_source": 2} and out.accepted == 0
    assert await record_count(engine) == 0


# ---------------------------------------------------------------- crash safety

CRASH_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
    from speakermem.memory.config import MemoryConfig, StoreConfig, WriterConfig
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.store.records import RecordRepo
    from speakermem.memory.writer.runner import Writer, backoff_seconds

    async def die(*args, **kwargs):  # the LLM has replied; the commit never happens
        sys.stdout.write("commit reached\\n"); sys.stdout.flush()
        os._exit(137)

    RecordRepo.commit_segment = die

    async def main(db, url):
        engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=Path(db))))
        llm = OpenAICompatLLM(url, "k", "test-model", 5.0, max_retries=0)
        await Writer(engine, llm, WriterConfig(retry_base_s=0.01, retry_max_s=0.05)).flush_due()
        sys.exit(3)  # not reached

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.e2e
@pytest.mark.sqlite_only("the crashing child process opens the store by its SQLite file path")
async def test_crash_between_reply_and_commit_redoes_the_segment_once(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    seg = await one_segment(engine, scope, SMALL)
    llm_server.default = Reply(content=json.dumps({"actions": [GOOD_ADD]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASH_CHILD,
        str(engine.store.db.path),
        llm_server.base_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 137, err.decode()[-2000:]
    assert out.decode() == "commit reached\n"
    assert len(llm_server.requests) == 1
    assert await segment_row(engine, seg) == ("pending", 0, None)
    assert await record_count(engine) == 0

    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        (again,) = await writer.flush_due()
        assert again.status == "committed" and again.accepted == 1
        assert len(llm_server.requests) == 2
        assert llm_server.requests[1]["messages"] == llm_server.requests[0]["messages"]
        assert await writer.flush_due() == []
        assert len(llm_server.requests) == 2
    assert (await segment_row(engine, seg))[0] == "done"
    assert await record_count(engine) == 1
    rows = await engine.store.db.read("SELECT count(*) FROM writer_runs")
    assert rows[0][0] == 1


async def test_redo_of_a_done_segment_commits_nothing(
    engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    await one_segment(engine, scope, SMALL)
    llm_server.default = Reply(content=json.dumps({"actions": [GOOD_ADD]}))
    (seg,) = await engine.store.segments.due(limit=1)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        first = await writer.flush(seg)
        second = await writer.flush(seg)  # e.g. a crash after the commit, before the ack
    assert first.record_ids and second.record_ids == []
    assert await record_count(engine) == 1


async def wait_for(cond: Callable[[], Any], within_s: float = 5.0) -> None:
    """Poll `cond` (sync or async) until true: the scheduler runs on its own clock."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        result = cond()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")
