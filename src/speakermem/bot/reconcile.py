"""Reconciliation after downtime: what was deleted or edited on the platform while we were away.

Catch-up (bot/catchup.py) fetches what was posted during an outage; it cannot see a delete or
an edit of a message stored before it. So after every catch-up pass, each channel's stored
messages from `lookback_s` before the outage up to its start (the *window*) are compared with
the platform's history as it is now:

- stored, but missing on the platform: deleted; forgotten with the one forgetting cascade
  (memory/governance/deletions.py), leaving a content-free tombstone;
- on the platform with other text and an edit mark: edited; applied through
  `Governance.apply_edit`, which re-checks the records citing it;
- a thread that no longer exists: every stored reply of it is forgotten; a channel that no
  longer exists: everything it held.

Platforms answer history newest first, and some cap how much may be read (Slack allows some
apps one ``conversations.history`` request a minute), so the window is walked newest first,
page by page, and each channel gets a time `budget_s` per run: a rate limit that asks to wait
past it stops the channel there. What is left is saved (a cursor of kind "reconcile", detail
= the windows still to check), counted, shown in `status` and the log, and checked first on
the next run. Every run writes one audit receipt per workspace. Passes run in a task of
their own, so a slow one never holds up the catch-up of a later outage.

This module holds the decisions (which window, what counts as deleted or edited, what is
left, the progress line) as pure functions, and the walk; the platforms' readers
(integrations/*/reconcile.py) implement `HistoryCheck`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from pydantic import BaseModel

from speakermem.bot.settings import Settings
from speakermem.memory.cursors import HistoryCursors
from speakermem.memory.engine import ChangeStatus, StoredRow
from speakermem.memory.governance.deletions import PlatformDeletions
from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import EditEvent, Scope

log = logging.getLogger(__name__)

KIND = "reconcile"
"""The catch-up cursor kind that holds a channel's reconciliation state."""
ACTOR = "reconcile"
LOOKBACK_S: float = Settings.model_fields["reconcile_lookback_s"].default
"""How far before an outage stored messages are checked (SPEAKERMEM_RECONCILE_LOOKBACK_S)."""
BUDGET_S: float = Settings.model_fields["reconcile_budget_s"].default
"""Seconds one run may spend on one channel, rate-limit waits included
(SPEAKERMEM_RECONCILE_BUDGET_S)."""

Interval = tuple[float, float]
"""A closed span of message times, (low, high) in unix seconds."""

_T = TypeVar("_T")


# ---- what the platform says ------------------------------------------------------------


@dataclass(frozen=True)
class PlatformMessage:
    """A message as the platform holds it now (text as the translator would store it)."""

    text: str
    edited_at: float | None
    """When it was last edited (unix seconds), None if never."""


@dataclass(frozen=True)
class Seen:
    """One page of history: every message of the channel (or thread) with a time in
    [low, high], as the platform holds it now; a stored one it lacks was deleted."""

    low: float
    high: float
    messages: Mapping[str, PlatformMessage]


class Gone(Exception):
    """The channel or thread no longer exists on the platform (deleted)."""


class OutOfBudget(Exception):
    """This run may read no more of the channel: the platform's rate limit asks for a wait
    past the run's budget, or the budget is spent. The message says which."""


class Budget:
    """The time one channel's run may take, rate-limit waits included."""

    def __init__(
        self,
        seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self.deadline = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self.deadline - self._clock())

    async def sleep(self, seconds: float) -> None:
        """Wait out a Retry-After, or stop now if it would end past the budget."""
        if seconds > self.remaining():
            raise OutOfBudget(f"rate limited: asked to wait {seconds:.0f} s")
        await self._sleep(seconds)

    async def read(self, call: Awaitable[_T]) -> _T:
        """One platform read, cut off when the budget runs out (a client that waits out
        rate limits itself is stopped here)."""
        left = self.remaining()
        if left <= 0:
            if asyncio.iscoroutine(call):
                call.close()
            raise OutOfBudget("time budget spent")
        try:
            async with asyncio.timeout(left):
                return await call
        except TimeoutError as exc:
            raise OutOfBudget("time budget spent (waiting on the platform)") from exc


class HistoryCheck(Protocol):
    """A platform's history as reconciliation reads it (integrations/*/reconcile.py)."""

    platform: str

    def channel(self, scope: Scope, low: float, high: float, budget: Budget) -> AsyncIterator[Seen]:
        """Pages of the channel's top-level messages in [low, high], newest first; together
        they cover the span (the last page's `low` is `low`). Raises `Gone` for a deleted
        channel, `OutOfBudget` when the budget stops it."""
        ...

    async def thread(
        self, scope: Scope, thread_id: str, low: float, high: float, budget: Budget
    ) -> Seen:
        """The replies of a thread of the channel in [low, high]; `Gone` if it was deleted."""
        ...


