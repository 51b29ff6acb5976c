"""Content-free tombstones for forgotten people: keyed hashes, never the id or the name.

A forgotten person must stay out (their new messages, their names in roster updates and in
records the Writer proposes) without the store keeping who they were in clear. Each
database holds one random key (`store_secrets.tombstone_key`); a person is remembered as
HMAC-SHA256(key, platform/workspace/user id) and each of their names (display names,
aliases) as HMAC-SHA256(key, the name's normalised words). Whoever holds the database can
test a guessed id or name against them, nothing more: the hashes cannot be read back.

Names are matched in record text as whole runs of words whose first word is written with a
capital (how the Writer writes names), so a forgotten "Will" does not catch "we will ship".

Pure functions: the store reads and writes the hashes (memory.store.policy).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

from speakermem.memory.governance.policy import Refusal

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
MAX_NAME_WORDS = 4
"""Longest name (in words) matched in record text; longer display names are hashed whole
but only match a text that repeats all of their first four words."""
MIN_NAME_CHARS = 2
"""A one-letter name ("J") would match every capital J: such names are not matched."""


def person_key(key: bytes, platform: str, workspace: str, user_id: str) -> str:
    """The tombstone of a person: keyed, so the table holds no user id."""
    return _mac(key, f"person\x00{platform}\x00{workspace}\x00{user_id}")


def name_words(name: str) -> tuple[str, ...]:
    """A name's words, case-folded ("Bob_Smith" and "bob smith" are the same name)."""
    return tuple(w.casefold() for w in _WORD.findall(name))[:MAX_NAME_WORDS]


def name_key(key: bytes, words: tuple[str, ...]) -> str:
    return _mac(key, "name\x00" + " ".join(words))


def name_keys(key: bytes, names: Iterable[str]) -> set[str]:
    """The tombstones of a person's names (names too short to match are left out)."""
    out: set[str] = set()
    for name in names:
        words = name_words(name)
        if words and len(" ".join(words)) >= MIN_NAME_CHARS:
            out.add(name_key(key, words))
    return out


def text_name_keys(key: bytes, text: str) -> set[str]:
    """The keys of every run of up to MAX_NAME_WORDS words in `text` that starts with a
    capitalised word: what a forgotten name's key is looked up against."""
    words = _WORD.findall(text)
    out: set[str] = set()
    for i, first in enumerate(words):
        if not (first[:1].isupper() or first[:1].isdigit()):
            continue
        run: list[str] = []
        for w in words[i : i + MAX_NAME_WORDS]:
            run.append(w.casefold())
            if len(" ".join(run)) >= MIN_NAME_CHARS:
                out.add(name_key(key, tuple(run)))
    return out


def names_forgotten(key: bytes, texts: Iterable[str], forgotten: set[str]) -> bool:
    """Whether any of `texts` names a person whose name keys are in `forgotten`."""
    if not forgotten:
        return False
    return any(text_name_keys(key, t) & forgotten for t in texts if t)


def _mac(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Exclusions:
    """Who in one workspace may not be remembered now: opted-out members (by id) and
    forgotten people (by tombstone), with the forgotten people's name tombstones."""

    key: bytes
    platform: str
    workspace: str
    opted_out: frozenset[str] = frozenset()
    forgotten: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.opted_out or self.forgotten)

    def reason(self, user_id: str) -> Refusal | None:
        """Why this person's words are not to be stored or derived from (None: they may)."""
        if self.forgotten and person_key(self.key, self.platform, self.workspace, user_id) in (
            self.forgotten
        ):
            return Refusal.FORGOTTEN
        if user_id in self.opted_out:
            return Refusal.OPTED_OUT
        return None

    def excluded(self, user_ids: Iterable[str]) -> set[str]:
        return {uid for uid in user_ids if self.reason(uid) is not None}

    def names_in(self, *texts: str) -> bool:
        """Whether any text names a forgotten person."""
        return names_forgotten(self.key, texts, set(self.names))
