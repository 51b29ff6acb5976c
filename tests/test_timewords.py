"""Deterministic time-word resolution against a fixed anchor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from speakermem.memory.query.timewords import (
    OPEN_START,
    TimeWindow,
    asks_when,
    mentions_time,
    resolve_time,
)

ANCHOR = datetime(2024, 3, 14, 15, 30, tzinfo=UTC)  # a Thursday


def d(y: int, m: int, day: int) -> datetime:
    return datetime(y, m, day, tzinfo=UTC)


CASES = [
    ("What did Alice say yesterday?", d(2024, 3, 13), d(2024, 3, 14), "yesterday"),
    ("anything new today", d(2024, 3, 14), d(2024, 3, 15), "today"),
    ("the day before yesterday", d(2024, 3, 12), d(2024, 3, 13), "the day before yesterday"),
    ("what did we say last night", d(2024, 3, 13), d(2024, 3, 14), "last night"),
    ("What did Bob post last week?", d(2024, 3, 4), d(2024, 3, 11), "last week"),
    ("plans this week", d(2024, 3, 11), d(2024, 3, 18), "this week"),
    ("last month", d(2024, 2, 1), d(2024, 3, 1), "last month"),
    ("this month", d(2024, 3, 1), d(2024, 4, 1), "this month"),
    ("last year", d(2023, 1, 1), d(2024, 1, 1), "last year"),
    ("this year", d(2024, 1, 1), d(2025, 1, 1), "this year"),
    ("last weekend", d(2024, 3, 9), d(2024, 3, 11), "last weekend"),
    ("3 days ago", d(2024, 3, 11), d(2024, 3, 12), "3 days ago"),
    ("two weeks ago", d(2024, 2, 26), d(2024, 3, 4), "two weeks ago"),
    ("a month ago", d(2024, 2, 1), d(2024, 3, 1), "a month ago"),
    ("6 months ago", d(2023, 9, 1), d(2023, 10, 1), "6 months ago"),
    ("a year ago", d(2023, 1, 1), d(2024, 1, 1), "a year ago"),
    ("a few days ago", d(2024, 3, 9), d(2024, 3, 13), "a few days ago"),
    ("in the past 3 days", d(2024, 3, 11), d(2024, 3, 15), "in the past 3 days"),
    ("over the last two weeks", d(2024, 2, 29), d(2024, 3, 15), "over the last two weeks"),
    ("the past week", d(2024, 3, 7), d(2024, 3, 15), "the past week"),
    ("What happened in May?", d(2023, 5, 1), d(2023, 6, 1), "in May"),
    ("What happened in March?", d(2024, 3, 1), d(2024, 4, 1), "in March"),
    ("in Feb", d(2024, 2, 1), d(2024, 3, 1), "in Feb"),
    ("last March", d(2023, 3, 1), d(2023, 4, 1), "last March"),
    ("last February", d(2024, 2, 1), d(2024, 3, 1), "last February"),
    ("in early May", d(2023, 5, 1), d(2023, 5, 11), "in early May"),
    ("in May 2023", d(2023, 5, 1), d(2023, 6, 1), "in May 2023"),
    ("in Sept. 2022", d(2022, 9, 1), d(2022, 10, 1), "in Sept. 2022"),
    ("What did Carol say on 8 May 2023?", d(2023, 5, 8), d(2023, 5, 9), "on 8 May 2023"),
    ("on the 8th of May 2023", d(2023, 5, 8), d(2023, 5, 9), "on the 8th of May 2023"),
    ("May 8th, 2023", d(2023, 5, 8), d(2023, 5, 9), "May 8th, 2023"),
    ("on May 8", d(2023, 5, 8), d(2023, 5, 9), "on May 8"),
    ("March 2", d(2024, 3, 2), d(2024, 3, 3), "March 2"),
    ("2023-05-08", d(2023, 5, 8), d(2023, 5, 9), "2023-05-08"),
    ("What did we decide in 2023?", d(2023, 1, 1), d(2024, 1, 1), "in 2023"),
    ("budget 2022?", d(2022, 1, 1), d(2023, 1, 1), "2022"),
    ("last Friday", d(2024, 3, 8), d(2024, 3, 9), "last Friday"),
    ("on Friday", d(2024, 3, 8), d(2024, 3, 9), "on Friday"),
    ("on Thursday", d(2024, 3, 14), d(2024, 3, 15), "on Thursday"),
    ("last Thursday", d(2024, 3, 7), d(2024, 3, 8), "last Thursday"),
    ("the week before 8 May 2023", d(2023, 5, 1), d(2023, 5, 8), "the week before 8 May 2023"),
    ("the day after 8 May 2023", d(2023, 5, 9), d(2023, 5, 10), "the day after 8 May 2023"),
    ("in the summer", d(2023, 6, 1), d(2023, 9, 1), "in the summer"),
    ("last summer", d(2023, 6, 1), d(2023, 9, 1), "last summer"),
    ("this winter", d(2023, 12, 1), d(2024, 3, 1), "this winter"),
    ("summer 2022", d(2022, 6, 1), d(2022, 9, 1), "summer 2022"),
    ("Has Bob posted recently?", d(2024, 2, 13), d(2024, 3, 15), "recently"),
    ("since last week", d(2024, 3, 4), d(2024, 3, 15), "since last week"),
    ("before May 2023", OPEN_START, d(2023, 5, 1), "before May 2023"),
    ("after 2022", d(2023, 1, 1), d(2024, 3, 15), "after 2022"),
    ("until March 2023", OPEN_START, d(2023, 4, 1), "until March 2023"),
]


@pytest.mark.parametrize(("question", "start", "end", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_resolve(question: str, start: datetime, end: datetime, phrase: str) -> None:
    w = resolve_time(question, ANCHOR)
    assert w is not None
    assert (w.start, w.end, w.phrase) == (start, end, phrase)
    assert w.start.tzinfo is not None and w.end.tzinfo is not None


@pytest.mark.parametrize(
    "question",
    [
        "",
        "What does Alice think about the logo?",
        "Alice may know the answer",
        "What did Bob say about the Spring Boot upgrade?",
        "did the server fall over",
        "we have 2000 users",
        "the 2024 budget draft",
        "meet at 12:30",
        "version 2.2023 is out",
        "what did they say each time",
        "2023-13-40",
        "x" * 10_000,
    ],
)
def test_no_time(question: str) -> None:
    assert resolve_time(question, ANCHOR) is None


def test_longest_expression_wins() -> None:
    w = resolve_time("what happened in May 2023 on 8 May 2023", ANCHOR)
    assert w is not None and w.phrase == "on 8 May 2023"


def test_anchor_timezone_normalised_and_naive_taken_as_utc() -> None:
    local = datetime(2024, 3, 15, 1, 0, tzinfo=timezone(timedelta(hours=5)))  # 14 Mar 20:00 UTC
    w = resolve_time("yesterday", local)
    assert w is not None and w.start == d(2024, 3, 13)
    naive = resolve_time("yesterday", datetime(2024, 3, 14, 12))
    assert naive is not None and naive.start == d(2024, 3, 13)


def test_year_less_date_after_anchor_means_last_year() -> None:
    w = resolve_time("on 20 March", ANCHOR)
    assert w is not None and w.start == d(2023, 3, 20)


def test_impossible_date_degrades_to_its_month() -> None:
    w = resolve_time("on 31 Feb 2023", ANCHOR)
    assert w is not None and (w.start, w.end) == (d(2023, 2, 1), d(2023, 3, 1))


def test_leap_day_without_year() -> None:
    w = resolve_time("on 29 Feb", datetime(2025, 6, 1, tzinfo=UTC))
    assert w is not None and w.start == d(2024, 2, 29)


def test_window_helpers() -> None:
    w = resolve_time("What did Alice say last week about the launch?", ANCHOR)
    assert isinstance(w, TimeWindow)
    assert w.without_phrase("What did Alice say last week about the launch?") == (
        "What did Alice say about the launch?"
    )
    assert w.contains(datetime(2024, 3, 5, 9))
    assert not w.contains(d(2024, 3, 11))


def test_week_before_an_explicit_date() -> None:
    w = resolve_time("what did we decide the week before 8 May 2023", ANCHOR)
    assert w is not None
    assert (w.start, w.end) == (d(2023, 5, 1), d(2023, 5, 8))
    assert w.phrase == "the week before 8 May 2023"


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("When did Alice join?", True),
        ("What date is the launch?", True),
        ("How long ago did Bob leave?", True),
        ("What did Bob say last week?", True),
        ("What does Bob like?", False),
        ("", False),
    ],
)
def test_mentions_time(question: str, expected: bool) -> None:
    assert mentions_time(question) is expected


def test_asks_when_only_for_time_questions() -> None:
    assert asks_when("when is the deadline")
    assert not asks_when("what did Bob say last week")
