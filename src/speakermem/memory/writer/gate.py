"""Evidence gate: a proposed record may only commit when its cited messages support it.

This is the "verify" step of propose–verify–commit (EGMemory): the LLM proposes what to
remember, deterministic code decides whether the cited evidence actually says it. The gate is
pure — it scores text against text; any embedding similarity is computed by the caller and
passed in as a number, so the gate never touches a model or the store.

The lexical score is the fraction of the content's content words (stop words removed, lightly
stemmed) that occur in the cited messages, the cited speakers' names, or extra context terms
(addressee names, the dates of the cited messages). Defaults are calibrated on LoCoMo
observations by ``bench/calibrate_gate.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from speakermem.memory.search.cjk import words_and_ngrams

GateMode = Literal["lexical", "dense", "either", "both"]

DEFAULT_GATE_MODE: GateMode = "lexical"
DEFAULT_LEXICAL_THRESHOLD = 0.25
DEFAULT_DENSE_THRESHOLD = 0.6
# Calibrated on LoCoMo dev observations (1,210; bench/calibrate_gate.py, seed 13): lexical-only
# at 0.25 accepts 94.5% with true evidence and rejects 94.2% with swapped same-speaker evidence
# (the point where both rates are about equal); "either" at lexical 0.30 / dense 0.60 gives
# 94.4% / 94.6%, so the embedding adds little and stays optional.

# Function words, auxiliaries, pronouns and a few discourse fillers. Kept deliberately small:
# removing a content word here would let unsupported claims through.
_STOP_WORDS_TEXT = """
    a an the and or but nor so yet if then than that this these those there here of to in on at
    by for with from into onto upon about as over under after before between through during
    without within among against around across per via is am are was were be been being do does
    did done doing have has had having will would shall should can could may might must ought i
    me my mine myself we us our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves who whom whose
    which what when where why how not no yes also too very just only really quite still even
    ever already again all any both each every some such more most much many few other own same
    s t d ll m re ve don didn doesn isn aren wasn weren won wouldn couldn shouldn up down out
    off away back one ones thing things something anything everything nothing someone anyone
    everyone like get got getting go going went gone make made let lets oh hey hi hello wow well
    ok okay yeah yep lol
"""
STOP_WORDS: frozenset[str] = frozenset(_STOP_WORDS_TEXT.split())

# Speech-act and attitude verbs describe how a claim was made, not the claim: a record saying
# "Alice mentioned she adopted a cat" is supported by "I adopted a cat". Stemmed forms.
_REPORTING_TEXT = """
    say said tell told mention share express ask explain describ discuss talk remark
    repli respond comment acknowledg emphasiz highlight reveal admit claim believ think
    thought feel felt consider seem appear conversation messag chat
