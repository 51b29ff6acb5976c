"""Speaker ranking defects (issue 11) on a real store: names whose parts the query tokenizer
drops, a named person with no issue word, and roster names that are ordinary words."""

from __future__ import annotations

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.search.fts_query import build_match
from speakermem.memory.store.messages import speaker_phrase
from tests.conftest import msg

pytestmark = pytest.mark.contract


@pytest.fixture
def stage() -> Scope:
    return Scope(platform="test", workspace="w1", channel="stage")


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("Girl's Voice", '"Girl\'s Voice"'),
        ("j_doe", '"j_doe"'),
        ("A  B", '"A B"'),
        ("🙂", ""),
        ('say "hi"', '"say ""hi"""'),
    ],
)
def test_speaker_phrase_quotes_the_whole_name(name: str, phrase: str) -> None:
    assert speaker_phrase(name) == phrase


async def _seed(engine: MemoryEngine, scope: Scope) -> None:
    rows = [
        ("Girl's Voice", "The wedding cake is in the van"),
        ("j_doe", "The wedding is at noon"),
        ("Ross", "The wedding cake was delicious"),
        ("Ross", "I love dinosaurs"),
        ("Monica", "a man at the door asked for Ross"),
        ("Monica", "that man is weird"),
        ("Rachel", "the man from the bakery called"),
        ("Man", "Excuse me, is this the Geller wedding?"),
    ]
    for i, (who, text) in enumerate(rows):
        await engine.ingest(
            msg(scope, f"m{i}", who, text, i).model_copy(
                update={"speaker_id": who.lower().replace("'", "").replace(" ", "_")}
            )
        )
    await engine.embed_pending()


@pytest.mark.parametrize(
    ("who", "uid", "mid"), [("Girl's Voice", "girls_voice", "m0"), ("j_doe", "j_doe", "m1")]
)
async def test_speaker_filter_matches_names_with_stop_words_and_one_letter_parts(
    engine: MemoryEngine, stage: Scope, who: str, uid: str, mid: str
) -> None:
    await _seed(engine, stage)
    pks = await engine.channel_pks([stage])
    hits = await engine.store.messages.lexical(
        build_match("wedding"), pks, 10, speakers=[uid], speaker_names=[who]
    )
    got = await engine.store.messages.get_many([pk for pk, _ in hits])
    assert [m.message_id for m in got.values()] == [mid]


async def test_named_person_without_an_issue_word_is_ranked_by_dense_similarity(
    engine: MemoryEngine, stage: Scope
) -> None:
    await _seed(engine, stage)
    question = (
        "What does Ross love?"  # "love" is in one of Ross's messages, but not as BM25 sees it
    )
    cfg = engine.config.recall
    on = await RecallPipeline(
        engine, config=cfg.model_copy(update={"speaker_dense": "always"})
    ).run(RecallRequest(question=question, scope=stage), answer=False)
    assert on.trace.rankings.get("speaker_dense") == 2  # both of Ross's messages, none else
    off = await RecallPipeline(engine, config=cfg.model_copy(update={"speaker_dense": "off"})).run(
        RecallRequest(question=question, scope=stage), answer=False
    )
    assert "speaker_dense" not in off.trace.rankings
    # a speaker with more messages than the cap is left to the general dense ranking
    capped = cfg.model_copy(update={"speaker_dense": "always", "speaker_dense_max_messages": 1})
    res = await RecallPipeline(engine, config=capped).run(
        RecallRequest(question=question, scope=stage), answer=False
    )
    assert "speaker_dense" not in res.trace.rankings


async def test_fallback_mode_ranks_by_dense_only_when_bm25_finds_nothing(
    engine: MemoryEngine, stage: Scope
) -> None:
    await _seed(engine, stage)
    pipe = RecallPipeline(
        engine, config=engine.config.recall.model_copy(update={"speaker_dense": "fallback"})
    )
    found = await pipe.run(RecallRequest("What did Ross say about the cake?", stage), answer=False)
    assert found.trace.rankings.get("speaker", 0) >= 1
    assert "speaker_dense" not in found.trace.rankings
    none = await pipe.run(RecallRequest("What did Ross say about reptiles?", stage), answer=False)
    assert "speaker" not in none.trace.rankings
    assert none.trace.rankings.get("speaker_dense") == 2


async def test_a_roster_name_the_channel_writes_in_lower_case_is_not_a_person(
    engine: MemoryEngine, stage: Scope
) -> None:
    await _seed(engine, stage)
    pks = await engine.channel_pks([stage])
    assert await engine.store.messages.lowercase_share("man", pks) == (3, 1.0)
    seen, lower = await engine.store.messages.lowercase_share("ross", pks)
    assert seen == 1 and lower == 0.0
    pipe = RecallPipeline(engine)
    res = await pipe.run(RecallRequest("What did the man at the door want?", stage), answer=False)
    assert res.trace.projection["speakers"] == []
    assert "man" in res.trace.projection["issue"].split()
    named = await pipe.run(RecallRequest("What did Man ask about?", stage), answer=False)
    assert named.trace.projection["speakers"] == ["man"]
