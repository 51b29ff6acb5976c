"""Calendar windows as UTC half-open [start, end) spans: days, Monday weeks, months, years.

The time-word rules (memory/query/timewords.py, timewords_cjk.py) build their windows here.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta

Span = tuple[datetime, datetime]


def day(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def add_months(year: int, month: int, n: int) -> tuple[int, int]:
    idx = year * 12 + (month - 1) + n
    return idx // 12, idx % 12 + 1


def month(year: int, month: int) -> tuple[datetime, datetime]:
    ny, nm = add_months(year, month, 1)
    return datetime(year, month, 1, tzinfo=UTC), datetime(ny, nm, 1, tzinfo=UTC)


def year(year: int) -> tuple[datetime, datetime]:
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def week_of(d: date) -> tuple[datetime, datetime]:
    monday = d - timedelta(days=d.weekday())
    return day(monday), day(monday + timedelta(days=7))


def shift(dt: datetime, unit: str, n: int) -> datetime:
    """`dt` moved by n units (negative = back); months clamp the day of month."""
    if unit == "day":
        return dt + timedelta(days=n)
    if unit == "week":
        return dt + timedelta(weeks=n)
    months = n if unit == "month" else 12 * n
    y, m = add_months(dt.year, dt.month, months)
    return dt.replace(year=y, month=m, day=min(dt.day, calendar.monthrange(y, m)[1]))


def unit_window(d: date, unit: str) -> tuple[datetime, datetime]:
    """The calendar day/week/month/year containing `d`."""
    if unit == "day":
        return day(d), day(d + timedelta(days=1))
    if unit == "week":
        return week_of(d)
    if unit == "month":
        return month(d.year, d.month)
    return year(d.year)


def safe_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None
