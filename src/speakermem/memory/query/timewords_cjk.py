"""Relative and calendar time words in Chinese, Japanese and Korean questions.

The same conventions as the English rules (memory/query/timewords.py): UTC calendar days,
weeks from Monday, "last week" the previous calendar week, a bare weekday or a year-less
date the most recent one at or before the anchor's day, "N days ago" the day N days back.
CJK writes them without spaces, so the patterns match inside a run ("李伟上周五说了什么").

Words about the future (明天, 下周, 来週, 来月, 다음 주) give no window: the messages that
mention them were written before, so a window after the newest message would hide them;
the words stay in the question as search terms instead (they are in those messages).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta

from speakermem.memory.query.calendar_spans import (
    Span,
    add_months,
    day,
    month,
    safe_date,
    unit_window,
    week_of,
    year,
)

Handler = Callable[[re.Match[str], str, datetime], Span | None]

RECENT_DAYS = 30
"""How far back 最近 / 最近 / 최근 reach (as "recently" does in English)."""

_DIGITS = {c: i for i, c in enumerate("〇一二三四五六七八九")} | {"两": 2, "兩": 2}
_KO_DIGITS = {"한": 1, "두": 2, "세": 3, "네": 4, "다섯": 5, "여섯": 6, "일곱": 7, "여덟": 8}
_NUM = r"(?P<n>\d{1,3}|[〇一二两兩三四五六七八九十]{1,3}|한|두|세|네|다섯|여섯|일곱|여덟)"

# weekday characters: Chinese 周一..周日 (日/天 = Sunday), Japanese 月曜..日曜, Korean 월요일..
_ZH_WD = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_JA_WD = {"月": 0, "火": 1, "水": 2, "木": 3, "金": 4, "土": 5, "日": 6}
_KO_WD = {"월": 0, "화": 1, "수": 2, "목": 3, "금": 4, "토": 5, "일": 6}


def _num(text: str) -> int | None:
    """A count from digits, Chinese numerals (up to 99) or Korean native numbers."""
    if text.isdigit():
        return int(text)
    if text in _KO_DIGITS:
        return _KO_DIGITS[text]
    if "十" in text:
        tens, _, ones = text.partition("十")
        t = _DIGITS.get(tens, 0) if tens else 1
        o = _DIGITS.get(ones, 0) if ones else 0
        return (
            t * 10 + o if (not tens or tens in _DIGITS) and (not ones or ones in _DIGITS) else None
        )
    if len(text) == 1 and text in _DIGITS:
        return _DIGITS[text]
    return None


def _named_day(back: int) -> Handler:
    def handler(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
        return unit_window(a.date() - timedelta(days=back), "day")

    return handler


def _h_last_week(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
    return week_of(a.date() - timedelta(days=7))


def _h_this_week(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
    return week_of(a.date())


def _h_last_weekend(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
    monday = a.date() - timedelta(days=a.date().weekday())
    sat = monday - timedelta(days=2)
    return day(sat), day(sat + timedelta(days=2))


def _month_back(n: int) -> Handler:
    def handler(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
        return month(*add_months(a.year, a.month, -n))

    return handler


def _year_back(n: int) -> Handler:
    def handler(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
        return year(a.year - n)

    return handler


def _weekday(table: dict[str, int], week: int | None) -> Handler:
    """A weekday: of the previous week (week=-1), of this week (0), or the most recent one
    at or before the anchor's day (None)."""

    def handler(m: re.Match[str], _t: str, a: datetime) -> Span | None:
        target = table[m["wd"]]
        today = a.date()
        if week is None:
            d = today - timedelta(days=(today.weekday() - target) % 7)
        else:
            d = today - timedelta(days=today.weekday()) + timedelta(days=7 * week + target)
        return unit_window(d, "day")

    return handler


