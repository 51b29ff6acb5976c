"""Answers whose every claim is supported (issue 11): claim splitting and checking, and the
whole /recall path with the real openai client against the scripted LLM server feeding
answers that cite the wrong message."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.claims import ABSTAIN, check_claims, split_claims
from speakermem.memory.query.compose import EvidencePack, Excerpt
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg
from tests.llm_server import Handler, Item, LLMServer, Reply

pytestmark = pytest.mark.contract

SCOPE = Scope(platform="test", workspace="w1", channel="plans")


def _pack(*texts: tuple[str, str]) -> EvidencePack:
    return EvidencePack(
        question="q",
        tense="head",
        excerpts=[
            Excerpt(
                n=i + 1,
                scope=SCOPE,
                message_id=f"m{i + 1}",
                thread_id=None,
                speaker_id=who.lower(),
                speaker=who,
                time=datetime(2024, 5, 3, tzinfo=UTC),
                text=text,
                track="s1",
            )
            for i, (who, text) in enumerate(texts)
        ],
        rows=[],
    )


PACK = _pack(
    ("Alice", "I booked the cabin at Lake Tahoe for the retreat"),
    ("Bob", "I'll bring the kayaks and the grill"),
    ("Carol", "my flight lands Friday at noon"),
)


def test_split_claims_keeps_markers_with_their_sentence() -> None:
    claims = split_claims("Alice booked a cabin [1]. Bob brings kayaks. [2] Carol lands Friday")
    assert [(c.text, c.cites) for c in claims] == [
        ("Alice booked a cabin [1].", (1,)),
        ("Bob brings kayaks. [2]", (2,)),
        ("Carol lands Friday", ()),
    ]
    bullets = split_claims("Here is what I found:\n• cabin [1]\n• kayaks [2]")
    assert [c.new_line for c in bullets] == [False, True, True]


def test_supported_claims_are_kept_verbatim() -> None:
    text = "Alice booked the cabin at Lake Tahoe [1]. Bob brings the kayaks [2]."
    report = check_claims(text, PACK)
    assert report.text == text
    assert (report.checked, report.dropped, report.rewritten) == (2, 0, 0)


def test_a_claim_citing_the_wrong_message_is_re_cited_to_the_one_that_supports_it() -> None:
    report = check_claims("Bob will bring the kayaks and the grill [3].", PACK)
    assert report.text == "Bob will bring the kayaks and the grill [2]."
    assert report.rewritten == 1 and report.dropped == 0


def test_unsupported_and_uncited_claims_are_dropped() -> None:
    text = "Alice booked the cabin [1]. Dave is bringing a sailing boat [2]. It costs $400."
    report = check_claims(text, PACK)
    assert report.text == "Alice booked the cabin [1]."
    assert (report.checked, report.dropped) == (3, 2)


def test_nothing_supported_abstains_with_the_closest_messages() -> None:
    report = check_claims("Dave is bringing a sailing boat [2].", PACK)
    assert report.abstained
    assert report.text.startswith(ABSTAIN)
    assert re.findall(r"\[(\d)\]", report.text) == ["1", "2", "3"]


def test_framing_alone_is_not_an_answer() -> None:
    assert check_claims("Here is what I found:", PACK).abstained
    kept = check_claims("Here is what I found:\n• Carol's flight lands Friday [3]", PACK)
    assert kept.text == "Here is what I found:\n• Carol's flight lands Friday [3]"


def test_dates_of_the_cited_message_support_a_dated_claim() -> None:
    assert not check_claims("On 3 May 2024 Carol said her flight lands Friday [3].", PACK).dropped


# ---- through /recall with the LLM test server ----------------------------------------------


@pytest.fixture
async def llm(llm_server: LLMServer) -> AsyncIterator[OpenAICompatLLM]:
    client = OpenAICompatLLM(llm_server.base_url, "test-key", "test-model", 5.0, max_retries=0)
    try:
        yield client
    finally:
        await client.aclose()


def _answer_with(answer: Any) -> Handler:
    """JSON stages get `{}` (each falls back); the free-text answer stage gets `answer`."""

    def route(body: dict[str, Any]) -> Item:
        if body.get("response_format"):
            return Reply(content="{}")
        return Reply(content=answer(body) if callable(answer) else answer)

    return Handler(route)


def _number_of(body: dict[str, Any], needle: str) -> int:
    prompt = str(body["messages"][-1]["content"])
    for line in prompt.splitlines():
        m = re.match(r"\s*\[(\d+)\]", line)
        if m and needle in line:
            return int(m[1])
    raise AssertionError(f"{needle!r} not in the pack:\n{prompt}")


async def _seed(engine: MemoryEngine) -> None:
    rows = [
        ("Alice", "I booked the cabin at Lake Tahoe for the retreat"),
        ("Bob", "I'll bring the kayaks and the grill for the retreat"),
        ("Carol", "my flight for the retreat lands Friday at noon"),
    ]
    for i, (who, text) in enumerate(rows):
        await engine.ingest(msg(SCOPE, f"m{i}", who, text, i))
    await engine.embed_pending()


async def test_recall_re_cites_an_answer_that_cites_the_wrong_message(
    engine: MemoryEngine, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    await _seed(engine)

    def wrong(body: dict[str, Any]) -> str:
        cabin, flight = _number_of(body, "cabin"), _number_of(body, "flight")
        return f"Alice booked the cabin at Lake Tahoe [{flight}]. Carol lands Friday [{cabin}]."

    llm_server.default = _answer_with(wrong)
    res = await RecallPipeline(engine, llm=llm).run(RecallRequest("Who does what?", SCOPE))
    assert res.answer.used_llm
    assert res.trace.claims == {
        "checked": 2,
        "dropped": 0,
        "rewritten": 2,
        "misattributed": 0,
        "abstained": 0,
    }
    by_n = {c.n: c.message_id for c in res.answer.citations}
    cited = re.findall(r"\[(\d+)\]", res.answer.text)
    assert [by_n[int(n)] for n in cited] == ["m0", "m2"]


async def test_recall_abstains_when_no_claim_is_supported(
    engine: MemoryEngine, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    await _seed(engine)
    llm_server.default = _answer_with("Dave is sailing to Hawaii on a yacht [1].")
    res = await RecallPipeline(engine, llm=llm).run(RecallRequest("Who brings what?", SCOPE))
    assert res.answer.text.startswith(ABSTAIN)
    assert res.trace.claims["abstained"] == 1 and res.trace.claims["dropped"] == 1
    assert res.trace.dropped_claims == ["Dave is sailing to Hawaii on a yacht [1]."]
    assert res.answer.citations  # the closest messages, linked


async def test_claim_check_off_keeps_the_answer(
    engine: MemoryEngine, llm_server: LLMServer, llm: OpenAICompatLLM
) -> None:
    await _seed(engine)
    llm_server.default = _answer_with("Dave is sailing to Hawaii on a yacht [1].")
    cfg = engine.config.recall.model_copy(update={"check_claims": False})
    res = await RecallPipeline(engine, llm=llm, config=cfg).run(
        RecallRequest("Who brings what?", SCOPE)
    )
    assert res.answer.text == "Dave is sailing to Hawaii on a yacht [1]."
    assert res.trace.claims == {}


def test_eval_reports_the_dropped_claim_rate() -> None:
    from speakermem.memory.datasets.common import EvalQuestion
    from speakermem.memory.eval.harness import QuestionResult, claim_rates

    q = EvalQuestion(id="1", scope=SCOPE, question="q", answer="a", category="c")
    results = [
        QuestionResult(q, {}, claims={"checked": 3, "dropped": 1, "rewritten": 1, "abstained": 0}),
        QuestionResult(q, {}, claims={"checked": 1, "dropped": 1, "rewritten": 0, "abstained": 1}),
        QuestionResult(q, {}),  # extractive answer: nothing to check
    ]
    assert claim_rates(results) == {
        "claims_checked": 4,
        "dropped_claim_rate": 0.5,
        "rewritten_claim_rate": 0.25,
        "abstained": 1,
    }
    assert claim_rates([QuestionResult(q, {})])["dropped_claim_rate"] is None
