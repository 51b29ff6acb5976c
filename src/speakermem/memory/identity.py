"""Telling people apart: the label a person or a message's author is shown under.

Attribution is by platform user id; names are what people read. Two people of one channel
may share a display name (today, or at the time one of them wrote), so wherever that name
is shared every label adds a handle: "Alice (@mallory)". A message shows the name its
author had when writing it and, when that changed since, the current one: "Al (now
Alice)". Pure: the caller passes the current names and the names messages were written
under.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


@dataclass(frozen=True)
class Identities:
    """Labels for the people of one view (a pack, a page of messages)."""

    current: Mapping[str, str]
    """User id -> current display name."""
    shared: frozenset[str]
    """Name keys (case-folded) that two or more user ids use, now or at some message."""

    def _handled(self, name: str, uid: str) -> str:
        return f"{name} (@{uid})" if _key(name) in self.shared else name

    def person(self, uid: str) -> str:
        """A person as they are called now, with a handle where the name is shared."""
        return self._handled(self.current.get(uid) or uid, uid)

    def author(self, uid: str, name_then: str) -> str:
        """A message's author: the name it was written under, a handle where that name (or
        the current one) is shared, and the current name when it changed since."""
        now = self.current.get(uid) or ""
        then = name_then or now or uid
        clash = _key(then) in self.shared or (now and _key(now) in self.shared)
        label = f"{then} (@{uid})" if clash else then
        if now and _key(now) != _key(then):
            label += f" (now {now})"
        return label


def identities(current: Mapping[str, str], written: Iterable[tuple[str, str]] = ()) -> Identities:
    """The labels of a view: `current` (id -> display name now) and `written` (id, name a
    message was written under) decide which names are shared."""
    users: dict[str, set[str]] = {}
    for uid, name in [*current.items(), *written]:
        if name and uid:
            users.setdefault(_key(name), set()).add(uid)
    return Identities(
        current=dict(current),
        shared=frozenset(k for k, ids in users.items() if len(ids) > 1),
    )
