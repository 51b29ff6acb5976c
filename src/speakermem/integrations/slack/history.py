"""Slack channel history for catch-up and backfill (``conversations.history`` + ``replies``).

`SlackHistory` is a `bot.catchup.HistorySource`. Slack answers history newest first and
pages backwards with a cursor, so the range is cut into time windows (a week; the last one
reaches the present, and a catch-up after a few hours is that one window). Each window is
fetched whole (``conversations.history`` with ``oldest``/``latest``, ``inclusive=false``,
200 a page, then ``conversations.replies`` for the threads with replies in it), merged by
``ts`` and yielded oldest first. Everything yielded is therefore older than everything not
yet yielded, which is what makes `CatchUp`'s per-page cursor safe: a run interrupted after
page k resumes from page k's newest ``ts`` and misses nothing; at most one window is held
in memory. Threads that span windows are followed into the next ones.

Threads: a reply posted during the downtime to a thread whose parent is older than the
gap is not in ``conversations.history`` of the gap. Parents are therefore listed from
`thread_lookback_s` before ``oldest`` (one day by default); any of them whose
``latest_reply`` is newer than ``oldest`` has its new replies fetched. Replies to threads
older than the lookback that are revived during a downtime are the one thing not caught up.

Payloads go through the same pure translator as live events (`translate_event`), so bot
messages, joins, other subtypes and malformed messages are skipped exactly the same way.
Names: history payloads carry user ids only; `names` (the adapter's cached directory /
``users.info``) fills them in, once per user per channel.

Rate limits: every call goes through `RateLimitedApi` (shared with the roster
directory): a 429 is waited out for its ``Retry-After`` and the same page is asked again.

`SlackCatchUp` ties it to the adapter's life: a snapshot before connecting, catch-up once
started, and again after every Socket Mode reconnect (Slack does not replay what was sent
while the socket was down). Runs are serialised: starts that arrive while a run is going
are merged (the older start of a channel wins) and run next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.catchup import CatchUp, ChannelProgress, Start
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import MessageEvent, Scope
from speakermem.bot.reconcile import Reconciler
from speakermem.integrations.slack.roster_sync import RateLimitedApi, Sleep
from speakermem.integrations.slack.translate import PLATFORM, PayloadError, translate_event
from speakermem.memory.engine import MemoryEngine

__all__ = ["PAGE", "SlackCatchUp", "SlackHistory", "slack_ts"]

log = logging.getLogger(__name__)

PAGE = 200
"""Messages per history/replies request (Slack recommends at most 200)."""
THREAD_LOOKBACK_S = 24 * 3600.0
WINDOW_S = 7 * 24 * 3600.0
"""A backfill is fetched a week at a time (an empty week doubles the next window)."""
_TICK = Decimal("0.000001")
"""Slack ts have microseconds: `latest` of end + 1 tick, exclusive, includes `end`."""

NameLookup = Callable[[str, str], Awaitable[tuple[str, bool] | None]]
"""(team, user id) -> (display name, is_bot), or None when unknown."""


def slack_ts(after_id: str | None, after_ts: float | None) -> str:
    """The ``oldest`` argument for a start: the message's own ts, else a time."""
    if after_id:
        return after_id
    return f"{max(0.0, after_ts or 0.0):.6f}"


def _fmt(ts: Decimal) -> str:
    return f"{ts:f}"


def _dec(ts: Any) -> Decimal | None:
    """A Slack ts as an exact number (floats would merge ts that differ in the 6th digit)."""
    if not isinstance(ts, str):
        return None
    try:
        return Decimal(ts)
    except InvalidOperation:
        return None


