"""Pure search pieces: the FTS5 query builder, reciprocal-rank fusion, session placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.search.fts_query import build_match, query_terms
from speakermem.memory.search.fusion import rrf
from speakermem.memory.sessions import ChannelCursor, place_message
from tests.conftest import make_config, msg

pytestmark = pytest.mark.contract

HOSTILE = [
    'he said "hello',
    "NEAR(alpha beta, 2)",
    "alpha* OR beta AND NOT gamma",
    "text:secret ^start",
    "\"\"\"''' ;; -- DROP TABLE messages;",
    "(((",
    "café naïve 東京 😀 emoji",
    "",
    "   ",
    "the of and to",
    "a" * 10_000,
    ("lorem ipsum dolor " * 600)[:10_240],
    "\x00\x01 control chars",
    "col:umn {braces} [brackets] - + ~",
]


def test_query_terms_drop_stopwords_and_duplicates() -> None:
    assert query_terms("What did the Team decide about the team budget?") == [
        "team",
        "decide",
        "budget",
    ]


def test_build_match_quotes_every_term() -> None:
    assert build_match('NEAR( "x" alpha*') == '"near" OR "alpha"'
    assert build_match("the of and") == ""
    assert build_match('say "hi"') == '"say"'  # 'hi' is a stop-word
    assert build_match("ab", extra=["Caroline's"]) == '"ab" OR "caroline"'


@pytest.mark.parametrize("text", HOSTILE)
async def test_hostile_queries_are_valid_fts5(tmp_path: Path, text: str) -> None:
    scope = Scope(platform="t", workspace="w", channel="c")
    eng = await MemoryEngine.open(make_config(tmp_path))
    try:
        await eng.ingest_many([msg(scope, "m1", "Al", "alpha beta café 東京 lorem", 0)])
        hits = await eng.search(text, [scope], mode="lexical")
        assert {h.message.message_id for h in hits} <= {"m1"}
        # the hostile part is neutralised, not the whole query: a real word beside it matches
        found = await eng.search("alpha " + text, [scope], mode="lexical")
        assert [h.message.message_id for h in found] == ["m1"]
    finally:
        await eng.close()


def test_rrf_on_hand_built_lists() -> None:
    fused = rrf([["a", "b", "c"], ["c", "a", "d"]], k0=60)
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [k for k, _ in fused] == ["a", "c", "b", "d"]


def test_rrf_weights_limit_ties_and_duplicates() -> None:
    assert [k for k, _ in rrf([["a"], ["b"]], k0=60, weights=[1.0, 2.0])] == ["b", "a"]
    # a tie: the first seen wins
    assert [k for k, _ in rrf([["x", "y"], ["y", "x"]], k0=60)] == ["x", "y"]
    assert rrf([["a", "a", "b"]], k0=1)[0] == ("a", 0.5)  # a duplicate counts once
    assert len(rrf([list("abcdef")], k0=60, limit=3)) == 3
    assert rrf([], k0=60) == []
    with pytest.raises(ValueError):
        rrf([["a"]], k0=60, weights=[1.0, 2.0])


def test_place_message_sessions_and_turns() -> None:
    c = ChannelCursor(None, 0, 0)
    p = place_message(c, 100.0, gap_seconds=60)
    assert (p.session_id, p.turn_index, p.new_session) == (1, 0, True)
    p = place_message(p.cursor, 130.0, gap_seconds=60)
    assert (p.session_id, p.turn_index, p.new_session) == (1, 1, False)
    late = place_message(p.cursor, 90.0, gap_seconds=60)  # out of order: same session
    assert (late.session_id, late.turn_index) == (1, 2)
    assert late.cursor.last_ts == 130.0
    gap = place_message(late.cursor, 191.0, gap_seconds=60)
    assert (gap.session_id, gap.turn_index) == (2, 0)
    forced = place_message(gap.cursor, 192.0, gap_seconds=60, force_break=True)
    assert (forced.session_id, forced.turn_index) == (3, 0)
