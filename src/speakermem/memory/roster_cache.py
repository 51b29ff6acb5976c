"""Values derived from a channel's roster, computed once per roster list.

The store hands out one shared roster list per channel until the channel's roster revision
moves (`ChannelRepo.members`), so a community channel's thousands of members are turned
into a name index or a display-name map once, not on every /recall. Other lists (tests,
merged workspace rosters) are keyed by identity too and simply miss the cache.

The cache holds every derived kind of a list together, for as many lists as the store keeps
cached while their members add up to at most `MEMBERS`: a server asked about in more channels
than the cache holds rebuilds each channel's name index (a regular expression over its
members' names) on every /recall, and what is derived from a large roster is large (about
3.5 KB a member: 35 MB for a 10,000-member channel, measured).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from speakermem.memory.models import RosterMember

T = TypeVar("T")

ROSTERS = 64
"""Roster lists whose derived values stay cached (least recently used beyond); the store keeps
as many channels' member lists (`memory.store.channels.MEMBER_CACHE_CHANNELS`)."""

MEMBERS = 50_000
"""Members of the cached lists, together, beyond which the least recently used go (the most
recent list always stays)."""


class DerivedCache:
    """Derived values per roster list, least recently used lists dropped past `lists` lists or
    `members` members together (the most recent list always stays)."""

    def __init__(self, lists: int = ROSTERS, members: int = MEMBERS) -> None:
        self.lists = lists
        self.members = members
        self._entries: OrderedDict[int, tuple[Sequence[RosterMember], int, dict[str, Any]]] = (
            OrderedDict()
        )
        self._held = 0
        self.builds = 0
        """Values built (not found): a counter for tests."""

    def get(
        self,
        roster: Sequence[RosterMember],
        kind: str,
        build: Callable[[Sequence[RosterMember]], T],
    ) -> T:
        key = id(roster)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is roster and entry[1] == len(roster):
            self._entries.move_to_end(key)
        else:
            self._drop(key)
            entry = self._entries[key] = (roster, len(roster), {})
            self._held += len(roster)
            while len(self._entries) > 1 and (
                len(self._entries) > self.lists or self._held > self.members
            ):
                self._drop(next(iter(self._entries)))
        values = entry[2]
        if kind not in values:
            values[kind] = build(roster)
            self.builds += 1
        return values[kind]  # type: ignore[no-any-return]

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._held -= entry[1]


_CACHE = DerivedCache()


def derived(
    roster: Sequence[RosterMember], kind: str, build: Callable[[Sequence[RosterMember]], T]
) -> T:
    """`build(roster)`, cached per (roster list, kind). The list must not be changed in place
    (a changed length is noticed, other edits are not: the store never edits a handed-out list)."""
    return _CACHE.get(roster, kind, build)


def display_names(roster: Sequence[RosterMember]) -> dict[str, str]:
    """User id -> display name (shared: do not change it)."""
    return derived(roster, "names", lambda r: {m.user_id: m.display_name for m in r})
