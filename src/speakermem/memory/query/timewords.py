"""Deterministic time-expression resolution for questions (EGMemory's resolve_date idea).

"What did Alice say last week?" carries a time constraint that search must not treat as topic
words. `resolve_time` turns the first/longest such expression into a UTC [start, end) window
against an anchor (usually the newest message time or "now") and returns the matched phrase so
callers can strip it from the search query. Pure regex and calendar arithmetic: no date
libraries, no I/O, the same answer for the same input.

Conventions (documented because every choice here is a guess about intent):
- days are UTC calendar days; weeks start on Monday;
- "last week/month/year" is the previous calendar unit; "the past week", "the last 3 days",
  "in the past 2 months" are rolling windows ending at the end of the anchor's day;
- "N weeks/months ago" is the calendar unit containing that point; "a few/several X ago" spans
  2-5 units back;
- a year-less month or date ("in May", "May 8") is the most recent one at or before the anchor;
  "last May" is the most recent May before the anchor's month;
- seasons are meteorological, northern hemisphere (summer = June-August; winter Y = Dec Y-Feb);
- "since/after X" runs to the end of the anchor's day; "before X" and "until X" start at 1970.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from pydantic import BaseModel, ConfigDict

from speakermem.memory.models import utc
from speakermem.memory.query.calendar_spans import Span
from speakermem.memory.query.calendar_spans import add_months as _add_months
from speakermem.memory.query.calendar_spans import day as _day
from speakermem.memory.query.calendar_spans import month as _month
from speakermem.memory.query.calendar_spans import safe_date as _safe_date
from speakermem.memory.query.calendar_spans import shift as _shift
from speakermem.memory.query.calendar_spans import unit_window as _unit_window
from speakermem.memory.query.calendar_spans import week_of as _week_of
from speakermem.memory.query.calendar_spans import year as _year
from speakermem.memory.query.timewords_cjk import CJK_ASKS_WHEN, CJK_RULES

OPEN_START = datetime(1970, 1, 1, tzinfo=UTC)
"""Start of open-ended windows ("before May")."""

RECENT_DAYS = 30
"""How far back "recently" / "lately" reaches."""

_MAX_SCAN_CHARS = 20_000
"""Questions longer than this are scanned only up to here (hostile input stays cheap)."""


class TimeWindow(BaseModel):
    """A resolved time constraint: the UTC half-open window [start, end) and the phrase matched."""

    model_config = ConfigDict(frozen=True)

    start: datetime
    end: datetime
    phrase: str

    def contains(self, ts: datetime) -> bool:
        """True when `ts` (naive = UTC) falls inside the window."""
        t = utc(ts)
        return self.start <= t < self.end

    def without_phrase(self, text: str) -> str:
        """`text` without the matched phrase (first occurrence), whitespace collapsed."""
        idx = text.find(self.phrase)
        if idx < 0:
            idx = text.lower().find(self.phrase.lower())
        if idx < 0:
            return " ".join(text.split())
        return " ".join((text[:idx] + " " + text[idx + len(self.phrase) :]).split())


# --------------------------------------------------------------------------------------------
# vocabulary

_MONTHS = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "may": 5,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_WEEKDAYS = {"mon": 0, "tues": 1, "wednes": 2, "thurs": 3, "fri": 4, "satur": 5, "sun": 6}
_NUM_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_FUZZY = re.compile(r"^(?:a\s+)?(?:few|several|couple(?:\s+of)?)$")
_NUM = (
    r"(?:\d{1,3}|a\s+couple\s+of|couple\s+of|a\s+few|few|several"
    r"|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
)
_UNIT = r"(?P<unit>day|week|month|year)s?"
_SEASON_START = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}

# Words that make a bare month or year a time reference ("in May"; not "Alice may ...").
_PREPS = {
    "in",
    "during",
    "since",
    "until",
    "till",
    "before",
    "after",
    "by",
    "from",
    "of",
    "through",
    "throughout",
    "around",
    "to",
    "for",
    "on",
    "year",
    "circa",
}
_PREV_WORD = re.compile(r"([a-z]+)\W*$", re.IGNORECASE)


def _num(text: str) -> int | None:
    """A count from digits or number words; None for fuzzy counts ("a few")."""
    t = " ".join(text.lower().split())
    if t.isdigit():
        return int(t)
    if _FUZZY.match(t):
        return 2 if "couple" in t else None
    return _NUM_WORDS.get(t)


def _prev_word(text: str, pos: int) -> str:
    m = _PREV_WORD.search(text[max(0, pos - 24) : pos])
    return m.group(1).lower() if m else ""


# --------------------------------------------------------------------------------------------
# base expressions: each handler gets (match, text, anchor) and returns (start, end) or None

Handler = Callable[[re.Match[str], str, datetime], Span | None]


def _h_iso_date(m: re.Match[str], _t: str, _a: datetime) -> Span | None:
    d = _safe_date(int(m["y"]), int(m["m"]), int(m["d"]))
    return _unit_window(d, "day") if d else None


def _h_iso_month(m: re.Match[str], _t: str, _a: datetime) -> Span | None:
    month = int(m["m"])
    return _month(int(m["y"]), month) if 1 <= month <= 12 else None


def _h_full_date(m: re.Match[str], _t: str, _a: datetime) -> Span | None:
    d = _safe_date(int(m["y"]), _MONTHS[m["mon"][:3].lower()], int(m["d"]))
    return _unit_window(d, "day") if d else None


def _h_day_month(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    """A year-less date: the most recent one at or before the anchor's day."""
    month, day = _MONTHS[m["mon"][:3].lower()], int(m["d"])
    if not 1 <= day <= 31:
        return None
    today = a.date()
    for year in range(today.year, today.year - 9, -1):
        d = _safe_date(year, month, day)
        if d and d <= today:
            return _unit_window(d, "day")
    return None


