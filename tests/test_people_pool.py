"""/recall's people path and broad fusion on a real store, both backends: a question about a
named person's change finds their own words, which the word rankings miss."""

from __future__ import annotations

import pytest

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg

pytestmark = pytest.mark.contract

QUESTION = "What does the chat reveal about how Ruth's attitude to sketching changed?"
GOLD = {"r1", "r2", "r3"}


async def seed(engine: MemoryEngine, scope: Scope) -> None:
    """Eight members; the others talk about the chat and sketching (the question's framing
    words), Ruth's own messages say how she changed without those words."""
    events = []
    t = 0.0
    others = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay"]
    for i in range(36):
        who = others[i % len(others)]
        events.append(
            msg(scope, f"o{i}", who, f"the chat thread about sketching gear number {i}", t)
        )
        t += 1
    ruth = [
        "I used to think drawing planets at the eyepiece was a waste of a clear night honestly",
        "after the dark site weekend I keep a notebook of every planet I observe now",
        "my notebook pages are the best record I have of what I saw that season",
    ]
    for n, text in enumerate(ruth, start=1):
        events.append(msg(scope, f"r{n}", "Ruth", text, t))
        t += 30
    events.append(msg(scope, "m1", "Marcus", "nice one", t))
    await engine.ingest_many(events)
    await engine.embed_pending()


async def evidence(engine: MemoryEngine, scope: Scope, cfg: RecallConfig) -> set[str]:
    result = await RecallPipeline(engine, config=cfg).run(
        RecallRequest(QUESTION, scope), answer=False
    )
    assert result.trace.breadth == "change"
    return set(result.pack.s1_message_ids()[: cfg.top_k])


async def test_a_change_question_finds_the_named_persons_own_words(
    engine: MemoryEngine, scope: Scope
) -> None:
    await seed(engine, scope)
    on = await evidence(engine, scope, RecallConfig())
    off = await evidence(engine, scope, RecallConfig(people_rank=False))
    assert GOLD.issubset(on)
    assert not GOLD.issubset(off)  # the word rankings fill the places with the framing words


async def test_the_broad_lexical_weight_changes_the_fusion_of_a_question_naming_nobody(
    engine: MemoryEngine, scope: Scope
) -> None:
    await seed(engine, scope)
    question = "Did the attitude of the whole group to sketching change over the sessions?"
    got = {}
    for weight in (1.0, 0.0):
        result = await RecallPipeline(engine, config=RecallConfig(broad_lexical_weight=weight)).run(
            RecallRequest(question, scope), answer=False
        )
        assert result.trace.breadth == "change"
        got[weight] = result.pack.s1_message_ids()[:10]
    assert got[1.0] != got[0.0]
