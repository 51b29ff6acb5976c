"""Rank the evidence of a question about named people's pattern, relationship or change.

A question about how a named person behaves, how two people relate, or how someone's view
changed (`memory.query.breadth`: `person`, `change`) has its evidence spread over many
sessions, mostly in the named people's own words, in messages that name them, and in
exchanges between them. In a channel of a dozen members and a few hundred turns, a ranking
that scores each message by the question's words alone fills the ten places with whoever
matched a framing word ("chat", "relationship") best; the named people's own messages are
a small share of the channel and hold most of the evidence.

This ranking scores a candidate set drawn around the people (their own messages, the
messages naming them, the channel's dense top) with a linear model over what the pipeline
knows of each message:

- `similarity`: its dense cosine with the question;
- `named_speaker`: a named person wrote it;
- `mentions`: how many of the named people (other than its author) it names, at most two;
- `exchange`: a named person wrote it to another named person (a reply or an address);
- `length`: log(1 + words); a substantive message says more about a person than "lol".

The weights are chosen on SocialMemBench's 15 development networks by leave-one-network-out
(`bench/quality/fit_people.py`, recorded in `docs/benchmarks/socialmembench-fit.json`); the
fit gives co-mentions no weight as a feature (the messages naming the people still join the
candidates). Pure: tested without a store.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from speakermem.memory.search.fts_query import query_terms


@dataclass(frozen=True)
class PeopleWeights:
    """The linear model's weights (cosine has weight 1: the rest is relative to it)."""

    named_speaker: float
    mentions: float
    exchange: float
    length: float

    def as_dict(self) -> dict[str, float]:
        return {
            "named_speaker": self.named_speaker,
            "mentions": self.mentions,
            "exchange": self.exchange,
            "length": self.length,
        }


PEOPLE_WEIGHTS = PeopleWeights(named_speaker=0.3, mentions=0.0, exchange=0.3, length=0.2)
"""Fitted by leave-one-network-out on the 15 SocialMemBench development networks."""


@dataclass(frozen=True)
class PeopleCandidate:
    """What the ranking reads about one candidate message."""

    pk: int
    speaker: str
    text: str
    addressees: tuple[str, ...]
    similarity: float


def name_terms_by_person(names: Mapping[str, Collection[str]]) -> dict[str, frozenset[str]]:
    """Person id -> the search terms of their display name and aliases."""
    return {
        person: frozenset(t for name in person_names for t in query_terms(name))
        for person, person_names in names.items()
    }


def people_score(
    cand: PeopleCandidate,
    named: Collection[str],
    terms: Mapping[str, frozenset[str]],
    weights: PeopleWeights,
) -> float:
    """The candidate's score: cosine plus the weighted features (see the module doc)."""
    words = query_terms(cand.text, max_terms=10_000)
    present = set(words)
    mentioned = sum(1 for p in named if p != cand.speaker and terms.get(p) and terms[p] & present)
    by_named = cand.speaker in named
    exchange = by_named and any(a in named and a != cand.speaker for a in cand.addressees)
    length = math.log1p(len(cand.text.split()))
    return (
        cand.similarity
        + weights.named_speaker * by_named
        + weights.mentions * min(mentioned, 2) / 2
        + weights.exchange * exchange
        + weights.length * length
    )


def people_order(
    cands: Sequence[PeopleCandidate],
    named: Collection[str],
    terms: Mapping[str, frozenset[str]],
    weights: PeopleWeights = PEOPLE_WEIGHTS,
) -> list[int]:
    """Candidate pks, best first (ties keep the candidates' order)."""
    scored = [(people_score(c, named, terms, weights), i, c.pk) for i, c in enumerate(cands)]
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [pk for _, _, pk in scored]
