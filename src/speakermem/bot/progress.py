"""Progress lines of history runs: "#eng caught up to 14:02, 1,240 messages".

A run in this process (`ChannelProgress`, kept by bot.catchup) and a saved cursor of any run
(`cursor_line`, for `speakermem status` and `/memory status`) read the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from speakermem.bot.events import Scope
from speakermem.bot.reconcile import entry_line


@dataclass
class ChannelProgress:
    scope: Scope
    name: str | None
    fetched: int = 0
    newest_ts: float | None = None
    done: bool = False
    error: str | None = None
    started_at: float = field(default_factory=time.time)

    def line(self) -> str:
        """'#eng caught up to 14:02, 1,240 messages' (times in UTC)."""
        label = f"#{self.name}" if self.name else self.scope.channel
        when = _clock(self.newest_ts) if self.newest_ts is not None else "its last message"
        if self.error:
            return f"{label} stopped at {when} ({self.error}), {self.fetched:,} messages"
        verb = "caught up to" if self.done else "catching up, at"
        return f"{label} {verb} {when}, {self.fetched:,} messages"


def cursor_line(entry: Mapping[str, object]) -> str:
    """A saved cursor (an entry of `Governance.status()["catchup"]`) as a progress line, for
    `speakermem status` and `/memory status`: a run in another process, or an interrupted
    one (it resumes at the next start), reads as "catching up, at …". A reconciliation
    cursor reads as what it checked and what it left (bot.reconcile)."""
    if entry.get("kind") == "reconcile":
        return entry_line(entry)
    platform, workspace, channel = str(entry["channel"]).split("/", 2)
    ts = entry.get("cursor_ts")
    fetched = entry.get("fetched")
    prog = ChannelProgress(
        scope=Scope(platform=platform, workspace=workspace, channel=channel),
        name=str(entry["name"]) if entry.get("name") else None,
        fetched=fetched if isinstance(fetched, int) else 0,
        newest_ts=float(ts) if isinstance(ts, int | float) else None,
        done=bool(entry.get("finished")),
    )
    line = prog.line()
    return f"backfill: {line}" if entry.get("kind") == "backfill" else line


def _clock(ts: float) -> str:
    when = datetime.fromtimestamp(ts, tz=UTC)
    if when.date() == datetime.now(UTC).date():
        return when.strftime("%H:%M")
    return when.strftime("%Y-%m-%d %H:%M")
