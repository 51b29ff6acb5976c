"""Catch-up after downtime and admin backfills: fetch channel history through the dispatcher.

Platform-neutral: a `HistorySource` (integrations/*/history.py) turns a platform's history
API into pages of `MessageEvent`s, oldest first, newer than a given message; it owns paging
and the platform's rate-limit headers. This module decides where each channel starts,
feeds every event through `Dispatcher.handle` (the same funnel, governance and idempotency
as live events: a message already stored is a duplicate, not a second row), saves a cursor
after every page (`engine.cursors`) so an interrupted run resumes where it stopped, and
reports progress (bot/progress.py): "#eng caught up to 14:02, 1,240 messages".

Where a channel starts:
- an unfinished cursor of an earlier run (it was interrupted): from that cursor;
- else the newest message stored *before* live events resumed (`snapshot()` is taken
  before the adapter connects, or when a gateway session is lost).
Channels with nothing stored are not caught up: importing old history is `backfill`.

After a catch-up pass, a `Reconciler` (bot/reconcile.py), when given, checks in the
background what was deleted or edited on the platform meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import MessageEvent, Scope
from speakermem.bot.progress import ChannelProgress
from speakermem.bot.reconcile import Reconciler
from speakermem.memory.cursors import HistoryCursors

log = logging.getLogger(__name__)

Start = tuple[str | None, float | None]
"""(message id, unix ts) to fetch after; (None, since) = from a time (backfill)."""


class HistorySource(Protocol):
    """A platform's channel history, as pages of events oldest first."""

    platform: str

    def pages(
        self, scope: Scope, *, after_id: str | None, after_ts: float | None
    ) -> AsyncIterator[list[MessageEvent]]:
        """Pages of messages newer than `after_id` (or, without one, than `after_ts`)."""
        ...


def _ts(event: MessageEvent) -> float:
    return event.ts.timestamp()


class CatchUpStalled(RuntimeError):
    """An event could be neither stored nor kept in the spill: the cursor stays before it."""


class CatchUp:
    """Runs catch-up (or a backfill, `kind="backfill"`) for one history source."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        cursors: HistoryCursors,
        source: HistorySource,
        *,
        kind: str = "catchup",
        on_page: Callable[[ChannelProgress, int], None] | None = None,
        reconcile: Reconciler | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.cursors = cursors
        self.source = source
        self.kind = kind
        self.on_page = on_page
        self.reconcile = reconcile
        self.progress: dict[Scope, ChannelProgress] = {}
        self._names: dict[Scope, str] = {}
        self._lock = asyncio.Lock()

    async def snapshot(self, workspace: str | None = None) -> dict[Scope, Start]:
        """Where each channel whose memory is on stands now (the switch's one source, the
        governance policy); take it before live events can move it."""
        newest = await self.cursors.newest(self.source.platform, workspace)
        on = await self.dispatcher.governance.channels_enabled(list(newest))
        newest = {scope: v for scope, v in newest.items() if on[scope]}
        self._names.update({s: name for s, (_id, _ts, name) in newest.items() if name})
        return {scope: (mid, ts) for scope, (mid, ts, _name) in newest.items()}

    async def plan(self, snapshot: Mapping[Scope, Start]) -> dict[Scope, Start]:
        """The snapshot, with interrupted runs resuming from their saved cursor."""
        starts = dict(snapshot)
        for cur in await self.cursors.cursors(self.source.platform, self.kind):
            if not cur.finished and cur.cursor_id is not None:
                starts[cur.scope] = (cur.cursor_id, cur.cursor_ts)
        return starts

    async def run(
        self, starts: Mapping[Scope, Start], names: Mapping[Scope, str] | None = None
    ) -> list[ChannelProgress]:
        """Catch every channel up, one after another (history APIs are rate-limited)."""
        async with self._lock:
            known = dict(self._names)
            known.update(names or {})
            out = []
            for scope, start in starts.items():
                out.append(await self._channel(scope, start, known.get(scope)))
            if self.reconcile is not None:  # in the background: see bot/reconcile.py
                self.reconcile.begin({s: ts for s, (_id, ts) in starts.items()}, known)
            return out

    async def _channel(self, scope: Scope, start: Start, name: str | None) -> ChannelProgress:
        after_id, after_ts = start
        prog = self.progress[scope] = ChannelProgress(scope=scope, name=name, newest_ts=after_ts)
        await self.cursors.save(
            scope, self.kind, cursor_id=after_id, cursor_ts=after_ts, fetched=0, finished=False
        )
        try:
            async for page in self.source.pages(scope, after_id=after_id, after_ts=after_ts):
                handled = 0
                for event in page:  # oldest first: stop at one neither stored nor kept
                    if not await self.dispatcher.handle(event):
                        break
                    handled += 1
                if handled:
                    after_id = await self._advance(scope, page[:handled], prog, after_id)
                if handled < len(page):  # the cursor stays before it: the next run retries
                    raise CatchUpStalled("an event could be neither stored nor kept")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a channel that fails does not stop the others
            prog.error = f"{type(exc).__name__}: {str(exc)[:120]}"
            log.warning("catch-up: %s", prog.line())
            return prog
        prog.done = True
        await self.cursors.save(
            scope,
            self.kind,
            cursor_id=after_id,
            cursor_ts=prog.newest_ts,
            fetched=prog.fetched,
            finished=True,
        )
        log.info("%s", prog.line())
        return prog

    async def _advance(
        self, scope: Scope, page: list[MessageEvent], prog: ChannelProgress, after_id: str | None
    ) -> str | None:
        """Save the cursor past `page` (events all stored or kept); returns the new one."""
        last = max(page, key=_ts)
        prog.fetched += len(page)
        if prog.newest_ts is None or _ts(last) >= prog.newest_ts:
            prog.newest_ts = _ts(last)
            after_id = last.message_id
        await self.cursors.save(
            scope,
            self.kind,
            cursor_id=after_id,
            cursor_ts=prog.newest_ts,
            fetched=prog.fetched,
            finished=False,
        )
        if self.on_page is not None:
            self.on_page(prog, len(page))
        log.info("%s", prog.line())
        return after_id

    def lines(self) -> list[str]:
        return [p.line() for p in self.progress.values()]
