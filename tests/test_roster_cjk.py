"""Roster names in Chinese, Japanese and Korean questions: found inside CJK runs, and by
their romanised forms ("李伟" ~ "Li Wei"), with small and large rosters alike."""

from __future__ import annotations

import pytest

from speakermem.memory.models import RosterMember
from speakermem.memory.query.projection import fallback_projection
from speakermem.memory.search.cjk import romanised

BASE = [
    RosterMember(user_id="li", display_name="李伟"),
    RosterMember(user_id="wang", display_name="王芳"),
    RosterMember(user_id="sato", display_name="佐藤 健"),
    RosterMember(user_id="minjun", display_name="민준"),
    RosterMember(user_id="dana", display_name="Dana"),
]
LARGE = BASE + [RosterMember(user_id=f"u{i}", display_name=f"Member {i:03d}") for i in range(120)]


@pytest.mark.parametrize("roster", [BASE, LARGE], ids=["small", "large"])
@pytest.mark.parametrize(
    ("question", "speaker"),
    [
        ("李伟什么时候发布新版本？", "li"),
        ("你问王芳了吗", "wang"),
        ("佐藤さんはリリースについて何と言った？", "sato"),
        ("민준이가 뭐라고 했어?", "minjun"),
        ("Dana说的餐厅在哪里", "dana"),
        ("What did Li Wei say about the release?", "li"),
        ("did liwei reply", "li"),
        ("what did Wang Fang decide", "wang"),
        ("Min-jun said what", "minjun"),
    ],
)
def test_cjk_and_romanised_names_name_the_member(
    roster: list[RosterMember], question: str, speaker: str
) -> None:
    assert fallback_projection(question, roster).speakers == [speaker]


def test_a_latin_name_inside_a_longer_latin_word_is_still_no_name() -> None:
    assert fallback_projection("Danae said it", BASE).speakers == []


def test_romanised_forms() -> None:
    assert romanised("李伟") == "Li Wei"
    assert romanised("민준") == "Min Jun"
    assert romanised("さくら") == "sakura"
    assert romanised("Dana") is None
