"""Words for synthetic chat: an everyday vocabulary (function words, topics, verbs) and
pronounceable pseudo-words that stand in for the long tail of real chat."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

FUNCTION = (
    "i you we it the a to and of is that for on in this with be have not so but just if my "
    "was are at do can what about think will me our all they would there should its like "
    "maybe yes no ok then when too now also still really need want going get make sure"
).split()
TOPICS = (
    "launch budget venue database deadline release roadmap design review customer invoice "
    "pricing hiring onboarding offsite retro sprint backlog migration outage incident "
    "dashboard metrics security audit contract vendor laptop office parking lunch party "
    "training conference demo prototype feedback survey newsletter website checkout "
    "payments refund shipping warehouse inventory forecast quarter roadmap okr benchmark "
    "latency cache index schema backup monitoring alerting oncall handover vacation "
    "holiday travel visa relocation salary bonus promotion mentor interview candidate "
    "docs wiki api sdk plugin mobile android ios desktop browser accessibility translation"
).split()
VERBS = (
    "prefers wants suggested rejected approved moved postponed owns questioned "
    "defended drafted reviewed shipped proposed dislikes trusts blamed fixed"
).split()


@dataclass(frozen=True)
class Sounds:
    """What pseudo-words are made of: syllables of an onset and a vowel, then a coda."""

    onsets: tuple[str, ...]
    vowels: tuple[str, ...]
    codas: tuple[str, ...]
    syllables: tuple[int, ...]
    """Syllable counts, drawn uniformly (a repeated count is more likely)."""


CHAT_SOUNDS = Sounds(
    onsets=tuple("b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl pr sh st th tr".split()),
    vowels=tuple("a e i o u ai ea ee oo ou".split()),
    codas=("", "", "n", "r", "s", "t", "l", "nd", "st", "ck"),
    syllables=(1, 2, 2, 3),
)


def pseudo_words(
    rng: np.random.Generator, n: int, sounds: Sounds = CHAT_SOUNDS, exclude: Iterable[str] = ()
) -> list[str]:
    """`n` distinct pronounceable words of 3+ letters, none of them in `exclude`."""
    seen = set(exclude)
    out: list[str] = []
    # rng.integers over each tuple draws what rng.choice(list(tuple)) drew (the same words
    # for a seed, so recorded benchmark data stays the same) at a tenth of the cost
    draw = rng.integers
    syllables, onsets, vowels, codas = sounds.syllables, sounds.onsets, sounds.vowels, sounds.codas
    while len(out) < n:
        syl = syllables[int(draw(0, len(syllables)))]
        w = "".join(
            onsets[int(draw(0, len(onsets)))] + vowels[int(draw(0, len(vowels)))]
            for _ in range(syl)
        )
        w += codas[int(draw(0, len(codas)))]
        if len(w) >= 3 and w not in seen:
            seen.add(w)
            out.append(w)
    return out


def chat_words(rng: np.random.Generator, n: int) -> list[str]:
    """Pseudo-words for the long tail, none of them a function or topic word."""
    return pseudo_words(rng, n, CHAT_SOUNDS, exclude=set(FUNCTION) | set(TOPICS))
