"""/recall end to end: real SQLite store, real pipeline, the real OpenAI client against the
scripted local LLM server.

Why so little mocking: the pipeline's value is in how its stages hand data to each other
(pool -> Select prompt -> reordered evidence -> pack numbers -> checked citations), so the
tests drive the whole path and assert on what crossed each edge (recorded prompts, the trace,
the pack). Expected orders are computed from the recorded Select prompt, never hard-coded, so
tuning System 1 does not break them.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import (
    GROUP,
    LAYER_SCOPE,
    Layer,
    NewRecord,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.memory.query.compose import (
    render_pack,
)
from speakermem.memory.query.pipeline import (
    RecallPipeline,
    RecallRequest,
    RecallResult,
)
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder
from tests.llm_server import Garbage, Handler, Item, LLMServer, Reply

pytestmark = pytest.mark.contract

# ----------------------------------------------------------------------------------------------
# a small team channel: one long session (messages a minute apart), so the neighbours of
# the i-th message are the (i-1)-th and (i+1)-th

CHATTER = [
    "coffee",
    "weather",
    "traffic",
    "movie",
    "garden",
    "bicycle",
    "podcast",
    "weekend",
    "pizza",
    "printer",
    "holiday",
    "guitar",
    "museum",
    "hiking",
    "laptop",
    "chess",
]
PEOPLE = ["Alice", "Bob", "Carol", "Dave"]

TOPICAL: dict[int, tuple[str, str, str]] = {
    # position -> (message id, speaker, text)
    3: ("launch1", "Alice", "The launch date should move to May because the beta is not ready."),
    9: ("launch2", "Bob", "I disagree, the launch can stay in April if we cut the export."),
    15: ("launch3", "Carol", "Marketing needs two weeks of notice before any launch news."),
    21: ("launch4", "Alice", "Honestly Bob's April launch plan looks too risky to me."),
    27: ("db1", "Alice", "For the launch database I prefer Postgres, it is what we know."),
    33: ("launch5", "Bob", "The launch checklist lives in the shared drive now."),
    39: ("launch6", "Carol", "Launch party snacks are on me, just tell me the date."),
    45: ("db2", "Alice", "Changed my mind: SQLite is enough for the launch database."),
    51: ("launch7", "Alice", "Reminder that the launch review is on Friday at ten."),
    57: ("launch8", "Bob", "Press kit for the launch is drafted, please review it."),
    63: ("launch9", "Carol", "Support wants a launch FAQ before we ship anything."),
    69: ("launch10", "Alice", "Launch metrics dashboard is ready for the team."),
}
N_MESSAGES = 80


def conversation() -> list[tuple[str, str, str]]:
    """(message id, speaker, text) in turn order; Dave never mentions the launch."""
    out = []
    for i in range(N_MESSAGES):
        if i in TOPICAL:
            out.append(TOPICAL[i])
        else:
            a, b = CHATTER[i % 16], CHATTER[(i * 7 + 3) % 16]
            out.append((f"f{i}", PEOPLE[i % 4], f"my {a} and the {b} story number {i}"))
    return out


async def seed(engine: MemoryEngine, scope: Scope) -> list[tuple[str, str, str]]:
    conv = conversation()
    await engine.ingest_many(
        [msg(scope, mid, who, text, i) for i, (mid, who, text) in enumerate(conv)]
    )
    await engine.roster(
        RosterEvent(
            scope=scope,
            action=RosterAction.JOIN,
            user_id="helperbot",
            name="HelperBot",
            is_bot=True,
            at=T0,
        )
    )
    await engine.embed_pending()
    return conv


def record(
    layer: Layer,
    content: str,
    source: str,
    owner: str,
    from_ids: Sequence[str],
    minutes: float,
    supersedes: int | None = None,
    event: str = "launch",
) -> NewRecord:
    return NewRecord(
        layer=layer,
        record_scope=LAYER_SCOPE[layer],
        content=content,
        source=source,
        owner=owner,
        event=event,
        time=T0 + timedelta(minutes=minutes),
        session_id=1,
        from_ids=tuple(from_ids),
        supersedes=supersedes,
        writer_model="test",
        prompt_version="writer-v1",
    )


async def add(engine: MemoryEngine, scope: Scope, records: Sequence[NewRecord]) -> list[int]:
    vectors = HashEmbedder().embed_sync([r.content for r in records])
    return await engine.store.records.add_records(scope, records, vectors)


async def seed_records(engine: MemoryEngine, scope: Scope) -> dict[str, int]:
    """PERSON core/profile for Alice and Bob, one Alice-about-Bob record, GROUP records."""
    recs = {
        "a1": record(
            Layer.CORE,
            "Alice wants the launch moved to May; the beta is not ready",
            "alice",
            "alice",
            ["launch1"],
            3,
        ),
        "a2": record(
            Layer.CORE,
            "Alice runs the launch review every Friday",
            "alice",
            "alice",
            ["launch7"],
            51,
        ),
        "a3": record(
            Layer.PROFILE,
            "Alice built the launch metrics dashboard",
            "alice",
            "alice",
            ["launch10"],
            69,
        ),
        "b1": record(
            Layer.CORE,
            "Bob wants to keep the April launch by cutting export",
            "bob",
            "bob",
            ["launch2"],
            9,
        ),
        "b2": record(
            Layer.PROFILE, "Bob drafted the launch press kit", "bob", "bob", ["launch8"], 57
        ),
        "ab": record(
            Layer.PROFILE,
            "Alice thinks Bob's April launch plan is too risky",
            "alice",
            "bob",
            ["launch4"],
            21,
        ),
        "g1": record(
            Layer.INTERACTION,
            "The team needs two weeks of marketing notice before the launch",
            GROUP,
            GROUP,
            ["launch2", "launch3"],  # a GROUP-sourced record rests on two speakers (issue 39)
            15,
        ),
        "g2": record(
            Layer.INSIGHT,
            "Launch material is kept in the shared drive",
            GROUP,
            GROUP,
            ["launch4", "launch5"],
            33,
        ),
    }
    ids = await add(engine, scope, list(recs.values()))
    return dict(zip(recs, ids, strict=True))


@pytest.fixture
def team() -> Scope:
    return Scope(platform="test", workspace="w1", channel="team")


# ----------------------------------------------------------------------------------------------
# the LLM test server, routed by stage (the schema name of a JSON call; "answer" for text)

Route = Item | Callable[[dict[str, Any]], Item]


def stage_of(body: dict[str, Any]) -> str:
    fmt = body.get("response_format") or {}
    return str((fmt.get("json_schema") or {}).get("name", "answer")) if fmt else "answer"


class Router:
    """Answers each pipeline stage with its scripted item; JSON stages default to `{}`."""

    def __init__(self, server: LLMServer, **routes: Route) -> None:
        self.server = server
        self.routes = routes
        server.default = Handler(self)

    def __call__(self, body: dict[str, Any]) -> Item:
        stage = stage_of(body)
        route = self.routes.get(stage, Reply(content="" if stage == "answer" else "{}"))
        return route(body) if callable(route) else route

    def user_prompt(self, stage: str) -> str:
        bodies = [b for b in self.server.requests if stage_of(b) == stage]
        assert bodies, f"no {stage} request was made"
        return str(bodies[-1]["messages"][-1]["content"])

    def system_prompt(self, stage: str) -> str:
        bodies = [b for b in self.server.requests if stage_of(b) == stage]
        return str(bodies[-1]["messages"][0]["content"])


@pytest.fixture
async def llm(llm_server: LLMServer) -> AsyncIterator[OpenAICompatLLM]:
    client = OpenAICompatLLM(llm_server.base_url, "test-key", "test-model", 5.0, max_retries=0)
    try:
        yield client
    finally:
        await client.aclose()


_CANDIDATE = re.compile(r"^(\d+)\. \[[^\]]+\] [^:]+: (.*)$")


def candidates(select_prompt: str) -> list[str]:
    """Candidate texts, in prompt order, from a recorded Select prompt."""
    body = select_prompt.split("CANDIDATES:\n", 1)[1]
    out = []
    for line in body.splitlines():
        m = _CANDIDATE.match(line)
        assert m and int(m[1]) == len(out) + 1, line
        out.append(m[2])
    return out


def candidates_of(body: dict[str, Any]) -> list[str]:
    return candidates(str(body["messages"][-1]["content"]))


def rows_section(result: RecallResult) -> str:
    return render_pack(result.pack).split("MEMORY ROWS", 1)[1]


# ----------------------------------------------------------------------------------------------
# Select / Expand / ASK / Project / Answer through the LLM


async def test_select_prompt_carries_pool_and_llm_ranking_orders_evidence(
    engine: MemoryEngine, team: Scope, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    conv = await seed(engine, team)
    mid_of = {text: mid for mid, _, text in conv}
    question = "When is the launch happening?"
    baseline = await RecallPipeline(engine).run(RecallRequest(question, team))

    picked: list[str] = []

    def select(body: dict[str, Any]) -> Item:
        cands = candidates_of(body)
        picked.extend(mid_of[t] for t in reversed(cands))  # the reverse of the fused order
        return Reply(content=f'{{"ranking": {list(range(len(cands), 0, -1))}, "expand": []}}')

    router = Router(llm_server, select=select)
    result = await RecallPipeline(engine, llm=llm).run(RecallRequest(question, team))

    prompt = router.user_prompt("select")
    assert f"<question>\n{question}\n</question>" in prompt
    for mid in baseline.trace.s1_evidence:  # the recalled candidates are in the prompt
        assert next(t for m, _, t in conv if m == mid) in prompt
    assert sum(t in prompt for m, _, t in conv if m.startswith("launch")) >= 8
    assert result.trace.select == "llm"
    assert result.trace.s1_evidence == picked[:10]
    assert result.trace.s1_evidence != baseline.trace.s1_evidence
    assert [e.message_id for e in result.pack.excerpts if e.track == "s1"] == picked[:10]


async def test_select_expand_adds_neighbour_turns_outside_the_pool(
    engine: MemoryEngine, team: Scope, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    conv = await seed(engine, team)
    position = {text: i for i, (_, _, text) in enumerate(conv)}
    chosen: dict[str, Any] = {}

    def select(body: dict[str, Any]) -> Item:
        cands = candidates_of(body)
        in_pool = {position[t] for t in cands}
        # an anchor with a neighbour turn that the pool lacks (so only Expand can add it)
        for j, text in enumerate(cands):
            outside = [
                p
                for p in (position[text] - 1, position[text] + 1)
                if 0 <= p < len(conv) and p not in in_pool
            ]
            if outside:
                chosen.update(
                    anchor=conv[position[text]][0], neighbours=[conv[p][0] for p in outside]
                )
                ranking = [j + 1] + [i for i in range(1, len(cands) + 1) if i != j + 1]
                return Reply(content=f'{{"ranking": {ranking}, "expand": [{j + 1}]}}')
        raise AssertionError("every candidate's neighbours are already in the pool")

    Router(llm_server, select=select)
    result = await RecallPipeline(engine, llm=llm).run(
        RecallRequest("What was said about the launch review and the press kit?", team)
    )
    evidence = result.trace.s1_evidence
    assert result.trace.select == "llm"
    assert result.trace.anchors == [chosen["anchor"]]
    assert evidence[0] == chosen["anchor"]
    for mid in chosen["neighbours"]:
        assert mid in evidence[1:3]  # right after its anchor
    assert len(evidence) <= 10


@pytest.mark.parametrize(
    "reply",
    [
        Garbage(),
        Reply(content='{"ranking": [3, 1, 2', finish_reason="length"),
        Reply(content='{"ranking": [0, 41, 99, -2], "expand": [77]}'),
        Reply(content='{"ranking": "the first one", "expand": []}'),
        Reply(content='["not", "an", "object"]'),
        Reply(content="I cannot rank these."),
    ],
    ids=["garbage", "truncated", "out-of-range", "wrong-type", "array", "prose"],
)
async def test_unusable_select_reply_falls_back_to_fused_order(
    engine: MemoryEngine, team: Scope, llm_server: LLMServer, llm: OpenAICompatLLM, reply: Item
) -> None:
    await seed(engine, team)
    question = "What did Bob say about the launch plan?"
    baseline = await RecallPipeline(engine).run(RecallRequest(question, team))
    Router(llm_server, select=reply)
    result = await RecallPipeline(engine, llm=llm).run(RecallRequest(question, team))
    assert result.trace.select == "fused (llm reply unusable)"
    assert result.trace.anchors == []
    assert result.trace.s1_evidence == baseline.trace.s1_evidence
    assert result.answer.citations  # still answers (extractively: the answer reply was empty)


async def test_ask_term_brings_in_a_message_the_first_pool_lacked(
    tmp_path: Path, team: Scope, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    # No embedder: the first pool is then exactly the lexical matches and their context
    # turns, so "the target is not in it" holds by construction, not by vector luck.
    engine = await MemoryEngine.open(make_config(tmp_path), None)
    try:
        events = [
            msg(team, "v1", "Alice", "We still need to pick a venue for the offsite.", 0),
            msg(team, "v2", "Bob", "Venue ideas welcome, the budget is small.", 1),
            msg(team, "v3", "Carol", "Any venue near the station works for me.", 2),
        ]
        events += [
            msg(team, f"x{i}", PEOPLE[i % 4], f"{CHATTER[i % 16]} talk {i}", 60 + i)
            for i in range(20)
        ]
        events.append(
            msg(
                team,
                "target",
                "Dave",
                "Booked the Zanzibar hall for the offsite on the twelfth.",
                200,
            )
        )
        events += [
            msg(team, f"y{i}", PEOPLE[i % 4], f"{CHATTER[i % 16]} again {i}", 260 + i)
            for i in range(20)
        ]
        await engine.ingest_many(events)
        router = Router(
            llm_server, sufficiency=Reply(content='{"enough": false, "ask": "Zanzibar hall"}')
        )
        result = await RecallPipeline(engine, llm=llm, config=RecallConfig(ask=True)).run(
            RecallRequest("Which venue did we settle on?", team)
        )
        target_text = "Booked the Zanzibar hall"
        assert target_text not in router.user_prompt("select")  # not in the first pool
        assert "venue" in router.user_prompt("sufficiency").lower()
        assert result.trace.ask == "Zanzibar hall"
        assert "target" in result.trace.s1_evidence
        assert any(target_text in e.text for e in result.pack.excerpts)

        # enough=true: no second recall, the target stays out
        router.routes["sufficiency"] = Reply(content='{"enough": true, "ask": null}')
        again = await RecallPipeline(engine, llm=llm, config=RecallConfig(ask=True)).run(
            RecallRequest("Which venue did we settle on?", team)
        )
        assert again.trace.ask is None and "target" not in again.trace.s1_evidence
    finally:
        await engine.close()
