"""Retrieval that understands group structure: how much of a channel a question spans, the
spread of its evidence over sessions and speakers, and two named people's exchanges."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import RosterMember, Scope
from speakermem.memory.query.breadth import question_breadth
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.projection import fallback_projection
from speakermem.memory.query.spread import spread
from tests.conftest import make_config, msg
from tests.fakes import HashEmbedder

ROSTER = [
    RosterMember(user_id=uid, display_name=name)
    for uid, name in (("maya", "Maya"), ("sam", "Sam"), ("jordan", "Jordan"), ("lena", "Lena"))
]


@pytest.mark.parametrize(
    ("question", "breadth"),
    [
        ("What does Sam's behaviour at dinner suggest about their food preferences?", "person"),
        ("What is the relationship between Maya and Lena?", "person"),
        ("Based on the conversations, what can you tell about Jordan?", "person"),
        ("How did Jordan's role in planning change over the sessions?", "change"),
        ("Did Maya's view on drinks change?", "change"),
        ("Has Sam's approach shifted since spring?", "change"),
        ("What was each member's position on the party?", "group"),
        ("The group has a norm of replying fast. Does everyone follow it?", "group"),
        # one exchange
        ("Where did Maya say the ramen place was?", "one"),
        ("What did Sam say about the colors and patterns on the mugs?", "one"),
        ("What is Chandler changing the name of the Abbey to?", "one"),
        ("What did Lena bring for everyone at the party?", "one"),
        ("Why is everyone at the church?", "one"),
        ("What preferences do people have?", "one"),  # a trait, but of nobody named
    ],
)
def test_question_breadth(question: str, breadth: str) -> None:
    assert question_breadth(question, fallback_projection(question, ROSTER)) == breadth


def test_spread_caps_each_group_within_the_budget() -> None:
    group = {1: "s1", 2: "s1", 3: "s1", 4: "s1", 5: "s2", 6: "s3"}
    # at most two per session among the first four; the held-back keep their order after
    assert spread([1, 2, 3, 4, 5, 6], group, cap=2, top_k=4) == [1, 2, 5, 6, 3, 4]
    # nothing else to take: the budget is filled from the held-back, in order
    assert spread([1, 2, 3, 4], group, cap=2, top_k=4) == [1, 2, 3, 4]
    # items without a group are never held back; cap 0 changes nothing
    assert spread([1, 2, 3, 9], group, cap=1, top_k=3) == [1, 9, 2, 3]
    assert spread([1, 2, 3], group, cap=0, top_k=2) == [1, 2, 3]


SCOPE = Scope(platform="test", workspace="w", channel="supper")


async def _channel(tmp_path: Path) -> MemoryEngine:
    """Maya's drinking over two sessions a week apart; the first is long and all about
    drinks, so it alone would fill a small evidence budget."""
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    first = [
        ("Maya", "wine tasting on friday, I love a good red wine"),
        ("Sam", "red wine with dinner sounds great"),
        ("Maya", "I'll bring two bottles of wine, the red one"),
        ("Jordan", "wine is fine by me"),
        ("Maya", "wine and cheese then, I can't wait for the red"),
        ("Lena", "I'll bring cheese for the wine"),
    ]
    second = [
        ("Maya", "I'll just have sparkling water tonight, no wine for me"),
        ("Lena", "are you still off wine? I'll find a mocktail"),
    ]
    events = [msg(SCOPE, f"a{i}", who, text, i) for i, (who, text) in enumerate(first)]
    events += [
        msg(SCOPE, "b0", "Maya", second[0][1], 7 * 24 * 60),
        # a platform reply: Lena answers Maya (reply link and addressee, as Discord stores it)
        msg(
            SCOPE, "b1", "Lena", second[1][1], 7 * 24 * 60 + 1, reply_to="b0", addressees=("maya",)
        ),
    ]
    await engine.ingest_many(events)
    await engine.embed_pending()
    (pk,) = await engine.channel_pks([SCOPE])
    names = interaction_names(await engine.members(SCOPE))
    while await engine.store.interactions.update(pk, names):
        pass
    return engine


async def test_a_change_question_draws_evidence_from_both_sessions(tmp_path: Path) -> None:
    engine = await _channel(tmp_path)
    question = "How did Maya's attitude to wine change over the sessions?"
    try:
        # the session cap of the fused ranking (the people model, on by default, ranks a
        # named person's change by its own model: tests/test_people_pool.py)
        fused = {"top_k": 4, "people_rank": False}
        capped = RecallPipeline(engine, config=RecallConfig(**fused, broad_session_cap=2))
        result = await capped.run(RecallRequest(question, SCOPE), answer=False)
        uncapped = RecallPipeline(engine, config=RecallConfig(**fused, broad_session_cap=0))
        plain = await uncapped.run(RecallRequest(question, SCOPE), answer=False)
    finally:
        await engine.close()
    assert result.trace.breadth == "change"
    sessions = {mid[0] for mid in result.pack.s1_message_ids()}
    # the cap keeps the first session from taking the whole budget: the later one is there
    assert sessions == {"a", "b"}
    assert sum(mid.startswith("a") for mid in result.pack.s1_message_ids()) <= 2
    assert sum(mid.startswith("a") for mid in plain.pack.s1_message_ids()) > 2


async def test_an_everyone_question_covers_several_speakers(tmp_path: Path) -> None:
    engine = await _channel(tmp_path)
    question = "What was each member's position on the wine?"
    try:
        spread_cfg = RecallConfig(top_k=4, group_speaker_cap=1)
        result = await RecallPipeline(engine, config=spread_cfg).run(
            RecallRequest(question, SCOPE), answer=False
        )
        plain = await RecallPipeline(engine, config=RecallConfig(top_k=4, group_speaker_cap=0)).run(
            RecallRequest(question, SCOPE), answer=False
        )
    finally:
        await engine.close()
    assert result.trace.breadth == "group"
    speakers = [e.speaker_id for e in result.pack.excerpts if e.track == "s1"]
    assert len(speakers) == 4 and len(set(speakers)) == 4
    assert len({e.speaker_id for e in plain.pack.excerpts if e.track == "s1"}) < 4


async def test_two_named_people_rank_their_exchanges(tmp_path: Path) -> None:
    engine = await _channel(tmp_path)
    try:
        result = await RecallPipeline(engine).run(
            RecallRequest(
                "What does the chat reveal about the relationship between Maya and Lena?", SCOPE
            ),
            answer=False,
        )
    finally:
        await engine.close()
    assert result.trace.breadth == "person"
    # what Maya and Lena said to each other is one ranking of the pool
    assert result.trace.rankings.get("relation", 0) >= 1
    assert "b1" in result.pack.s1_message_ids()
