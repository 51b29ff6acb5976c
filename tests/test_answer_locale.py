"""The extractive answer's framing in the asker's language; the quotes stay verbatim."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from speakermem.memory.models import Scope
from speakermem.memory.query.answer import RecallAnswer, extractive_answer
from speakermem.memory.query.answer_locale import ENGLISH, PHRASES, phrases_for
from speakermem.memory.query.compose import EvidencePack, Excerpt

SCOPE = Scope(platform="test", workspace="w", channel="c")
QUOTE = "リリースは来週の金曜日です"


def pack(*texts: str) -> EvidencePack:
    excerpts = [
        Excerpt(
            n=i + 1,
            scope=SCOPE,
            message_id=f"m{i}",
            thread_id=None,
            speaker_id="sato",
            speaker="佐藤",
            time=datetime(2025, 3, 4, tzinfo=UTC),
            text=t,
            track="s1",
        )
        for i, t in enumerate(texts)
    ]
    return EvidencePack(question="リリースはいつ？", tense="current", excerpts=excerpts, rows=[])


@pytest.mark.parametrize(
    ("locale", "key"),
    [
        ("zh-CN", "zh-hans"),
        ("zh_SG", "zh-hans"),
        ("zh-TW", "zh-hant"),
        ("ja", "ja"),
        ("ja-JP", "ja"),
        ("ko", "ko"),
        ("en-US", "en"),
        ("fr", "en"),
        (None, "en"),
    ],
)
def test_platform_locales_pick_their_phrases(locale: str | None, key: str) -> None:
    assert phrases_for(locale) == PHRASES[key]


def test_the_framing_follows_the_locale_and_the_quote_does_not() -> None:
    ja = extractive_answer(pack(QUOTE), locale="ja")
    assert ja.startswith(PHRASES["ja"].lead_in) and f"“{QUOTE}” [1]" in ja
    en = extractive_answer(pack(QUOTE))
    assert en.startswith(ENGLISH.lead_in) and f"“{QUOTE}” [1]" in en
    assert extractive_answer(pack(), locale="ko") == PHRASES["ko"].none_found


def test_the_extractive_notice_is_in_the_askers_language() -> None:
    answer = RecallAnswer(text="x", extractive_reason="llm_failed", locale="zh-CN")
    assert answer.notice() == "摘录式回答：内容引自所列消息（语言模型暂时没有响应）。"
    english = RecallAnswer(text="x", extractive_reason="no_llm")
    assert english.notice() == "Extractive answer: quoted from the cited messages."
    assert RecallAnswer(text="x", used_llm=True, locale="ja").notice() is None
