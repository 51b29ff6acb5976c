"""Answer metrics: set-based token F1, evidence recall, and the judge prompt helpers."""

from __future__ import annotations

import pytest

from speakermem.memory.eval.answer_metrics import (
    JUDGE_PROMPT_VERSION,
    JUDGE_SCHEMA,
    all_hit,
    evidence_recall,
    parse_judgement,
    render_judge_messages,
    token_f1,
)


def test_token_f1_exact_and_trailing_period_and_case() -> None:
    assert token_f1("Paris", "paris.") == 1.0
    assert token_f1("  The   Blue  Car.  ", "the blue car") == 1.0
    assert token_f1("Paris...", "paris") == 1.0


def test_token_f1_partial() -> None:
    # pred {in, paris} vs ref {paris}: P = 1/2, R = 1, F = 2/3.
    assert token_f1("in Paris", "Paris") == pytest.approx(2 / 3)


def test_token_f1_uses_sets_not_multisets() -> None:
    # Duplicates collapse: {paris} vs {paris} = 1.0 (a multiset F1 would give 2/3).
    assert token_f1("Paris Paris", "Paris") == 1.0


def test_token_f1_empty_and_no_overlap() -> None:
    assert token_f1("", "paris") == 0.0
    assert token_f1("paris", "  ") == 0.0
    assert token_f1(".", ".") == 0.0
    assert token_f1("london", "paris") == 0.0


def test_token_f1_keeps_inner_punctuation() -> None:
    # Only trailing periods are stripped, as in the reference implementation.
    assert token_f1("paris,", "paris") == 0.0


def test_evidence_recall_and_all_hit() -> None:
    gold = {"m1", "m2"}
    retrieved = ["m9", "m1", "m3", "m2"]
    assert evidence_recall(gold, retrieved, k=2) == 0.5
    assert evidence_recall(gold, retrieved, k=4) == 1.0
    assert evidence_recall(gold, retrieved, k=1) == 0.0
    assert evidence_recall(gold, retrieved, k=2, any_of=True) == 1.0
    assert evidence_recall(gold, retrieved, k=1, any_of=True) == 0.0
    assert not all_hit(gold, retrieved, k=3)
    assert all_hit(gold, retrieved, k=4)
    assert all_hit(gold, retrieved, k=2, any_of=True)
    assert not all_hit(gold, retrieved, k=1, any_of=True)
    assert evidence_recall({"m1"}, ["m1", "m1"], k=10) == 1.0  # k beyond the list is fine


def test_evidence_recall_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        evidence_recall(set(), ["m1"], k=5)
    with pytest.raises(ValueError):
        all_hit({"m1"}, ["m1"], k=0)


def test_render_judge_messages() -> None:
    messages = render_judge_messages("Where does Bob live?", "Berlin", "He lives in Berlin.")
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Where does Bob live?" in user
    assert "Berlin" in user
    assert "He lives in Berlin." in user
    assert "CORRECT" in messages[0]["content"] and "WRONG" in messages[0]["content"]
    assert isinstance(JUDGE_PROMPT_VERSION, str) and JUDGE_PROMPT_VERSION
    empty = render_judge_messages("q", "a", "  ")
    assert "(empty)" in empty[1]["content"]


def test_judge_schema_shape() -> None:
    assert JUDGE_SCHEMA["required"] == ["label", "reason"]
    assert JUDGE_SCHEMA["properties"]["label"]["enum"] == ["CORRECT", "WRONG"]
    assert JUDGE_SCHEMA["additionalProperties"] is False


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"label": "CORRECT", "reason": "same city"}, True),
        ({"label": "WRONG", "reason": "different city"}, False),
        ({"label": " correct "}, True),
        ({"label": "MAYBE", "reason": "x"}, None),
        ({"label": 1}, None),
        ({"reason": "no label"}, None),
        ({}, None),
        (None, None),
        (["CORRECT"], None),
    ],
)
def test_parse_judgement(data, expected) -> None:
    assert parse_judgement(data) is expected