def _part_of_month(y: int, month: int, q: str | None) -> Span:
    start, end = _month(y, month)
    q = (q or "").lower()
    if q.startswith("early"):
        return start, start + timedelta(days=10)
    if q.startswith("mid"):
        return start + timedelta(days=10), start + timedelta(days=20)
    if q.startswith("late"):
        return start + timedelta(days=20), end
    return start, end


def _h_month_year(m: re.Match[str], _t: str, _a: datetime) -> Span | None:
    return _part_of_month(int(m["y"]), _MONTHS[m["mon"][:3].lower()], m["q"])


def _h_month(m: re.Match[str], text: str, a: datetime) -> Span | None:
    """A month without a year: needs a qualifier or a preposition before it."""
    month = _MONTHS[m["mon"][:3].lower()]
    q = (m["q"] or "").lower()
    if not q and _prev_word(text, m.start()) not in _PREPS:
        return None
    if q == "last":
        year = a.year if month < a.month else a.year - 1
    elif q == "this":
        year = a.year
    else:
        year = a.year if month <= a.month else a.year - 1
    return _part_of_month(year, month, q)


def _h_year(m: re.Match[str], text: str, a: datetime) -> Span | None:
    """A bare year: only after a preposition or at the end of a clause ("... in 2023?")."""
    year = int(m["y"])
    if not 1970 <= year <= a.year + 1:
        return None
    after = text[m.end() : m.end() + 40].lstrip()
    at_clause_end = not after or after[0] in "?.!,;)"
    if not at_clause_end and _prev_word(text, m.start()) not in _PREPS:
        return None
    return _year(year)