"""
REPORTING_TERMS: frozenset[str] = frozenset(_REPORTING_TEXT.split())

_MONTHS_TEXT = (
    "january february march april may june july august september october november december"
)
_MONTHS = _MONTHS_TEXT.split()
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def stem(token: str) -> str:
    """Light suffix stripping so that 'painted', 'painting' and 'paints' meet at 'paint'.

    Not a real stemmer: a handful of English inflections, applied identically to content and
    evidence, is enough for overlap scoring and keeps the gate predictable.
    """
    t = token
    if len(t) <= 3 or t.isdigit():
        return t
    if t.endswith("ies") and len(t) > 4:
        t = t[:-3] + "y"
    elif t.endswith("sses"):
        t = t[:-2]
    elif t.endswith("s") and not t.endswith(("ss", "us", "is")):
        t = t[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly", "er", "est", "ment", "ness", "ful"):
        if t.endswith(suffix) and len(t) - len(suffix) >= 3:
            t = t[: -len(suffix)]
            break
    if len(t) > 3 and t.endswith("e"):
        t = t[:-1]
    if len(t) > 3 and t[-1] == t[-2] and t[-1] not in "aeiouls":
        t = t[:-1]  # 'planned' -> 'plann' -> 'plan'
    if len(t) > 3 and t.endswith("i"):
        t = t[:-1] + "y"  # 'happily' -> 'happi' -> 'happy'
    return t


def tokens(text: str) -> list[str]:
    """Lowercased alphanumeric tokens (apostrophes split: "I'm" -> 'i', 'm'); a CJK run as
    its character bigrams, so a Chinese claim is grounded by the words of its evidence."""
    return words_and_ngrams(text, unigrams=False)


def content_terms(text: str) -> set[str]:
    """Stemmed content words of a text: the units the gate counts."""
    stems = (stem(t) for t in tokens(text) if t not in STOP_WORDS)
    return {t for t in stems if t not in REPORTING_TERMS}


def _all_terms(text: str) -> set[str]:
    """Stemmed evidence terms; stop words kept (harmless on the evidence side)."""
    return {stem(t) for t in tokens(text)}


def date_terms(ts: datetime) -> list[str]:
    """Words a correct absolute date for a cited message would use (day, month, year, weekday).

    Writers are told to turn "yesterday" into a date; those date words are supported by the
    message's own timestamp, not by its text. The neighbouring days are included because a
    relative phrase ("yesterday", "tomorrow") moves the date by one.
    """
    out: list[str] = [str(ts.year)]
    for delta in (-1, 0, 1):
        day = ts + timedelta(days=delta)
        out += [str(day.day), f"{day.day:02d}", _MONTHS[day.month - 1], _WEEKDAYS[day.weekday()]]
        out += [str(day.month), f"{day.month:02d}", str(day.year)]
    out += ["today", "yesterday", "tomorrow"]
    return out


@dataclass(frozen=True, slots=True)
class GateScore:
    """What the gate measured and decided for one proposed content."""

    lexical: float
    dense: float | None
    combined: float
    passed: bool
    unsupported: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EvidenceGate:
    """Decides whether cited messages support a proposed record's content.

    mode: "lexical" uses only token support; "dense" only the embedding similarity (falls back
    to lexical when no similarity is given); "either" passes when one of them passes; "both"
    needs both (lexical only, when no similarity is given).
    """

    lexical_threshold: float = DEFAULT_LEXICAL_THRESHOLD
    dense_threshold: float = DEFAULT_DENSE_THRESHOLD
    mode: GateMode = DEFAULT_GATE_MODE
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("lexical", "dense", "either", "both"):
            raise ValueError(f"unknown gate mode {self.mode!r}")

    def lexical_support(
        self,
        content: str,
        cited_texts: Sequence[str],
        cited_speaker_names: Iterable[str] = (),
        context_terms: Iterable[str] = (),
    ) -> tuple[float, tuple[str, ...]]:
        """Fraction of the content's claim words found in the cited texts, and the misses.

        Cited speakers' names and context terms (addressees, dates of the cited messages) are
        supported by the evidence's metadata, so they never count against the content; they
        are taken out of the count rather than counted as hits, so a record that is mostly
        names ("Alice told Bob and Carol ...") must still ground its actual claim.
        """
        wanted = content_terms(content)
        for name in cited_speaker_names:
            wanted -= _all_terms(name)
        for term in context_terms:
            wanted -= _all_terms(term)
        if not wanted:
            return 0.0, ()
        have: set[str] = set()
        for text in cited_texts:
            have |= _all_terms(text)
        missing = tuple(sorted(wanted - have))
        return 1.0 - len(missing) / len(wanted), missing

    def score(
        self,
        content: str,
        cited_texts: Sequence[str],
        cited_speaker_names: Iterable[str],
        *,
        dense_sim: float | None = None,
        context_terms: Iterable[str] = (),
    ) -> GateScore:
        """Score `content` against its cited evidence and decide pass/fail."""
        lexical, missing = self.lexical_support(
            content, cited_texts, cited_speaker_names, context_terms
        )
        lex_ok = lexical >= self.lexical_threshold
        if dense_sim is None:
            combined = lexical
            passed = lex_ok
        else:
            dense_ok = dense_sim >= self.dense_threshold
            combined = (lexical + dense_sim) / 2
            passed = {
                "lexical": lex_ok,
                "dense": dense_ok,
                "either": lex_ok or dense_ok,
                "both": lex_ok and dense_ok,
            }[self.mode]
        if not self.enabled:
            passed = True
        return GateScore(
            lexical=lexical, dense=dense_sim, combined=combined, passed=passed, unsupported=missing
        )
