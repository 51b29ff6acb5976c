"""Pure System 1 rules: length-normalised session BM25, the dominant-session gate, focus order."""

from __future__ import annotations

import pytest

from speakermem.memory.query.system1 import (
    dominant_session,
    focus_ranking,
    phrase_match,
    session_bm25,
)


def test_session_bm25_without_lengths_is_plain_saturated_tf() -> None:
    counts = {"ross": {"s1": 3, "s2": 1}, "emily": {"s1": 1}}
    plain = session_bm25(counts, 10)
    assert plain["s1"] > plain["s2"] > 0
    # b has no effect without lengths
    assert session_bm25(counts, 10, b=0.5) == plain


def test_session_bm25_length_normalisation_penalises_long_sessions() -> None:
    counts = {"ross": {"long": 4, "short": 3}}
    lengths = {"long": 60, "short": 10}
    flat = session_bm25(counts, 10, lengths=lengths, b=0.0)
    normed = session_bm25(counts, 10, lengths=lengths, b=0.5)
    assert flat["long"] > flat["short"]
    assert normed["short"] > normed["long"]


def test_session_bm25_scores_only_sessions_with_lengths_but_keeps_global_idf() -> None:
    counts = {"tea": {"a": 1, "b": 1, "c": 1}}
    only_a = session_bm25(counts, 10, lengths={"a": 5})
    assert set(only_a) == {"a"}
    # IDF still reflects df=3 over the channel, not df=1 over the scored sessions
    assert only_a["a"] == pytest.approx(session_bm25(counts, 10)["a"])


def test_session_bm25_mean_length_scores_like_unnormalised() -> None:
    counts = {"x": {"a": 2, "b": 1}}
    lengths = {"a": 8, "b": 8}
    assert session_bm25(counts, 5, lengths=lengths, b=0.75) == pytest.approx(
        session_bm25(counts, 5)
    )


@pytest.mark.parametrize(
    ("scores", "margin", "expected"),
    [
        ({}, 1.5, None),
        ({"a": 0.0}, 1.5, None),
        ({"a": 3.0}, 1.5, "a"),
        ({"a": 3.0, "b": 2.0}, 1.5, "a"),
        ({"a": 2.9, "b": 2.0}, 1.5, None),
        ({"b": 2.0, "a": 6.0, "c": 1.0}, 2.0, "a"),
        ({"a": 1.0, "b": 0.0}, 1.5, "a"),
    ],
)
def test_dominant_session_gate(
    scores: dict[str, float], margin: float, expected: str | None
) -> None:
    assert dominant_session(scores, margin=margin) == expected


def test_focus_ranking_orders_by_fused_score_then_distance_from_best_pick() -> None:
    fused = [(100, 0.9), (7, 0.5), (5, 0.2)]  # 100 is in another session
    members = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 7}
    order = focus_ranking(fused, members)
    assert order[:2] == [7, 5]  # pooled turns first, best first
    assert order[2:4] == [6, 8]  # then the turns next to the best pick (turn 6)
    assert 100 not in order
    assert sorted(order) == sorted(members)


def test_focus_ranking_empty_session() -> None:
    assert focus_ranking([(1, 1.0)], {}) == []


def test_focus_ranking_without_pooled_turns_starts_at_session_start() -> None:
    assert focus_ranking([], {10: 2, 11: 0, 12: 1}) == [11, 12, 10]


def test_phrase_match_pairs_adjacent_content_words() -> None:
    assert phrase_match("Why did Ross count faster?") == '"ross count" OR "count faster"'
    assert phrase_match("Ross?") == ""
