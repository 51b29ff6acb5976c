"""Session and segment decisions for arriving messages, as pure functions.

A channel's conversation splits into sessions on idle gaps; turn indexes count
within a session. Conversation structure overrides the gap: a message that replies to (or
continues the thread of) a message of the current session stays in it, up to
`LINK_GAP_SECONDS` later. The store keeps each channel's cursor and applies these rules.
"""

from __future__ import annotations

from dataclasses import dataclass

LINK_GAP_SECONDS = 12 * 3600.0
"""A reply this much later than the session's last message still continues it."""


@dataclass(frozen=True)
class ChannelCursor:
    """Where a channel's conversation stands: last message time, session, next turn."""

    last_ts: float | None
    session_id: int
    next_turn: int


@dataclass(frozen=True)
class Placement:
    session_id: int
    turn_index: int
    new_session: bool
    cursor: ChannelCursor


def place_message(
    cursor: ChannelCursor,
    ts: float,
    *,
    gap_seconds: float,
    force_break: bool = False,
    continues: bool = False,
    link_gap_seconds: float = LINK_GAP_SECONDS,
) -> Placement:
    """Decide the session and turn of a message arriving at `ts`.

    A message later than the last one by more than the gap (or an explicit break)
    opens a new session; a late, out-of-order message stays in the current one. One that
    `continues` the current session (a reply or thread message whose parent is in it)
    stays in it across an idle gap of up to `link_gap_seconds`.
    """
    gap = ts - cursor.last_ts if cursor.last_ts is not None else 0.0
    starts = (
        cursor.last_ts is None
        or cursor.session_id == 0
        or force_break
        or (gap > gap_seconds and not (continues and gap <= link_gap_seconds))
    )
    if starts:
        session = cursor.session_id + 1
        turn = 0
    else:
        session = cursor.session_id
        turn = cursor.next_turn
    last = ts if cursor.last_ts is None or starts else max(cursor.last_ts, ts)
    return Placement(session, turn, starts, ChannelCursor(last, session, turn + 1))
