"""Reconciliation's pure decisions (bot/reconcile.py): the window, the plan and what is left
of it, what counts as deleted or edited, the budget, the status line."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime

import pytest

from speakermem.bot.progress import cursor_line
from speakermem.bot.reconcile import (
    Budget,
    OutOfBudget,
    PlatformMessage,
    ReconcileState,
    after_page,
    compare,
    merge_spans,
    plan,
    state_line,
    window,
)
from speakermem.memory.store.reconcile import StoredRow

DAY = 86400.0
T = datetime(2024, 3, 1, 12, 0, tzinfo=UTC).timestamp()


def row(mid: str, text: str, ts: float = T, edited_at: float | None = None) -> StoredRow:
    return StoredRow(message_id=mid, ts=ts, thread_id=None, text=text, edited_at=edited_at)


def test_the_window_reaches_lookback_before_the_outage_and_zero_turns_it_off() -> None:
    assert window(T, DAY) == (T - DAY, T)
    assert window(T, 0) is None
    assert window(None, DAY) is None  # nothing stored before: nothing to check


def test_plan_checks_the_new_window_and_what_an_earlier_run_left_newest_first() -> None:
    new = (T - DAY, T)
    assert plan(new, []) == [new]
    # an earlier run stopped with an older span unchecked: both, newest first
    older = (T - 3 * DAY, T - 2 * DAY)
    assert plan(new, [older]) == [new, older]
    # overlapping spans merge (a span checked before is checked again: it may have changed)
    assert plan(new, [(T - 1.5 * DAY, T - 0.5 * DAY)]) == [(T - 1.5 * DAY, T)]
    assert plan(None, [older]) == [older]
    assert plan(None, []) == []


def test_two_outages_waiting_for_one_pass_are_checked_as_one_span() -> None:
    first, second = (T - DAY, T), (T + 3600 - DAY, T + 3600)
    assert merge_spans(first, second) == (T - DAY, T + 3600)
    assert merge_spans(None, second) == second and merge_spans(first, None) == first
    assert merge_spans(None, None) is None


def test_after_a_page_the_span_left_ends_just_below_its_oldest_message() -> None:
    todo = [(T - DAY, T), (T - 3 * DAY, T - 2 * DAY)]
    left = after_page(todo, T - 100)
    assert left[0] == (T - DAY, math.nextafter(T - 100, -math.inf)) and left[1] == todo[1]
    assert left[0][1] < T - 100  # the page's oldest message is not counted as unchecked
    assert after_page(todo, T - DAY) == [todo[1]]  # the last page of the span
    assert after_page(todo, T - 2 * DAY) == [todo[1]]
    assert after_page([], T) == []


def test_compare_missing_is_deleted_edited_needs_the_platforms_edit_mark() -> None:
    stored = [
        row("a", "kept"),
        row("b", "will be deleted"),
        row("c", "old words"),
        row("d", "text differs, never edited"),
        row("e", "seen on an earlier page"),
    ]
    now = {
        "a": PlatformMessage(text="kept", edited_at=None),
        "c": PlatformMessage(text="new words", edited_at=T + 60),
        "d": PlatformMessage(text="something else", edited_at=None),
    }
    changes = compare(stored, now, {"e"})
    assert changes.deleted == ["b"]
    assert changes.edited == [("c", "new words", T + 60)]
    # an edit mark with the same text is no edit
    same = compare([row("a", "kept")], {"a": PlatformMessage(text="kept", edited_at=T)})
    assert same.edited == [] and same.deleted == []


def test_budget_waits_out_a_retry_after_it_can_afford_and_stops_at_one_it_cannot() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    async def scenario() -> None:
        budget = Budget(10.0, clock=lambda: now[0], sleep=sleep)
        await budget.sleep(6)
        assert budget.remaining() == 4.0
        with pytest.raises(OutOfBudget, match="asked to wait 60 s"):
            await budget.sleep(60)
        now[0] += 4
        with pytest.raises(OutOfBudget, match="budget spent"):
            await budget.read(asyncio.sleep(0))

    asyncio.run(scenario())
    assert slept == [6]


def test_budget_cuts_off_a_read_that_outlasts_it() -> None:
    async def scenario() -> None:
        budget = Budget(0.05)
        with pytest.raises(OutOfBudget, match="waiting on the platform"):
            await budget.read(asyncio.sleep(5))

    asyncio.run(scenario())


def test_lines_say_what_was_checked_found_and_left() -> None:
    done = ReconcileState(window=(T - DAY, T), checked=1240, deleted=5, edited=5)
    assert state_line("#eng", done) == (
        "#eng reconciled 1,240 messages back to 2024-02-29 12:00: 5 deleted, 5 edited"
    )
    quiet = ReconcileState(window=(T - DAY, T), checked=3)
    assert state_line("#eng", quiet).endswith(": nothing changed")
    stopped = ReconcileState(
        todo=[(T - DAY, T - 3600)],
        window=(T - DAY, T),
        checked=15,
        deleted=2,
        unchecked=25,
        stopped="rate limited: asked to wait 60 s",
    )
    assert state_line("#eng", stopped) == (
        "#eng reconciled the newest 15 messages: 2 deleted; 25 older (2024-02-29 12:00 to "
        "2024-03-01 11:00) not checked (rate limited: asked to wait 60 s); the next start resumes"
    )
    going = ReconcileState(todo=[(T - DAY, T - 3600)], window=(T - DAY, T), checked=200)
    assert state_line("#eng", going).startswith("#eng reconciling, 200 messages checked back to")
    gone = ReconcileState(window=(T - DAY, T), channel_gone=True)
    assert "was deleted on the platform" in state_line("#eng", gone)


def test_status_renders_a_saved_reconcile_cursor() -> None:
    stopped = ReconcileState(
        todo=[(T - DAY, T - 3600)], window=(T - DAY, T), checked=15, unchecked=25, stopped="x"
    )
    entry = {
        "channel": "slack/T1/C1",
        "name": "eng",
        "kind": "reconcile",
        "finished": False,
        "detail": stopped.model_dump(mode="json"),
    }
    assert cursor_line(entry) == "reconcile: " + state_line("#eng", stopped)
