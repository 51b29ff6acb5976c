"""Values derived from a channel's roster, computed once per roster list.

The store hands out one shared roster list per channel until the channel's roster revision
moves (`ChannelRepo.members`), so a community channel's thousands of members are turned
into a name index or a display-name map once, not on every /recall. Other lists (tests,
merged workspace rosters) are keyed by identity too and simply miss the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from speakermem.memory.models import RosterMember

T = TypeVar("T")

SIZE = 32
_CACHE: OrderedDict[tuple[int, str], tuple[Sequence[RosterMember], int, Any]] = OrderedDict()


def derived(
    roster: Sequence[RosterMember], kind: str, build: Callable[[Sequence[RosterMember]], T]
) -> T:
    """`build(roster)`, cached per (roster list, kind). The list must not be changed in place
    (a changed length is noticed, other edits are not: the store never edits a handed-out list)."""
    key = (id(roster), kind)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is roster and hit[1] == len(roster):
        _CACHE.move_to_end(key)
        return hit[2]  # type: ignore[no-any-return]
    value = build(roster)
    _CACHE[key] = (roster, len(roster), value)
    while len(_CACHE) > SIZE:
        _CACHE.popitem(last=False)
    return value


def display_names(roster: Sequence[RosterMember]) -> dict[str, str]:
    """User id -> display name (shared: do not change it)."""
    return derived(roster, "names", lambda r: {m.user_id: m.display_name for m in r})
