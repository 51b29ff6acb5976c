"""SpeakerLevenshtein on hand-made states whose scores can be worked out on paper."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from speakermem.memory.eval.speaker_levenshtein import (
    SLResult,
    StateRecord,
    chain_score,
    content_score,
    format_report,
    from_derived,
    load_state,
    memory_reward,
    record_score,
    speaker_levenshtein,
    tokenize,
    update_edges,
)
from speakermem.memory.models import GROUP, DerivedRecord, Layer, RecordScope, RecordState, Scope


def rec(owner: str, content: str, source: str | None = None, layer: str = "profile", **kw):
    return StateRecord(owner=owner, source=source or owner, layer=layer, content=content, **kw)


ALICE = rec("Alice", "Alice is vegetarian")
BOB = rec("Bob", "Bob lives in Berlin")
GRP = rec(GROUP, "The team chose Postgres", layer="insight")


def test_perfect_state_scores_one() -> None:
    gold = [ALICE, BOB, GRP]
    result = speaker_levenshtein(list(reversed(gold)), gold)
    assert result.score == pytest.approx(1.0)
    assert all(s.f1 == pytest.approx(1.0) for s in result.per_owner.values())


def test_both_empty_scores_one_and_one_empty_scores_zero() -> None:
    assert speaker_levenshtein([], []).score == 1.0
    assert speaker_levenshtein([], [ALICE]).score == 0.0
    assert speaker_levenshtein([ALICE], []).score == 0.0


def test_missing_owner_exact_value() -> None:
    # Owners {Alice, Bob, GROUP}. Alice and GROUP match perfectly: F = 1 each.
    # Bob has gold but no prediction: F = 0. macro = 2/3, worst = 0.
    # score = 0.8 * 2/3 + 0.2 * 0 = 0.5333...
    result = speaker_levenshtein([ALICE, GRP], [ALICE, BOB, GRP])
    assert result.macro == pytest.approx(2 / 3)
    assert result.worst == 0.0
    assert result.score == pytest.approx(0.8 * 2 / 3)
    assert result.per_owner["bob"].n_pred == 0
    assert result.per_owner["bob"].n_gold == 1


def test_swapped_source_and_owner_scores_zero() -> None:
    gold = rec("Bob", "Bob is often late", source="Alice")  # Alice's view of Bob
    swapped = rec("Alice", "Bob is often late", source="Bob")
    wrong_source = rec("Bob", "Bob is often late", source="Carol")
    wrong_layer = rec("Bob", "Bob is often late", source="Alice", layer="core")
    for pred in (swapped, wrong_source, wrong_layer):
        assert record_score(pred, gold) == 0.0
        assert speaker_levenshtein([pred], [gold]).score == 0.0


def test_owner_and_source_compare_case_insensitively() -> None:
    pred = rec(" alice ", "Alice is vegetarian", source="ALICE")
    assert record_score(pred, ALICE) == pytest.approx(1.0)
    assert speaker_levenshtein([pred], [ALICE]).score == pytest.approx(1.0)
    group_lower = rec("group", GRP.content, layer="insight")
    assert speaker_levenshtein([group_lower], [GRP]).score == pytest.approx(1.0)


def test_over_writing_is_penalised() -> None:
    # One gold, two predictions (one exact, one unrelated): S = 1, P = 1/2, R = 1, F = 2/3.
    # A single owner, so macro = worst = 2/3 and the score is 2/3.
    extra = rec("Alice", "Alice owns a red bicycle")
    exact = speaker_levenshtein([ALICE], [ALICE])
    over = speaker_levenshtein([ALICE, extra], [ALICE])
    assert over.per_owner["alice"].precision == pytest.approx(0.5)
    assert over.per_owner["alice"].recall == pytest.approx(1.0)
    assert over.score == pytest.approx(2 / 3)
    assert over.score < exact.score


def test_partial_content_match() -> None:
    # Tokens 3 vs 3, overlap 2: token F1 = 2/3; SequenceMatcher ratio on the joined
    # strings "likes green tea" / "likes black tea" is 2*10/30 = 2/3. Blend = 2/3.
    a, b = "Likes green tea.", "likes black tea"
    assert content_score(a, b) == pytest.approx(2 / 3)
    score = speaker_levenshtein([rec("Alice", a)], [rec("Alice", b)]).score
    assert 0.0 < score < 1.0
    assert score == pytest.approx(2 / 3)


def test_one_prediction_cannot_match_two_golds() -> None:
    # Two near-identical golds, one prediction: S = 1 (one pair), P = 1, R = 1/2, F = 2/3.
    gold = [rec("Alice", "Alice likes tea"), rec("Alice", "Alice likes tea")]
    result = speaker_levenshtein([rec("Alice", "Alice likes tea")], gold)
    assert result.per_owner["alice"].matched == pytest.approx(1.0)
    assert result.score == pytest.approx(2 / 3)


def test_alignment_pairs_records_regardless_of_order() -> None:
    # Overlapping contents in crossed order: the optimum pairs p1-g2 and p2-g1 exactly,
    # so S = 2 and the state scores 1.
    g1, g2 = rec("Alice", "Alice likes green tea"), rec("Alice", "Alice likes tea")
    p1, p2 = rec("Alice", "Alice likes tea"), rec("Alice", "Alice likes green tea")
    assert speaker_levenshtein([p1, p2], [g1, g2]).score == pytest.approx(1.0)


def test_worst_owner_term_makes_a_bad_rare_owner_cost_more() -> None:
    # Alice has 9 gold records, all recovered; Bob has one, missed.
    # Pooled over records the state is 90% right, macro alone is 0.5, and the final score
    # 0.8 * 0.5 + 0.2 * 0 = 0.4 sits below both.
    alice = [rec("Alice", f"Alice fact number {word}") for word in "abcdefghi"]
    result = speaker_levenshtein(alice, [*alice, BOB])
    assert result.macro == pytest.approx(0.5)
    assert result.worst == 0.0
    assert result.score == pytest.approx(0.4)
    assert result.score < result.macro


def test_cjk_tokenisation() -> None:
    assert tokenize("我喜欢Tea-2") == ["我", "喜", "欢", "tea", "2"]
    assert tokenize("カタカナ 한국") == ["カ", "タ", "カ", "ナ", "한", "국"]
    assert tokenize("Café!!") == ["caf"]  # only [a-z0-9] runs count, as the seed specifies
    partial = content_score("我喜欢喝茶", "我喜欢咖啡")
    assert 0.0 < partial < 1.0
    assert content_score("我喜欢喝茶", "我 喜 欢 喝 茶") == pytest.approx(1.0)


def test_empty_contents() -> None:
    assert content_score("", "...") == 1.0
    assert content_score("", "tea") == 0.0


def edge(owner: str, old: str, new: str, layer: str = "profile") -> tuple:
    return (rec(owner, old, layer=layer), rec(owner, new, layer=layer))


def test_chain_score_basics() -> None:
    e = edge("Alice", "Alice lives in Paris", "Alice lives in Berlin")
    assert chain_score([], []) == 1.0
    assert chain_score([e], []) == 0.0
    assert chain_score([], [e]) == 0.0
    assert chain_score([e], [e]) == pytest.approx(1.0)
    assert chain_score([edge("Bob", e[0].content, e[1].content)], [e]) == 0.0
    assert chain_score([edge("Alice", e[0].content, e[1].content, layer="core")], [e]) == 0.0
    # Old node exact, new node different: 0.5 * 1 + 0.5 * partial, strictly inside (0.5, 1).
    half = chain_score([edge("Alice", "Alice lives in Paris", "Alice moved to Rome")], [e])
    assert 0.5 < half < 1.0
    # Two predicted edges for one gold edge: P = 1/2, R = 1, F = 2/3.
    assert chain_score([e, e], [e]) == pytest.approx(2 / 3)


def test_update_edges_and_memory_reward() -> None:
    old = rec("Alice", "Alice lives in Paris", id="1")
    new = rec("Alice", "Alice lives in Berlin", id="2", supersedes="1")
    dangling = rec("Alice", "Alice has a cat", id="3", supersedes="99")
    assert update_edges([old, new, dangling]) == [(old, new)]
    assert memory_reward(1.0, 0.0) == pytest.approx(0.8)
    assert memory_reward(0.5, 1.0) == pytest.approx(0.6)


def test_from_derived() -> None:
    now = datetime(2024, 1, 1, tzinfo=UTC)
    derived = DerivedRecord(
        id=7,
        scope=Scope(platform="discord", workspace="g", channel="c"),
        layer=Layer.PROFILE,
        record_scope=RecordScope.PERSON,
        content="Alice is vegetarian",
        source="Alice",
        owner="Alice",
        event="diet",
        time=now,
        session_id=1,
        state=RecordState.ACTIVE,
        from_ids=("m1",),
        supersedes=3,
        chain_root=3,
        writer_model="m",
        prompt_version="v",
    )
    state = from_derived(derived)
    assert (state.layer, state.id, state.supersedes) == ("profile", "7", "3")
    assert record_score(state, ALICE) == pytest.approx(1.0)


def test_format_report() -> None:
    result = speaker_levenshtein([ALICE, GRP], [ALICE, BOB, GRP])
    report = format_report(result)
    lines = report.splitlines()
    assert lines[0].split() == ["owner", "n_pred", "n_gold", "P", "R", "F"]
    assert any(line.startswith("bob") and line.split()[1:3] == ["0", "1"] for line in lines)
    assert GROUP in report
    assert lines[-1].startswith("SpeakerLevenshtein = 0.5333")
    assert isinstance(result, SLResult)


def test_load_state_accepts_list_and_records_object(tmp_path) -> None:
    raw = [
        {"owner": "Alice", "source": "Alice", "layer": "profile", "content": "x", "id": 5},
        {"owner": "GROUP", "source": "GROUP", "layer": "insight", "content": "y", "extra": 1},
    ]
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps(raw), encoding="utf-8")
    as_obj = tmp_path / "obj.json"
    as_obj.write_text(json.dumps({"records": raw, "meta": {}}), encoding="utf-8")
    for path in (as_list, as_obj):
        state = load_state(path)
        assert [r.owner for r in state] == ["Alice", "GROUP"]
        assert state[0].id == "5"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "invalid JSON"),
        ('{"items": []}', '"records"'),
        ('"hello"', "expected a list"),
        ("[1]", "record 0 is int"),
        ('[{"owner": "A", "source": "A", "layer": "core"}]', "content"),
        ('[{"owner": "", "source": "A", "layer": "core", "content": "c"}]', "owner"),
    ],
)
def test_load_state_errors(tmp_path, text: str, reason: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_state(path)
    assert str(path) in str(info.value)
    assert reason in str(info.value)


def test_load_state_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "nope.json")
