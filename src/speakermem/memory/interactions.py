"""Who spoke to whom, and which earlier turn a message answers: pure inference over a
channel's turns (no I/O), run as a pass over newly stored messages.

Platforms tag some of this (mentions, replies, threads: the adapters' `addressees` and
`reply_to`). Most chat is untagged, so the rest is inferred from the text and the turn
order, each link labelled with how it was found:

- `vocative`: the message calls someone by name ("Dana, can you...", "thanks, Dana!");
- `name_start`: a message that starts with the name of someone who spoke recently;
- `adjacency`: in a stretch where only two people talk, each turn is to the other.

A reply-to parent is inferred for untagged messages (lightweight disentanglement): the
last turn of the person it addresses; else the recent turn, by someone else, that shares
the most content words with it (decayed by distance); else the previous turn of someone
else within the time gap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from speakermem.memory.models import RosterMember
from speakermem.memory.roster_cache import derived
from speakermem.memory.search.fts_query import query_terms
from speakermem.memory.search.name_match import NameAlternation

How = Literal["platform", "reply", "vocative", "name_start", "adjacency"]
ParentHow = Literal["explicit", "addressed", "overlap", "previous"]

WINDOW = 8
"""Earlier turns considered as a reply's parent or as the recent speakers."""
MAX_GAP_S = 30 * 60.0
"""No inferred parent across an idle gap longer than this."""
ADJACENCY_RUN = 4
"""A stretch of at least this many turns by exactly two people makes them each other's
addressees."""


@dataclass(frozen=True)
class Turn:
    """One stored message, as the inference sees it."""

    pk: int
    speaker_id: str
    text: str
    ts: float
    session_id: int
    message_id: str = ""
    reply_to: str | None = None
    """Platform message id of the explicit parent (a reply or a thread root)."""
    addressees: tuple[str, ...] = ()
    """Addressees the platform tagged (mentions, reply and thread parents' authors)."""


@dataclass(frozen=True)
class Inferred:
    pk: int
    addressees: tuple[tuple[str, How], ...] = ()
    parent: int | None = None
    parent_how: ParentHow | None = None


