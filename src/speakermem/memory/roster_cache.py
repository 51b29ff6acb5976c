"""Values derived from a channel's roster, computed once per roster list.

The store hands out one shared roster list per channel until the channel's roster revision
moves (`ChannelRepo.members`), so a community channel's thousands of members are turned
into a name index or a display-name map once, not on every /recall. Other lists (tests,
merged workspace rosters) are keyed by identity too and simply miss the cache.

The cache holds every derived kind of a list together and as many lists as the store keeps
cached, so a value lives as long as its list: a server asked about in more channels than
the cache holds would otherwise rebuild each channel's name index (a regular expression over
its members' names) on every /recall.
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

_CACHE: OrderedDict[int, tuple[Sequence[RosterMember], int, dict[str, Any]]] = OrderedDict()


def derived(
    roster: Sequence[RosterMember], kind: str, build: Callable[[Sequence[RosterMember]], T]
) -> T:
    """`build(roster)`, cached per (roster list, kind). The list must not be changed in place
    (a changed length is noticed, other edits are not: the store never edits a handed-out list)."""
    key = id(roster)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not roster or hit[1] != len(roster):
        hit = _CACHE[key] = (roster, len(roster), {})
        while len(_CACHE) > ROSTERS:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    values = hit[2]
    if kind not in values:
        values[kind] = build(roster)
    return values[kind]  # type: ignore[no-any-return]


def display_names(roster: Sequence[RosterMember]) -> dict[str, str]:
    """User id -> display name (shared: do not change it)."""
    return derived(roster, "names", lambda r: {m.user_id: m.display_name for m in r})
