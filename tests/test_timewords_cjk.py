"""Chinese, Japanese and Korean time words resolve to the same windows as their English
counterparts (memory/query/timewords_cjk.py); words about the future give none."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from speakermem.memory.query.timewords import asks_when, resolve_time

ANCHOR = datetime(2025, 3, 19, 15, 0, tzinfo=UTC)  # a Wednesday


@pytest.mark.parametrize(
    ("question", "phrase", "start", "end"),
    [
        ("李伟昨天说了什么", "昨天", date(2025, 3, 18), date(2025, 3, 19)),
        ("前天的会议", "前天", date(2025, 3, 17), date(2025, 3, 18)),
        ("上周五的会议定了什么？", "上周五", date(2025, 3, 14), date(2025, 3, 15)),
        ("上个星期大家在忙什么", "上个星期", date(2025, 3, 10), date(2025, 3, 17)),
        ("王芳上个月去哪了", "上个月", date(2025, 2, 1), date(2025, 3, 1)),
        ("三天前谁来过", "三天前", date(2025, 3, 16), date(2025, 3, 17)),
        ("十二天前", "十二天前", date(2025, 3, 7), date(2025, 3, 8)),
        ("去年的发布", "去年", date(2024, 1, 1), date(2025, 1, 1)),
        ("3月14日发布了吗", "3月14日", date(2025, 3, 14), date(2025, 3, 15)),
        ("12月3号的聚餐", "12月3号", date(2024, 12, 3), date(2024, 12, 4)),
        ("先月のリリース", "先月", date(2025, 2, 1), date(2025, 3, 1)),
        ("先週の金曜日に何があった", "先週の金曜", date(2025, 3, 14), date(2025, 3, 15)),
        ("昨日の会議", "昨日", date(2025, 3, 18), date(2025, 3, 19)),
        ("2週間前に決めたこと", "2週間前", date(2025, 3, 3), date(2025, 3, 10)),
        ("3か月前", "3か月前", date(2024, 12, 1), date(2025, 1, 1)),
        ("2025年3月のリリース", "2025年3月", date(2025, 3, 1), date(2025, 4, 1)),
        ("지난주 금요일에 뭐 했어?", "지난주 금요일", date(2025, 3, 14), date(2025, 3, 15)),
        ("어제 뭐 먹었어", "어제", date(2025, 3, 18), date(2025, 3, 19)),
        ("지난달 공연", "지난달", date(2025, 2, 1), date(2025, 3, 1)),
    ],
)
def test_cjk_time_words_resolve_to_calendar_windows(
    question: str, phrase: str, start: date, end: date
) -> None:
    window = resolve_time(question, ANCHOR)
    assert window is not None
    assert (window.phrase, window.start.date(), window.end.date()) == (phrase, start, end)
    assert phrase not in window.without_phrase(question)


@pytest.mark.parametrize(
    "question", ["来週の会議は？", "下周五发布", "明天见", "다음 주 금요일", "发布计划"]
)
def test_future_words_and_plain_questions_give_no_window(question: str) -> None:
    assert resolve_time(question, ANCHOR) is None


def test_cjk_questions_that_ask_for_a_time() -> None:
    for question in ("リリースはいつ？", "什么时候发布？", "공연은 언제야?", "几号开会"):
        assert asks_when(question)
    assert not asks_when("谁负责测试？")