def _h_ago(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    n = _num(m["n"])
    if n is None:
        return None
    unit = m["unit"]
    today = a.date()
    if unit in {"天", "日", "일"}:
        return unit_window(today - timedelta(days=n), "day")
    if unit in {"周", "週間", "週", "星期", "个星期", "個星期", "주"}:
        return week_of(today - timedelta(weeks=n))
    if unit in {"年", "년"}:
        return year(a.year - n)
    return month(*add_months(a.year, a.month, -n))


def _h_date(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    mon, d = int(m["m"]), int(m["d"])
    if m["y"]:
        found = safe_date(int(m["y"]), mon, d)
        return unit_window(found, "day") if found else None
    found = safe_date(a.year, mon, d)
    if found is not None and found > a.date():
        found = safe_date(a.year - 1, mon, d)
    return unit_window(found, "day") if found else None


def _h_month(m: re.Match[str], _t: str, a: datetime) -> Span | None:
    mon = int(m["m"])
    if not 1 <= mon <= 12:
        return None
    if m["y"]:
        return month(int(m["y"]), mon)
    y = a.year if mon <= a.month else a.year - 1
    return month(y, mon)


def _h_recent(_m: re.Match[str], _t: str, a: datetime) -> Span | None:
    end = a.date() + timedelta(days=1)
    return day(end - timedelta(days=RECENT_DAYS + 1)), day(end)


_ZH_WEEK = r"(?:周|星期|礼拜|禮拜)"
_ZH_WD_CHARS = "一二三四五六日天"
_JA_WD_CHARS = "月火水木金土日"
_KO_WD_CHARS = "월화수목금토일"

CJK_RULES: list[tuple[re.Pattern[str], Handler]] = [
    # days
    (re.compile(r"今天|今日|今朝|今晚|今夜|今晩|오늘"), _named_day(0)),
    (re.compile(r"昨天|昨日|昨晚|昨夜|昨晩|어제"), _named_day(1)),
    (re.compile(r"前天|一昨日|おととい|그저께|그제"), _named_day(2)),
    # weeks and weekends
    (re.compile(rf"上个?{_ZH_WEEK}末|先週末|지난\s?주말"), _h_last_weekend),
    (
        re.compile(
            rf"上个?{_ZH_WEEK}(?![{_ZH_WD_CHARS}末])|先週(?![の末]?[{_JA_WD_CHARS}])|지난\s?주(?!말)"
        ),
        _h_last_week,
    ),
    (
        re.compile(
            rf"(?:这|這|本)个?{_ZH_WEEK}(?![{_ZH_WD_CHARS}])|今週(?![の]?[{_JA_WD_CHARS}])|이번\s?주"
        ),
        _h_this_week,
    ),
    (re.compile(rf"上个?{_ZH_WEEK}(?P<wd>[{_ZH_WD_CHARS}])"), _weekday(_ZH_WD, -1)),
    (re.compile(rf"(?:这|這|本)个?{_ZH_WEEK}(?P<wd>[{_ZH_WD_CHARS}])"), _weekday(_ZH_WD, 0)),
    (
        re.compile(rf"(?<![上这這本下个])(?:周|星期|礼拜|禮拜)(?P<wd>[{_ZH_WD_CHARS}])"),
        _weekday(_ZH_WD, None),
    ),
    (re.compile(rf"先週の?(?P<wd>[{_JA_WD_CHARS}])曜"), _weekday(_JA_WD, -1)),
    (re.compile(rf"今週の?(?P<wd>[{_JA_WD_CHARS}])曜"), _weekday(_JA_WD, 0)),
    (re.compile(rf"(?<![週の])(?P<wd>[{_JA_WD_CHARS}])曜日"), _weekday(_JA_WD, None)),
    (re.compile(rf"지난\s?주\s?(?P<wd>[{_KO_WD_CHARS}])요일"), _weekday(_KO_WD, -1)),
    (re.compile(rf"이번\s?주\s?(?P<wd>[{_KO_WD_CHARS}])요일"), _weekday(_KO_WD, 0)),
    (re.compile(rf"(?<![주\s])(?P<wd>[{_KO_WD_CHARS}])요일"), _weekday(_KO_WD, None)),
    # months and years
    (re.compile(r"上个?月|先月|지난\s?달"), _month_back(1)),
    (re.compile(r"(?:这|這|本)个?月|今月|이번\s?달"), _month_back(0)),
    (re.compile(r"去年|昨年|작년|지난해"), _year_back(1)),
    (re.compile(r"前年|一昨年|재작년"), _year_back(2)),
    (re.compile(r"今年|올해|금년"), _year_back(0)),
    # N units ago
    (
        re.compile(
            rf"{_NUM}\s?(?:个|個|か|ヶ|カ|ケ)?\s?"
            r"(?P<unit>天|日|週間|週|周|个星期|個星期|星期|月|年|일|주|달|개월|년)\s?(?:前|以前|전)"
        ),
        _h_ago,
    ),
    # calendar dates: 2025年3月14日, 3月14日, 3月14号, 3월 14일; months: 2025年3月, 3月
    (
        re.compile(
            r"(?:(?P<y>\d{4})\s?[年년]\s?)?(?P<m>\d{1,2})\s?[月월]\s?(?P<d>\d{1,2})\s?[日号號일]"
        ),
        _h_date,
    ),
    (
        re.compile(
            r"(?:(?P<y>\d{4})\s?[年년]\s?)?(?<![\d])(?P<m>\d{1,2})\s?[月월](?![\s\d]*[日号號일])(?!份?前)"
        ),
        _h_month,
    ),
    # recently
    (re.compile(r"最近|近来|近來|近頃|このごろ|최근|요즘"), _h_recent),
]
"""(pattern, handler) pairs tried beside the English rules; the longest match wins."""

CJK_ASKS_WHEN = re.compile(
    r"什么时候|什麼時候|几点|幾點|哪天|哪一天|几号|幾號|何时|何時|哪年|几月"
    r"|いつ|何日|何時|何曜日|何年|何月|언제|며칠|몇\s?시|무슨\s?요일"
)
"""A question whose answer is a time (as "when", "what date" in English)."""