# ---- decisions -------------------------------------------------------------------------


def window(outage_ts: float | None, lookback_s: float) -> Interval | None:
    """The stored messages to check after an outage that began after `outage_ts` (the newest
    message stored before it); None when there is none or reconciliation is off."""
    if outage_ts is None or lookback_s <= 0:
        return None
    return (outage_ts - lookback_s, outage_ts)


def plan(new: Interval | None, pending: Sequence[Interval]) -> list[Interval]:
    """What to check this run, newest first: the new window and whatever an earlier run left
    unchecked, overlaps merged. A span an earlier run did check is checked again when the
    new window covers it: it could have changed during this outage too."""
    spans = sorted((lo, hi) for lo, hi in [*pending, *([new] if new else [])] if hi >= lo)
    merged: list[list[float]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in reversed(merged)]


def after_page(todo: Sequence[Interval], low: float) -> list[Interval]:
    """The plan once its first (newest) span is checked down to `low`, inclusive: what is
    left of that span ends just below it (the next float down: message times are floats)."""
    if not todo:
        return []
    first_low, first_high = todo[0]
    below = math.nextafter(min(low, first_high), -math.inf)  # `low` itself is checked
    if below < first_low:
        return list(todo[1:])
    return [(first_low, below), *todo[1:]]


@dataclass(frozen=True)
class Changes:
    deleted: list[str] = field(default_factory=list)
    edited: list[tuple[str, str, float]] = field(default_factory=list)
    """(message id, the text now, when it was edited)."""


def compare(
    stored: Sequence[StoredRow],
    now: Mapping[str, PlatformMessage],
    seen_ids: frozenset[str] | set[str] = frozenset(),
) -> Changes:
    """Stored messages a page vouches for against what the platform holds now. Missing
    (neither in `now` nor among the ids the run saw on earlier pages) is deleted; marked
    edited with other text is edited. Text that differs without an edit mark is left alone:
    only the platform's own edits count."""
    out = Changes()
    for row in stored:
        current = now.get(row.message_id)
        if current is None:
            if row.message_id not in seen_ids:
                out.deleted.append(row.message_id)
            continue
        if current.edited_at is not None and current.text != row.text:
            out.edited.append((row.message_id, current.text, current.edited_at))
    return out


class ReconcileState(BaseModel):
    """A channel's reconciliation, as saved after every page (the cursor's detail)."""

    todo: list[Interval] = []
    """Spans still to check, newest first."""
    window: Interval | None = None
    """The whole span of this run."""
    checked: int = 0
    deleted: int = 0
    edited: int = 0
    threads_gone: int = 0
    channel_gone: bool = False
    unchecked: int = 0
    """Stored messages left in `todo` when the run stopped early."""
    stopped: str | None = None
    """Why the run stopped before the end (a rate limit, the budget, an error)."""

    @property
    def finished(self) -> bool:
        return not self.todo

    @property
    def checked_to(self) -> float | None:
        """Everything from here up to the window's end is checked."""
        if self.todo:
            return self.todo[0][1]
        return self.window[0] if self.window else None


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def state_line(label: str, state: ReconcileState) -> str:
    """'#eng reconciled 1,240 messages back to 2024-03-01 09:00: 5 deleted, 5 edited', or
    what is left unchecked and why (times in UTC)."""
    if state.channel_gone:
        return f"{label} was deleted on the platform: everything it held is forgotten"
    found = []
    if state.deleted:
        found.append(f"{state.deleted:,} deleted")
    if state.edited:
        found.append(f"{state.edited:,} edited")
    if state.threads_gone:
        found.append(f"{state.threads_gone:,} thread(s) gone")
    changes = ": " + ", ".join(found) if found else ": nothing changed"
    back = state.checked_to
    back_to = f" back to {_stamp(back)}" if back is not None else ""
    if state.finished:
        return f"{label} reconciled {state.checked:,} messages{back_to}{changes}"
    if state.stopped is None:
        return f"{label} reconciling, {state.checked:,} messages checked{back_to}{changes}"
    lo = min(span[0] for span in state.todo)
    hi = max(span[1] for span in state.todo)
    return (
        f"{label} reconciled the newest {state.checked:,} messages{changes}; "
        f"{state.unchecked:,} older ({_stamp(lo)} to {_stamp(hi)}) not checked "
        f"({state.stopped}); the next start resumes"
    )


def cursor_state(detail: Mapping[str, object]) -> ReconcileState:
    """A saved cursor's detail as state (an unreadable one as nothing left to do)."""
    try:
        return ReconcileState.model_validate(dict(detail))
    except ValueError:
        return ReconcileState()


