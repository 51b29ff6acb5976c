"""Session and segment decisions for arriving messages, as pure functions.

A channel's conversation splits into sessions on idle gaps; turn indexes count
within a session. The store keeps each channel's cursor and applies these rules.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    cursor: ChannelCursor, ts: float, *, gap_seconds: float, force_break: bool = False
) -> Placement:
    """Decide the session and turn of a message arriving at `ts`.

    A message later than the last one by more than the gap (or an explicit break)
    opens a new session; a late, out-of-order message stays in the current one.
    """
    starts = (
        cursor.last_ts is None
        or cursor.session_id == 0
        or force_break
        or (ts - cursor.last_ts) > gap_seconds
    )
    if starts:
        session = cursor.session_id + 1
        turn = 0
    else:
        session = cursor.session_id
        turn = cursor.next_turn
    last = ts if cursor.last_ts is None or starts else max(cursor.last_ts, ts)
    return Placement(session, turn, starts, ChannelCursor(last, session, turn + 1))
