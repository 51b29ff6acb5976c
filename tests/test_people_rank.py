"""The people ranking of pattern, relationship and change questions (memory.query.people_rank)."""

from __future__ import annotations

from speakermem.memory.query.people_rank import (
    PeopleCandidate,
    PeopleWeights,
    name_terms_by_person,
    people_order,
    people_score,
)

TERMS = name_terms_by_person({"u_ruth": ["Ruth Okafor"], "u_marcus": ["Marcus"]})
NAMED = ["u_ruth", "u_marcus"]
ONLY_COSINE = PeopleWeights(named_speaker=0.0, mentions=0.0, exchange=0.0, length=0.0)


def cand(pk: int, speaker: str, text: str, sim: float, to: tuple[str, ...] = ()) -> PeopleCandidate:
    return PeopleCandidate(pk=pk, speaker=speaker, text=text, addressees=to, similarity=sim)


def test_name_terms_cover_every_word_of_a_name() -> None:
    assert TERMS["u_ruth"] == frozenset({"ruth", "okafor"})


def test_a_named_persons_own_message_outranks_a_slightly_closer_stranger() -> None:
    stranger = cand(1, "u_bob", "the telescope club meets on fridays now", 0.50)
    own = cand(2, "u_ruth", "the telescope club meets on fridays now", 0.45)
    assert people_order([stranger, own], NAMED, TERMS) == [2, 1]
    # with the feature weighted 0 the cosine alone decides
    assert people_order([stranger, own], NAMED, TERMS, ONLY_COSINE) == [1, 2]


def test_mentions_count_other_named_people_not_the_author() -> None:
    w = PeopleWeights(named_speaker=0.0, mentions=1.0, exchange=0.0, length=0.0)
    third = cand(1, "u_bob", "Ruth and Marcus sketched together all night", 0.0)
    self_named = cand(2, "u_ruth", "Ruth here, sketching tonight", 0.0)
    assert people_score(third, NAMED, TERMS, w) == 1.0  # names both (capped at two)
    assert people_score(self_named, NAMED, TERMS, w) == 0.0  # her own name is no mention


def test_an_exchange_is_a_named_person_addressing_another() -> None:
    w = PeopleWeights(named_speaker=0.0, mentions=0.0, exchange=1.0, length=0.0)
    reply = cand(1, "u_ruth", "you said the sketches came out well", 0.0, to=("u_marcus",))
    to_stranger = cand(2, "u_ruth", "you said the sketches came out well", 0.0, to=("u_bob",))
    from_stranger = cand(3, "u_bob", "you said the sketches came out well", 0.0, to=("u_ruth",))
    assert [people_score(c, NAMED, TERMS, w) for c in (reply, to_stranger, from_stranger)] == [
        1.0,
        0.0,
        0.0,
    ]


def test_a_substantive_message_beats_a_short_one_at_equal_similarity() -> None:
    short = cand(1, "u_ruth", "lol", 0.3)
    long = cand(
        2, "u_ruth", "I have always argued for the town park site but Saturday changed my mind", 0.3
    )
    assert people_order([short, long], NAMED, TERMS) == [2, 1]


def test_ties_keep_the_candidates_order() -> None:
    a = cand(7, "u_bob", "same words", 0.2)
    b = cand(3, "u_bob", "same words", 0.2)
    assert people_order([a, b], NAMED, TERMS) == [7, 3]