def _h_named_day(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    word = " ".join(m.group(0).lower().split())
    today = a.date()
    if word in {"yesterday", "last night"}:
        return _unit_window(today - timedelta(days=1), "day")
    if word.endswith("before yesterday"):
        return _unit_window(today - timedelta(days=2), "day")
    return _unit_window(today, "day")


def _h_weekday(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    target = _WEEKDAYS[m["wd"].lower()]
    today = a.date()
    q = (m["q"] or "").lower()
    if q == "this":
        d = today - timedelta(days=today.weekday()) + timedelta(days=target)
    else:
        back = (today.weekday() - target) % 7
        if q in {"last", "past", "previous"} and back == 0:
            back = 7
        d = today - timedelta(days=back)
    return _unit_window(d, "day")


def _h_last_unit(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    """Previous calendar unit ("last week" = Monday-Sunday before this week)."""
    unit = m["unit"].lower()
    today = a.date()
    if unit == "weekend":
        return _last_weekend(today)
    if unit == "week":
        return _week_of(today - timedelta(days=7))
    if unit == "month":
        return _month(*_add_months(today.year, today.month, -1))
    return _year(today.year - 1)


def _last_weekend(today: date) -> Span:
    """The most recent Saturday-Sunday that has started before today (today excluded)."""
    back = (today.weekday() - 5) % 7 or 7
    sat = today - timedelta(days=back)
    return _day(sat), _day(sat + timedelta(days=2))


def _h_this_unit(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    unit = m["unit"].lower()
    today = a.date()
    if unit == "weekend":
        sat = today - timedelta(days=today.weekday()) + timedelta(days=5)
        return _day(sat), _day(sat + timedelta(days=2))
    return _unit_window(today, unit)


def _end_of_anchor_day(a: datetime) -> datetime:
    return _day(a.date() + timedelta(days=1))


def _h_rolling(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    """ "the past 3 days", "over the last few weeks", "the past month": rolling back from now."""
    unit = m["unit"].lower()
    end = _end_of_anchor_day(a)
    if unit == "weekend":
        return _last_weekend(a.date())
    n_text = m.groupdict().get("n")
    n = 1 if not n_text else _num(n_text)
    if n is None:
        n = 2 if "couple" in n_text.lower() else 5  # type: ignore[union-attr]
    if n <= 0 or n > 500:
        return None
    start = _shift(_day(a.date()), unit, -n)
    return start, end


def _h_ago(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    unit = m["unit"].lower()
    n = _num(m["n"])
    today = a.date()
    if n is None:  # "a few days ago": 2-5 units back
        lo, _ = _unit_window(_shift(_day(today), unit, -5).date(), unit)
        _, hi = _unit_window(_shift(_day(today), unit, -2).date(), unit)
        return lo, hi
    if n > 500:
        return None
    return _unit_window(_shift(_day(today), unit, -n).date(), unit)


def _season(year: int, name: str) -> Span:
    start_month = _SEASON_START[name]
    start = datetime(year, start_month, 1, tzinfo=UTC)
    return start, datetime(*_add_months(year, start_month, 3), 1, tzinfo=UTC)


def _h_season(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    name = m["s"].lower()
    q = (m["q"] or "").lower()
    if m["y"]:
        return _season(int(m["y"]), name)
    if not q and not m["prep"]:
        return None  # a bare "spring"/"fall" is too often a word, not a time
    if q == "this":
        # In January-May "this winter" is the one that began last December.
        year = a.year - 1 if name == "winter" and a.month < 6 else a.year
        return _season(year, name)
    # most recent occurrence that started (bare) or ended ("last") at or before the anchor
    for year in range(a.year, a.year - 3, -1):
        start, end = _season(year, name)
        if (q in {"last", "past", "previous"} and end <= a) or (
            q not in {"last", "past", "previous"} and start <= a
        ):
            return start, end
    return None


def _h_recent(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
    return _day(a.date() - timedelta(days=RECENT_DAYS)), _end_of_anchor_day(a)


_I = re.IGNORECASE
_RULES: list[tuple[re.Pattern[str], Handler]] = [
    (re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b", _I), _h_iso_date),
    (re.compile(r"\b(?P<y>(?:19|20)\d{2})-(?P<m>\d{2})\b(?!-\d)", _I), _h_iso_month),
    (
        re.compile(
            rf"\b(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon>{_MONTH})\b\.?,?\s+"
            r"(?P<y>\d{4})\b",
            _I,
        ),
        _h_full_date,
    ),
    (
        re.compile(
            rf"\b(?P<mon>{_MONTH})\b\.?\s+(?:the\s+)?(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b,?\s+"
            r"(?P<y>\d{4})\b",
            _I,
        ),
        _h_full_date,
    ),
    (
        re.compile(rf"\b(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon>{_MONTH})\b", _I),
        _h_day_month,
    ),
    (
        re.compile(
            rf"\b(?P<mon>{_MONTH})\b\.?\s+(?:the\s+)?(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b(?![:.]?\d)",
            _I,
        ),
        _h_day_month,
    ),
    (
        re.compile(
            rf"\b(?:(?P<q>early|mid|late)[\s-]+)?(?P<mon>{_MONTH})\b\.?,?\s+(?:of\s+)?"
            r"(?P<y>\d{4})\b",
            _I,
        ),
        _h_month_year,
    ),
    (
        re.compile(
            rf"\b(?:(?P<q>last|this|early|mid|late)[\s-]+)?(?P<mon>{_MONTH})\b(?![\s.,]*\d)", _I
        ),
        _h_month,
    ),
    (re.compile(r"(?<![\d#$£€.,/-])\b(?P<y>(?:19|20)\d{2})\b(?![-/:.,]?\d)", _I), _h_year),
    (
        re.compile(
            r"\b(?:(?:the\s+)?day\s+before\s+yesterday|yesterday|last\s+night"
            r"|(?:earlier\s+)?today|tonight|this\s+(?:morning|afternoon|evening))\b",
            _I,
        ),
        _h_named_day,
    ),
    (
        re.compile(
            r"\b(?:(?P<q>last|this|past|previous)\s+)?"
            r"(?P<wd>mon|tues|wednes|thurs|fri|satur|sun)day\b",
            _I,
        ),
        _h_weekday,
    ),
    (re.compile(r"\b(?:last|previous)\s+(?P<unit>week|weekend|month|year)\b", _I), _h_last_unit),
    (
        re.compile(
            r"\b(?:earlier\s+)?(?:this|the\s+current)\s+(?P<unit>week|weekend|month|year)\b", _I
        ),
        _h_this_unit,
    ),
    (
        re.compile(
            rf"\b(?:(?:in|over|during|within|for)\s+)?(?:the\s+|this\s+)?(?:past|last|previous)"
            rf"\s+(?P<n>{_NUM})\s+{_UNIT}\b",
            _I,
        ),
        _h_rolling,
    ),
    (
        re.compile(
            r"\b(?:(?:in|over|during|within|for)\s+)?(?:(?:the|this)\s+(?:past|last|previous)"
            r"|past)\s+(?P<unit>day|week|weekend|month|year)\b",
            _I,
        ),
        _h_rolling,
    ),
    (re.compile(rf"\b(?P<n>{_NUM})\s+{_UNIT}\s+ago\b", _I), _h_ago),
    (
        re.compile(
            r"\b(?:(?P<q>last|this|past|previous)\s+|(?P<prep>(?:in|during|over|through)"
            r"\s+(?:the\s+)?))?(?P<s>spring|summer|autumn|fall|winter)\b"
            r"(?:\s+(?:of\s+)?(?P<y>(?:19|20)\d{2})\b)?",
            _I,
        ),
        _h_season,
    ),
    (
        re.compile(r"\b(?:recently|lately|of\s+late|in\s+recent\s+(?:days|weeks))\b", _I),
        _h_recent,
    ),
]

# A modifier right before an expression: "the week before", "since", "in", "on the" ...
_MODIFIER = re.compile(
    r"(?:\b(?P<rel>the\s+(?P<unit>day|week|month|year)\s+(?P<dir>before|after))"
    r"|\b(?P<op>since|after|before|until|till|prior\s+to|by|in|on|during|from|around|at"
    r"|throughout|through|circa))\s+(?:the\s+)?$",
    _I,
)
_SINCE = {"since", "from"}
_UNTIL = {"until", "till", "by", "through"}


def _apply_modifier(m: re.Match[str], span: Span, anchor: datetime) -> Span:
    start, end = span
    if m["rel"]:
        unit, direction = m["unit"].lower(), m["dir"].lower()
        if direction == "before":
            return _shift(start, unit, -1), start
        return end, _shift(end, unit, 1)
    op = " ".join(m["op"].lower().split())
    open_end = max(end, _end_of_anchor_day(anchor))
    if op in _SINCE:
        return start, open_end
    if op == "after":
        return end, max(open_end, end + timedelta(days=1))
    if op in {"before", "prior to"}:
        return OPEN_START, start
    if op in _UNTIL:
        return OPEN_START, end
    return start, end


def resolve_time(question: str, anchor: datetime) -> TimeWindow | None:
    """The longest time expression in `question` as a UTC window relative to `anchor`, or None.

    Longest wins so "on 8 May 2023" beats "May 2023" and "2023"; ties go to the earliest.
    """
    if not question:
        return None
    text = question[:_MAX_SCAN_CHARS]
    a = utc(anchor)
    best: tuple[int, int, Span] | None = None
    for pattern, handler in (*_RULES, *CJK_RULES):
        for m in pattern.finditer(text):
            span = handler(m, text, a)
            if span is None:
                continue
            s, e = m.start(), m.end()
            for _ in range(3):  # "in the week before 8 May" = two modifiers
                lo = max(0, s - 40)
                mod = _MODIFIER.search(text[lo:s])
                if not mod or (lo + mod.start() > 0 and text[lo + mod.start() - 1].isalnum()):
                    break
                span = _apply_modifier(mod, span, a)
                s -= len(mod.group(0))
            if span[0] >= span[1]:
                continue
            if best is None or (e - s, -s) > (best[1] - best[0], -best[0]):
                best = (s, e, span)
    if best is None:
        return None
    s, e, (start, end) = best
    return TimeWindow(start=start, end=end, phrase=text[s:e])


_ASKS_WHEN = re.compile(
    r"\b(?:when|what\s+(?:time|date|day|year|month|week)|which\s+(?:day|date|year|month|week)"
    r"|how\s+long(?:\s+ago)?|since\s+when|how\s+recently|at\s+what\s+point)\b",
    _I,
)
_REFERENCE_ANCHOR = datetime(2100, 1, 1, tzinfo=UTC)


def asks_when(question: str) -> bool:
    """True for questions whose answer is a time ("when did ...", "what date ...")."""
    text = question[:_MAX_SCAN_CHARS]
    return bool(_ASKS_WHEN.search(text) or CJK_ASKS_WHEN.search(text))


def mentions_time(question: str) -> bool:
    """True when the question asks for a time or contains a time expression.

    Callers use it to show timestamps prominently and to prefer dated evidence.
    """
    return asks_when(question) or resolve_time(question, _REFERENCE_ANCHOR) is not None