class SlackHistory:
    """Channel history as pages of `MessageEvent`s, oldest first (see the module docstring)."""

    platform = PLATFORM

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        names: NameLookup | None = None,
        before_channel: Callable[[Scope], Awaitable[Any]] | None = None,
        page_size: int = PAGE,
        thread_lookback_s: float = THREAD_LOOKBACK_S,
        window_s: float = WINDOW_S,
        max_retries: int = 5,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.names = names
        self.before_channel = before_channel
        self.page_size = page_size
        self.thread_lookback_s = thread_lookback_s
        self.window_s = window_s
        self.api = RateLimitedApi(client, max_retries=max_retries, sleep=sleep)
        self.skipped = 0
        """Messages the translator rejected as malformed."""

    async def _listing(self, method: str, **args: Any) -> list[dict[str, Any]]:
        """Every message of a cursor-paged listing, in the order Slack gives them."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.api.call(method, limit=self.page_size, cursor=cursor, **args)
            out.extend(m for m in page.get("messages") or [] if isinstance(m, dict))
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor or not page.get("has_more", True):
                return out

    async def fetch_window(
        self,
        channel: str,
        start: Decimal,
        end: Decimal | None,
        *,
        scan_from: Decimal,
        threads: dict[str, Decimal | None],
    ) -> list[dict[str, Any]]:
        """Top-level messages and thread replies with ``start < ts <= end`` (no `end`: up to
        now), oldest first, once each.

        Parents are listed from `scan_from` (<= `start`: the thread lookback); `threads` maps
        the parents whose replies may still come (ts -> latest_reply) and is carried from one
        window to the next, so a thread that spans windows is followed to its last reply."""
        args: dict[str, Any] = {"channel": channel, "oldest": _fmt(scan_from), "inclusive": False}
        if end is not None:
            args["latest"] = _fmt(end + _TICK)  # exclusive bound just past `end`
        top = await self._listing("conversations.history", **args)
        merged: dict[Decimal, dict[str, Any]] = {}
        for msg in top:
            ts = _dec(msg.get("ts"))
            if ts is None:
                self.skipped += 1
                continue
            if ts > start and (end is None or ts <= end):
                merged[ts] = msg
            is_parent = msg.get("thread_ts") in (None, msg.get("ts")) and (
                int(msg.get("reply_count") or 0) > 0
            )
            latest = _dec(msg.get("latest_reply"))
            if is_parent and (latest is None or latest > start):
                threads[msg["ts"]] = latest
        for parent, latest in list(threads.items()):
            rargs: dict[str, Any] = {
                "channel": channel,
                "ts": parent,
                "oldest": _fmt(start),
                "inclusive": False,
            }
            if end is not None:
                rargs["latest"] = _fmt(end + _TICK)
            for msg in await self._listing("conversations.replies", **rargs):
                ts = _dec(msg.get("ts"))
                if ts is None or msg.get("ts") == parent or ts <= start:
                    continue  # Slack lists the parent first, whatever `oldest` says
                if end is None or ts <= end:
                    merged.setdefault(ts, msg)
            if end is None or (latest is not None and latest <= end):
                del threads[parent]  # no reply of it lies in a later window
        return [merged[ts] for ts in sorted(merged)]

    async def pages(
        self, scope: Scope, *, after_id: str | None, after_ts: float | None
    ) -> AsyncIterator[list[MessageEvent]]:
        """Time windows from the start to now, each fetched whole, then yielded oldest first
        (`page_size` events a page): a long backfill holds one window in memory, and its cursor
        advances window by window. An empty window doubles the next (up to 8x), so years of
        silence cost a few calls."""
        if self.before_channel is not None:
            try:
                await self.before_channel(scope)
            except Exception as exc:  # the roster is best effort; the history still comes
                log.warning("slack catch-up: preparing %s failed (%s)", scope.channel, exc)
        start = _dec(slack_ts(after_id, after_ts)) or Decimal(0)
        scan_from = max(Decimal(0), start - Decimal(str(self.thread_lookback_s)))
        base = Decimal(str(self.window_s))
        width = base
        now = Decimal(int(time.time()) + 1)
        threads: dict[str, Decimal | None] = {}
        known: dict[str, str] = {}
        while True:
            end: Decimal | None = start + width if start + width < now else None
            raw = await self.fetch_window(
                scope.channel, start, end, scan_from=scan_from, threads=threads
            )
            for first in range(0, len(raw), self.page_size):
                page: list[MessageEvent] = []
                for msg in raw[first : first + self.page_size]:
                    event = await self._translate(scope, msg, known)
                    if event is not None:
                        page.append(event)
                yield page
            if end is None:
                return
            width = base if raw else min(width * 2, base * 8)
            start = scan_from = end

    async def _translate(
        self, scope: Scope, msg: Mapping[str, Any], known: dict[str, str]
    ) -> MessageEvent | None:
        uid = msg.get("user")
        if self.names is not None and isinstance(uid, str) and uid not in known:
            info = None
            with contextlib.suppress(Exception):  # a name is best effort; the id stands in
                info = await self.names(scope.workspace, uid)
            known[uid] = info[0] if info is not None else ""
        names = {k: v for k, v in known.items() if v}
        try:
            event = translate_event(
                {**msg, "type": "message", "channel": scope.channel},
                team_id=scope.workspace,
                user_names=names,
            )
        except PayloadError as exc:
            self.skipped += 1
            log.warning("slack history: skipped a malformed message (%s)", exc)
            return None
        return event if isinstance(event, MessageEvent) else None


class SlackCatchUp:
    """Catch-up around the adapter's connection: see the module docstring."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        history: SlackHistory,
        *,
        workspace: str | None = None,
        names: Callable[[], Mapping[Scope, str]] | None = None,
        on_page: Callable[[ChannelProgress, int], None] | None = None,
        reconcile: Reconciler | None = None,
    ) -> None:
        """`reconcile`: what was deleted or edited meanwhile is checked after each pass. The
        cursors are saved through `engine`."""
        self.history = history
        self.catchup = CatchUp(
            dispatcher, engine.cursors, history, on_page=on_page, reconcile=reconcile
        )
        self.workspace = workspace
        self.names = names or dict
        self._pending: dict[Scope, Start] = {}
        self._task: asyncio.Task[None] | None = None
        self.runs = 0
        """Catch-up passes started (one at start-up, one per Socket Mode reconnect)."""
        self.reconnects = 0

    async def _mark(self) -> None:
        """Where every channel stands now, merged into what is still to be caught up."""
        starts = await self.catchup.plan(await self.catchup.snapshot(self.workspace))
        for scope, start in starts.items():
            old = self._pending.get(scope)
            if old is None or (old[1] or 0.0) > (start[1] or 0.0):
                self._pending[scope] = start

    async def before_connect(self) -> None:
        await self._mark()

    async def on_reconnect(self) -> None:
        """A new Socket Mode session after a lost one: what was sent meanwhile is not replayed.
        Called before the new session's first event is read, so the snapshot marks the gap."""
        self.reconnects += 1
        log.info("slack socket mode reconnected; catching up what was sent meanwhile")
        await self._mark()
        self.begin()

    def begin(self) -> None:
        """Run what is pending, in the background (the event loop never waits for it)."""
        if not self._pending or (self._task is not None and not self._task.done()):
            return  # a running pass picks the pending starts up when it ends
        self._task = asyncio.create_task(self._loop(), name="speakermem-slack-catchup")

    async def _loop(self) -> None:
        while self._pending:
            starts, self._pending = self._pending, {}
            self.runs += 1
            try:
                results = await self.catchup.run(starts, self.names())
            except Exception:
                log.exception("slack catch-up failed; the next start resumes it")
                return
            total = sum(p.fetched for p in results)
            failed = sum(1 for p in results if p.error)
            log.info(
                "slack catch-up done: %d channel(s), %d message(s)%s",
                len(results),
                total,
                f", {failed} channel(s) failed" if failed else "",
            )

    async def wait(self) -> None:
        """Until no pass (of catch-up, or of the reconciliation after it) is running or
        pending."""
        reconcile = self.catchup.reconcile
        while self.running or (reconcile is not None and reconcile.running):
            if self._task is not None and not self._task.done():
                await asyncio.shield(self._task)
            elif reconcile is not None:
                await reconcile.wait()

    async def stop(self) -> None:
        """Cancel a running pass; its cursors are saved per page, so the next start resumes."""
        self._pending = {}
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.catchup.reconcile is not None:
            await self.catchup.reconcile.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def progress(self) -> list[ChannelProgress]:
        return list(self.catchup.progress.values())

    def lines(self) -> list[str]:
        return self.catchup.lines()