@dataclass
class NameIndex:
    """Roster names -> user ids, for finding people addressed in text."""

    names: dict[str, str] = field(default_factory=dict)
    """Lower-cased name or name token -> user id (ambiguous tokens left out)."""
    pattern: NameAlternation | None = None

    @classmethod
    def build(cls, roster: Iterable[tuple[str, str, Sequence[str]]]) -> NameIndex:
        """roster: (user id, display name, aliases). First names count when unambiguous."""
        full: dict[str, set[str]] = {}
        parts: dict[str, set[str]] = {}
        for uid, display, aliases in roster:
            for name in (display, *aliases):
                key = " ".join(name.casefold().split()).lstrip("@")
                if len(key) >= 2:
                    full.setdefault(key, set()).add(uid)
            tokens = [t for t in re.split(r"[\s()]+", display.casefold()) if len(t) >= 2]
            if len(tokens) > 1:
                for t in tokens:
                    parts.setdefault(t, set()).add(uid)
        names = {k: next(iter(v)) for k, v in full.items() if len(v) == 1}
        for k, v in parts.items():
            if k not in full and len(v) == 1:
                names.setdefault(k, next(iter(v)))
        if not names:
            return cls()
        pattern = NameAlternation(
            list(names), r"(?<![\w@])@?(?P<n>{alt})(?!\w)", re.escape, flags=re.IGNORECASE
        )
        return cls(names, pattern)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, user id) of every capitalised or @-prefixed name in `text`."""
        if self.pattern is None:
            return []
        out = []
        for m in self.pattern.finditer(text):
            raw = m.group(0)
            if raw.startswith("@") or raw[:1].isupper():
                out.append((m.start(), m.end(), self.names[m["n"].casefold()]))
        return out


_GREETING = re.compile(
    r"^\W*(?:hey|hi|hello|yo|dear|thanks|thank\s+you|sorry|morning|ok|okay|oh|well)\W+",
    re.IGNORECASE,
)


def vocatives(text: str, names: NameIndex) -> list[tuple[str, How]]:
    """People the text calls by name.

    vocative: a name at the start set off by punctuation ("Dana, can you..."), a name after a
    greeting ("hey Dana"), or a name closing the message after a comma ("thanks, Dana!").
    name_start: a message that simply starts with a name ("Dana the van is here").
    """
    found = names.find(text)
    if not found:
        return []
    head = len(text) - len(text.lstrip(" \t\n\"'(*_~>"))
    greeting = _GREETING.match(text)
    tail = len(text.rstrip(" \t\n.!?)\"'*_~:;"))
    out: dict[str, How] = {}
    for start, end, uid in found:
        after = text[end:].lstrip(" ")[:1]
        if start <= head:
            out.setdefault(
                uid, "vocative" if after in {",", "!", "?", ":", "-", ""} else "name_start"
            )
        elif (greeting is not None and start == greeting.end()) or (
            end >= tail and text[:start].rstrip().endswith(",")
        ):
            out.setdefault(uid, "vocative")
    return list(out.items())


def interaction_names(roster: Iterable[RosterMember]) -> NameIndex:
    """The name index of a roster (cached: rosters change rarely)."""
    if isinstance(roster, list):
        return derived(roster, "interaction-names", _roster_names)
    return _roster_names(list(roster))


def _roster_names(roster: Sequence[RosterMember]) -> NameIndex:
    return _cached_names(
        tuple((m.user_id, m.display_name, tuple(m.aliases)) for m in roster if m.user_id.strip())
    )


@lru_cache(maxsize=64)
def _cached_names(sig: tuple[tuple[str, str, tuple[str, ...]], ...]) -> NameIndex:
    return NameIndex.build(sig)


def _overlap(a: set[str], b: set[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / (len(a) ** 0.5 * len(b) ** 0.5)


def infer(
    turns: Sequence[Turn],
    names: NameIndex,
    *,
    history: Sequence[Turn] = (),
    window: int = WINDOW,
    max_gap_s: float = MAX_GAP_S,
    adjacency_run: int = ADJACENCY_RUN,
) -> list[Inferred]:
    """Addressees (with how each was found) and reply parents for `turns`, in order.

    `history`: the turns just before `turns` (already inferred), for context only.
    """
    seen: list[Turn] = list(history)[-window:]
    by_mid: dict[str, Turn] = {t.message_id: t for t in seen if t.message_id}
    out: list[Inferred] = []
    for t in turns:
        recent = [p for p in seen[-window:] if p.ts >= t.ts - max_gap_s]
        found: dict[str, How] = {}
        for uid in t.addressees:
            if uid != t.speaker_id:
                found.setdefault(uid, "platform")
        parent: Turn | None = by_mid.get(t.reply_to) if t.reply_to else None
        parent_how: ParentHow | None = "explicit" if parent is not None else None
        if parent is not None and parent.speaker_id != t.speaker_id:
            found.setdefault(parent.speaker_id, "reply")
        recent_speakers = {p.speaker_id for p in recent}
        for uid, how in vocatives(t.text, names):
            if uid != t.speaker_id and (how == "vocative" or uid in recent_speakers):
                found.setdefault(uid, how)
        run = [p.speaker_id for p in recent[-adjacency_run + 1 :]] + [t.speaker_id]
        if len(run) >= adjacency_run and len(set(run)) == 2 and not found:
            other = next(s for s in run if s != t.speaker_id)
            found[other] = "adjacency"
        if parent is None:
            parent, parent_how = _infer_parent(t, recent, found)
        out.append(Inferred(t.pk, tuple(found.items()), parent.pk if parent else None, parent_how))
        seen.append(t)
        if t.message_id:
            by_mid[t.message_id] = t
        if len(seen) > 4 * window:
            del seen[: len(seen) - window]
    return out


def _infer_parent(
    t: Turn, recent: Sequence[Turn], found: dict[str, How]
) -> tuple[Turn | None, ParentHow | None]:
    others = [p for p in recent if p.speaker_id != t.speaker_id and p.session_id == t.session_id]
    if not others:
        return None, None
    for p in reversed(others):
        if p.speaker_id in found and found[p.speaker_id] != "adjacency":
            return p, "addressed"
    words = set(query_terms(t.text))
    best, best_score = None, 0.0
    for distance, p in enumerate(reversed(others)):
        score = _overlap(words, set(query_terms(p.text))) / (1 + 0.25 * distance)
        if score > best_score:
            best, best_score = p, score
    if best is not None and best is not others[-1] and best_score >= 0.2:
        return best, "overlap"
    return others[-1], "previous"
