"""Project's regex grammar: where a question names people, and how it relates them.

`find_refs` finds the references (mentions, raw ids, names; longest first, no overlaps).
`find_relation` reads a copy of the question where each reference is a marker "§i§" for
the two relations the rows depend on: communication ("what did Alice tell Bob", "who asked
Bob", "did Bob hear from Alice") and one person's view of another ("Alice's take on Bob",
"what does Alice think of Bob"). Pure: text in, references and a relation out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from speakermem.memory.query.project_words import ISSUE_STOPWORDS, MENTION_RE, name_key
from speakermem.memory.query.roster_index import RosterIndex


@dataclass(frozen=True)
class Ref:
    """A reference to people in the question: its span, and whom it may mean."""

    start: int
    end: int
    ids: frozenset[str]
    """One id: resolved; several: ambiguous; none: an unknown mention (still stripped)."""
    poss: bool


def sentence_start(text: str, pos: int) -> bool:
    """Whether `pos` starts a sentence (where any word is capitalised)."""
    before = text[max(0, pos - 8) : pos].rstrip()
    return not before or before[-1] in ".!?:;\"'(\n"


def find_refs(text: str, idx: RosterIndex) -> list[Ref]:
    """Mentions, raw ids and names, longest first, without overlaps, in text order."""
    refs: list[Ref] = []

    def free(s: int, e: int) -> bool:
        return all(e <= r.start or s >= r.end for r in refs)

    for m in MENTION_RE.finditer(text):
        uid = m["id"]
        ids = frozenset({uid}) if uid in idx.names else frozenset()
        poss = text.startswith("'s", m.end())
        refs.append(Ref(m.start(), m.end() + (2 if poss else 0), ids, poss))
    if idx.id_re is not None:
        for m in idx.id_re.finditer(text):
            if free(m.start(), m.end()):
                refs.append(Ref(m.start(), m.end(), frozenset({m["id"]}), bool(m["poss"])))
    blocked = list(refs)  # name matches never overlap each other; only check earlier kinds
    if idx.name_re is not None:
        for m in idx.name_re.finditer(text):
            name = m["name"]
            key = name_key(name)
            if key in idx.caps_only and (
                not name[:1].isupper()
                or (
                    (key in ISSUE_STOPWORDS or key in idx.common)
                    and sentence_start(text, m.start())
                )
            ):
                continue
            ids = idx.lookup(key)
            if ids and all(m.end() <= r.start or m.start() >= r.end for r in blocked):
                refs.append(Ref(m.start(), m.end(), ids, bool(m["poss"])))
    refs.sort(key=lambda r: r.start)
    return refs


# --------------------------------------------------------------------------------------------
# relations, over a copy of the question where every reference is a marker "§i§"

_P = r"§(\d+)§"
_FILL = r"(?:[\w'-]+\s+)"
_COMM_VERBS = (
    r"(?:tell|tells|told|ask|asks|asked|say\s+to|says\s+to|said\s+to|mention(?:ed)?\s+to"
    r"|message|messaged|text|texted|dm|dmed|dm'd|dm-ed|reply\s+to|replied\s+to"
    r"|respond(?:ed)?\s+to|answer|answered|promise|promised|write\s+to|wrote\s+to"
    r"|explain(?:ed)?\s+to|suggest(?:ed)?\s+to|recommend(?:ed)?\s+to|remind|reminded|warn|warned"
    r"|thank|thanked|invite|invited|ping|pinged|send|sent|email|emailed|complain(?:ed)?\s+to"
    r"|apologi[sz]e(?:d)?\s+to|confide(?:d)?\s+in|report(?:ed)?\s+to|reach\s+out\s+to"
    r"|reached\s+out\s+to|talk\s+to|talked\s+to|speak\s+to|spoke\s+to)"
)
_COMM_RE = re.compile(rf"{_P}\s+{_FILL}?{_COMM_VERBS}\s+{_P}")
_WHO_COMM_RE = re.compile(rf"\bwho\s+(?:else\s+)?{_FILL}?{_COMM_VERBS}\s+{_P}")
""""who asked X about...": the addressee is known, the speaker is what is asked for."""
_HEAR_RE = re.compile(
    rf"{_P}\s+(?:hear|hears|heard|learn|learns|learned|learnt)\s+{_FILL}{{0,3}}?from\s+{_P}"
)
_VIEW_NOUNS = (
    r"(?:view|views|opinion|opinions|take|impression|impressions|thoughts?|feelings?|perspective"
    r"|stance|assessment|perception|read|sense|attitude|verdict|feedback|judg(?:e)?ment)"
)
_VIEW_PREPS = r"(?:of|on|about|regarding|toward|towards|concerning|for)"
_VIEW_VERBS = (
    r"(?:think|thinks|thought|feel|feels|felt|say|says|said|believe|believes|believed|reckon"
    r"|make|made|view|views|viewed|see|sees|saw|perceive|perceives|perceived|rate|rates|rated"
    r"|regard|regards|regarded|write|wrote|complain|complained|know|knows|knew)"
)
_LIKE_VERBS = (
    r"(?:like|likes|liked|dislike|dislikes|disliked|trust|trusts|trusted|respect|respects"
    r"|respected|love|loves|loved|hate|hates|hated|admire|admires|admired|get\s+along\s+with"
    r"|got\s+along\s+with|agree\s+with|agreed\s+with|disagree\s+with|disagreed\s+with|rate|rated"
    r"|blame|blamed|envy|envied|fear|feared|resent|resented|miss|missed|prefer|preferred"
    r"|(?:think|thinks|thought|believe|believes|believed|feel|feels|felt|suspect|suspects"
    r"|suspected|assume|assumes|assumed|say|says|said)\s+(?:that\s+)?)"
)
_VIEW_RES: list[tuple[re.Pattern[str], bool]] = [
    # (pattern, the first marker must be possessive)
    (re.compile(rf"{_P}\s+{_FILL}?{_VIEW_NOUNS}\s+{_VIEW_PREPS}\s+{_FILL}{{0,3}}?{_P}"), True),
    (
        re.compile(
            rf"\b(?:what|how)\s+(?:do|does|did|would|has|had|is|was)\s+{_P}\s+{_FILL}{{0,2}}?"
            rf"{_VIEW_VERBS}\s+(?:{_VIEW_PREPS}\s+)?{_FILL}{{0,3}}?{_P}"
        ),
        False,
    ),
    (
        re.compile(
            rf"(?:\b(?:does|did|do|is|was|has|had|would|will)\s+)?{_P}\s+{_FILL}?{_LIKE_VERBS}"
            rf"\s*{_FILL}?{_P}"
        ),
        False,
    ),
    (re.compile(rf"\baccording\s+to\s+{_P}\s*,?\s+.{{0,200}}?{_P}"), False),
    (re.compile(rf"\bin\s+{_P}\s+(?:view|opinion|eyes|mind|words)\b.{{0,200}}?{_P}"), True),
]


@dataclass(frozen=True)
class Relation:
    """Who spoke to (or holds a view of) whom; `other` is the addressee or the one viewed."""

    kind: Literal["view", "comm"]
    speaker: str | None
    """None when the question asks who spoke ("who asked X ...")."""
    other: str


def marker_text(text: str, refs: list[Ref]) -> str:
    """The question, case-folded, with reference i replaced by the marker "§i§"."""
    parts: list[str] = []
    prev = 0
    for i, r in enumerate(refs):
        parts.append(text[prev : r.start].replace("§", " "))
        parts.append(f" §{i}§ ")
        prev = r.end
    parts.append(text[prev:].replace("§", " "))
    return " ".join("".join(parts).casefold().split())


def find_relation(mt: str, refs: list[Ref]) -> Relation | None:
    """The first communication or view relation between two resolved references."""

    def one(i: str) -> str | None:
        r = refs[int(i)]
        return next(iter(r.ids)) if len(r.ids) == 1 else None

    for m in _COMM_RE.finditer(mt):
        x, y = one(m.group(1)), one(m.group(2))
        if x and y and x != y:
            return Relation("comm", x, y)
    for m in _WHO_COMM_RE.finditer(mt):
        if y := one(m.group(1)):
            return Relation("comm", None, y)
    for m in _HEAR_RE.finditer(mt):
        hearer, teller = one(m.group(1)), one(m.group(2))
        if hearer and teller and hearer != teller:
            return Relation("comm", teller, hearer)
    for pattern, needs_poss in _VIEW_RES:
        for m in pattern.finditer(mt):
            if needs_poss and not refs[int(m.group(1))].poss:
                continue
            x, y = one(m.group(1)), one(m.group(2))
            if x and y and x != y:
                return Relation("view", x, y)
    return None
