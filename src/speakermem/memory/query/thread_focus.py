"""A question asked in a thread is about that thread first.

Someone who mentions the bot in a Slack thread, or asks in (or replies inside) a Discord
thread, asks about what is being said there. The pool keeps its order inside each part:
the thread's messages come first (those the rankings found, in their order, then the
rest of the thread, newest first), then everything else. Select, ASK and Expand then work
on that order as on any pool, so the rest of the channel still answers what the thread
does not.
"""

from __future__ import annotations

from collections.abc import Sequence

from speakermem.memory.models import StoredMessage


def thread_first(pool: Sequence[int], thread: Sequence[int], *, size: int) -> list[int]:
    """The pool with the thread's messages first; `thread` is newest first; cut to `size`."""
    members = set(thread)
    ranked = [pk for pk in pool if pk in members]
    found = set(ranked)
    unranked = [pk for pk in thread if pk not in found]
    others = [pk for pk in pool if pk not in members]
    return [*ranked, *unranked, *others][:size]


def newest_first(messages: Sequence[StoredMessage]) -> list[int]:
    """The live messages' pks, newest first (a thread's order before `thread_first`)."""
    live = [m for m in messages if not m.deleted]
    return [m.pk for m in sorted(live, key=lambda m: (m.ts, m.pk), reverse=True)]
