"""Spread a question's evidence over sessions or speakers, within the same top-k budget.

A question about a pattern or a change (`memory.query.breadth`) is answered by several
exchanges, often in different sessions; a question about everyone by several speakers. A
ranking that scores messages one by one lets the best-matching session or the most verbose
member fill the whole budget. `spread` keeps the ranking's order but lets no session (or
speaker) take more than `cap` of the first `top_k` places; what is held back keeps its order
after them, so nothing is lost when there is nothing else to take. Pure: tested without a store.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from speakermem.memory.models import StoredMessage
from speakermem.memory.query.breadth import Breadth

K = TypeVar("K", bound=Hashable)


def spread(order: Sequence[int], group_of: Mapping[int, K], *, cap: int, top_k: int) -> list[int]:
    """`order` with at most `cap` items per group among the first `top_k` (when enough other
    items exist), otherwise unchanged. Items without a group are never held back."""
    if cap <= 0 or top_k <= 0:
        return list(order)
    head: list[int] = []
    held: list[int] = []
    taken: dict[K, int] = {}
    for pk in order:
        if len(head) >= top_k:
            held.append(pk)
            continue
        key = group_of.get(pk)
        if key is not None and taken.get(key, 0) >= cap:
            held.append(pk)
            continue
        if key is not None:
            taken[key] = taken.get(key, 0) + 1
        head.append(pk)
    # too few other items: the held-back ones fill the budget in their order
    return head + held


def spread_evidence(
    pool: Sequence[int],
    messages: Mapping[int, StoredMessage],
    channel_of: Mapping[int, int],
    breadth: Breadth,
    *,
    session_cap: int,
    speaker_cap: int,
    top_k: int,
) -> list[int]:
    """A person's pattern or a change: at most `session_cap` of the top-k from one session;
    everyone's view: at most `speaker_cap` from one speaker; other questions: unchanged."""
    if breadth in ("person", "change"):
        where = {
            pk: (channel_of.get(pk, 0), m.session_id)
            for pk in pool
            if (m := messages.get(pk)) is not None
        }
        return spread(pool, where, cap=session_cap, top_k=top_k)
    if breadth == "group":
        who = {pk: m.speaker_id for pk in pool if (m := messages.get(pk)) is not None}
        return spread(pool, who, cap=speaker_cap, top_k=top_k)
    return list(pool)