def entry_line(entry: Mapping[str, object]) -> str:
    """A reconcile entry of `Governance.status()["catchup"]` as a line for `status`."""
    channel = str(entry["channel"]).split("/", 2)[-1]
    label = f"#{entry['name']}" if entry.get("name") else channel
    detail = entry.get("detail")
    state = cursor_state(detail if isinstance(detail, Mapping) else {})
    return "reconcile: " + state_line(label, state)


# ---- the walk --------------------------------------------------------------------------


@dataclass
class ChannelReconcile:
    scope: Scope
    name: str | None
    state: ReconcileState

    def line(self) -> str:
        label = f"#{self.name}" if self.name else self.scope.channel
        return state_line(label, self.state)


def merge_spans(a: Interval | None, b: Interval | None) -> Interval | None:
    """One span covering both (two outages' windows waiting for one pass)."""
    if a is None or b is None:
        return a or b
    return (min(a[0], b[0]), max(a[1], b[1]))


class Reconciler:
    """Runs reconciliation for one platform's history after each catch-up pass, in a task of
    its own: a slow, rate-limited pass never delays the catch-up of a later outage."""

    def __init__(
        self,
        deletions: PlatformDeletions,
        cursors: HistoryCursors,
        source: HistoryCheck,
        *,
        lookback_s: float = LOOKBACK_S,
        budget_s: float = BUDGET_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.deletions = deletions
        self.governance = deletions.governance
        self.engine = deletions.governance.engine
        self.cursors = cursors
        self.source = source
        self.lookback_s = lookback_s
        self.budget_s = budget_s
        self._sleep = sleep
        self.progress: dict[Scope, ChannelReconcile] = {}
        """Each channel's latest pass in this process (`status` reads the saved cursors)."""
        self._pending: dict[Scope, Interval | None] = {}
        self._names: dict[Scope, str] = {}
        self._task: asyncio.Task[None] | None = None
        self.runs = 0

    def begin(
        self, outages: Mapping[Scope, float | None], names: Mapping[Scope, str] | None = None
    ) -> None:
        """Reconcile in the background after an outage; `outages` maps each channel to the
        time of its newest message stored before it. Outages reported while a pass runs are
        merged and reconciled by the next pass."""
        for scope, outage_ts in outages.items():
            span = window(outage_ts, self.lookback_s)
            self._pending[scope] = merge_spans(self._pending.get(scope), span)
        self._names.update(names or {})
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="speakermem-reconcile")

    async def _loop(self) -> None:
        while self._pending:
            spans, self._pending = self._pending, {}
            self.runs += 1
            try:
                await self.run(spans, self._names)
            except Exception:
                log.exception("reconciliation failed; the next pass resumes it")
                return

    async def wait(self) -> None:
        """Until no pass is running or pending."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Cancel a running pass: its state is saved per page, so the next one resumes."""
        self._pending = {}
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run(
        self, spans: Mapping[Scope, Interval | None], names: Mapping[Scope, str] | None = None
    ) -> list[ChannelReconcile]:
        """One pass: every channel, one after another, its span (`window`) and what earlier
        passes left unchecked, newest first. One audit receipt per workspace, also when the
        pass is cancelled part-way (what it did is recorded; the rest resumes next time)."""
        runs: dict[tuple[str, str], tuple[Receipt, list[ChannelReconcile]]] = {}
        try:
            for scope, span in spans.items():
                key = (scope.platform, scope.workspace)
                if key not in runs:
                    runs[key] = (Receipt(action="platform-reconcile", target="/".join(key)), [])
                receipt, done = runs[key]
                await self._channel(scope, span, (names or {}).get(scope), receipt, done)
        except asyncio.CancelledError:
            await asyncio.shield(self._audit(runs, interrupted=True))
            raise
        await self._audit(runs, interrupted=False)
        return [prog for _receipt, done in runs.values() for prog in done]

    async def _audit(
        self,
        runs: Mapping[tuple[str, str], tuple[Receipt, list[ChannelReconcile]]],
        *,
        interrupted: bool,
    ) -> None:
        for (platform, workspace), (receipt, done) in runs.items():
            if not done:
                continue
            args = _run_args(done)
            if interrupted:
                args["interrupted"] = True
            await self.deletions.audit(
                Scope(platform=platform, workspace=workspace, channel="*"), ACTOR, receipt, args
            )

    async def _channel(
        self,
        scope: Scope,
        span: Interval | None,
        name: str | None,
        receipt: Receipt,
        done: list[ChannelReconcile],
    ) -> None:
        """Reconcile one channel; its progress joins `done` as soon as it starts."""
        prev = await self.cursors.cursor(scope, KIND)
        pending = cursor_state(prev.detail).todo if prev is not None and not prev.finished else []
        todo = plan(span, pending)
        if not todo:
            return
        state = ReconcileState(todo=todo, window=(min(s[0] for s in todo), max(s[1] for s in todo)))
        prog = self.progress[scope] = ChannelReconcile(scope=scope, name=name, state=state)
        done.append(prog)
        await self._save(scope, state)
        budget = Budget(self.budget_s, sleep=self._sleep)
        seen_ids: set[str] = set()
        try:
            while state.todo:
                low, high = state.todo[0]
                async for seen in self.source.channel(scope, low, high, budget):
                    await self._page(scope, seen, seen_ids, receipt, state, budget)
                    state.todo = after_page(state.todo, seen.low)
                    await self._save(scope, state)
                    log.info("%s", prog.line())
                if state.todo and state.todo[0][0] == low:
                    state.todo.pop(0)  # the reader went through the span
        except asyncio.CancelledError:
            raise
        except Gone:
            state.deleted += await self.deletions.forget_deleted_channel(
                scope, receipt, reason="platform-reconcile", actor=ACTOR
            )
            state.todo = []
            state.channel_gone = True
        except OutOfBudget as exc:
            state.stopped = str(exc)
        except Exception as exc:  # a channel that fails does not stop the others
            state.stopped = f"error: {type(exc).__name__}: {str(exc)[:120]}"
        if state.todo:
            state.unchecked = sum(
                [await self.engine.count_stored(scope, lo, hi) for lo, hi in state.todo]
            )
        await self._save(scope, state)
        if state.stopped:
            log.warning("reconcile: %s", prog.line())
        else:
            log.info("%s", prog.line())

    async def _page(
        self,
        scope: Scope,
        seen: Seen,
        seen_ids: set[str],
        receipt: Receipt,
        state: ReconcileState,
        budget: Budget,
    ) -> None:
        """Compare one page with what the store holds in its span: the channel's own
        messages first, then each thread with replies stored in the span."""
        # only what is still unchecked: a page's newest message may be the previous
        # page's oldest (Slack's and Discord's paging both repeat nothing, but the span
        # bounds are inclusive)
        upper = min(seen.high, state.todo[0][1]) if state.todo else seen.high
        rows = await self.engine.stored_window(scope, seen.low, upper)
        seen_ids.update(seen.messages)
        threads: dict[str, list[StoredRow]] = {}
        for row in rows:
            if row.thread_id is not None:
                threads.setdefault(row.thread_id, []).append(row)
        top = [r for r in rows if r.thread_id is None]
        await self._apply(scope, compare(top, seen.messages, seen_ids), receipt, state)
        for thread_id, replies in threads.items():
            try:
                got = await self.source.thread(scope, thread_id, seen.low, seen.high, budget)
            except Gone:
                n = await self.deletions.forget_thread(
                    scope, thread_id, receipt, reason="platform-reconcile"
                )
                state.deleted += n
                state.threads_gone += 1
                continue
            seen_ids.update(got.messages)
            await self._apply(scope, compare(replies, got.messages, seen_ids), receipt, state)
        state.checked += len(rows)

    async def _apply(
        self, scope: Scope, changes: Changes, receipt: Receipt, state: ReconcileState
    ) -> None:
        if changes.deleted:
            state.deleted += await self.deletions.forget_messages(
                scope, changes.deleted, receipt, reason="platform-reconcile"
            )
        for message_id, text, at in changes.edited:
            edit = EditEvent(
                scope=scope,
                message_id=message_id,
                text=text,
                edited_at=datetime.fromtimestamp(at, tz=UTC),
            )
            status, rechecked = await self.governance.apply_edit(edit)
            if status is ChangeStatus.APPLIED:
                state.edited += 1
                receipt.add("messages_edited", 1)
                receipt.merge(rechecked)

    async def _save(self, scope: Scope, state: ReconcileState) -> None:
        await self.cursors.save(
            scope,
            KIND,
            cursor_id=None,
            cursor_ts=state.checked_to,
            fetched=state.checked,
            finished=state.finished,
            detail=state.model_dump(mode="json"),
        )


def _run_args(done: Sequence[ChannelReconcile]) -> dict[str, object]:
    """The audit entry's arguments: what one run checked and found, over its channels."""
    states = [p.state for p in done]
    return {
        "channels": len(states),
        "checked": sum(s.checked for s in states),
        "deleted": sum(s.deleted for s in states),
        "edited": sum(s.edited for s in states),
        "threads_gone": sum(s.threads_gone for s in states),
        "channels_gone": sum(1 for s in states if s.channel_gone),
        "unchecked": sum(s.unchecked for s in states),
        "stopped": sorted(
            {f"{p.scope.channel}: {p.state.stopped}" for p in done if p.state.stopped}
        ),
    }
