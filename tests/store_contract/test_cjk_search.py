"""Chinese, Japanese and Korean words found inside messages and records, on both backends.

The indexes hold CJK runs as character bigrams and unigrams (memory/search/cjk.py); the
query side (`build_match`, `speaker_phrase`) writes the same n-grams, so a word of one, two
or more characters is found inside a run, beside English words in the same message.
"""

from __future__ import annotations

from speakermem.memory.models import EditEvent, Scope
from speakermem.memory.search.fts_query import build_match, quote
from speakermem.memory.store import Store
from speakermem.memory.store.messages import speaker_phrase
from tests.conftest import T0, msg
from tests.store_contract.conftest import pks_of, record

GENERAL = Scope(platform="test", workspace="w1", channel="general")

MESSAGES = [
    ("zh1", "李伟", "我们下周发布新版本，大家准备好"),
    ("zh2", "王芳", "发布计划已经更新了"),
    ("zh3", "王芳", "今天中午吃饺子"),
    ("ja1", "佐藤", "リリースは来週の金曜日です"),
    ("ja2", "田中", "昨日の会議で決めました"),
    ("ko1", "민준", "릴리스는 다음 주 금요일이에요"),
    ("ko2", "서연", "점심 먹었어요?"),
    ("mix", "Dana", "release 发布 plan for Q3"),
    ("en", "Dana", "the release notes are ready"),
]


async def seeded(store: Store) -> list[int]:
    events = [msg(GENERAL, mid, sp, text, i) for i, (mid, sp, text) in enumerate(MESSAGES)]
    await store.messages.ingest(events, channel_default=True)
    return await pks_of(store, GENERAL)


async def found(store: Store, match: str, pks: list[int]) -> list[str]:
    hits = await store.messages.lexical(match, pks, 50)
    got = await store.messages.get_many([pk for pk, _ in hits])
    return [got[pk].message_id for pk, _ in hits]


async def test_cjk_words_are_found_inside_messages(store: Store) -> None:
    pks = await seeded(store)
    assert set(await found(store, build_match("发布"), pks)) == {"zh1", "zh2", "mix"}
    assert await found(store, build_match("饺子"), pks) == ["zh3"]
    assert await found(store, build_match("リリース"), pks) == ["ja1"]
    assert await found(store, build_match("会議"), pks) == ["ja2"]
    assert await found(store, build_match("릴리스"), pks) == ["ko1"]
    assert await found(store, build_match("점심"), pks) == ["ko2"]
    # a word of one character, and a word of three (its bigrams in order, as a phrase)
    assert await found(store, quote("饺"), pks) == ["zh3"]
    assert (await found(store, build_match("新版本"), pks))[0] == "zh1"
    assert await found(store, speaker_phrase("发布计划"), pks) == ["zh2"]
    assert await found(store, speaker_phrase("计划发布"), pks) == []
    # English words around CJK keep working, and English-only messages are as before
    assert await found(store, build_match("plan"), pks) == ["mix"]
    assert set(await found(store, build_match("release"), pks)) == {"mix", "en"}


async def test_a_cjk_question_ranks_the_message_in_its_language_first(store: Store) -> None:
    pks = await seeded(store)
    assert (await found(store, build_match("リリースはいつ？"), pks))[0] == "ja1"
    assert (await found(store, build_match("릴리스는 언제야?"), pks))[0] == "ko1"
    assert set((await found(store, build_match("什么时候发布？"), pks))[:3]) == {
        "zh1",
        "zh2",
        "mix",
    }


async def test_cjk_speaker_names_match_as_phrases(store: Store) -> None:
    pks = await seeded(store)
    hits = await store.messages.lexical(
        build_match("发布"), pks, 10, speakers=["王芳"], speaker_names=["王芳"]
    )
    got = await store.messages.get_many([pk for pk, _ in hits])
    assert [got[pk].message_id for pk, _ in hits] == ["zh2"]
    assert await found(store, "{speaker_name} : " + speaker_phrase("李伟"), pks) == ["zh1"]


async def test_cjk_index_follows_edits(store: Store) -> None:
    pks = await seeded(store)
    edit = EditEvent(scope=GENERAL, message_id="zh3", text="今天晚上吃火锅", edited_at=T0)
    await store.messages.edit(edit, channel_default=True)
    assert await found(store, build_match("饺子"), pks) == []
    assert await found(store, build_match("火锅"), pks) == ["zh3"]


async def test_records_are_searched_by_cjk_words(store: Store) -> None:
    await store.messages.ingest([msg(GENERAL, "m1", "李伟", "周五发布", 0)], channel_default=True)
    texts = ["李伟计划周五发布新版本", "李伟喜欢喝茶", "Dana likes tea"]
    ids = await store.records.add_records(
        GENERAL, [record(t, owner="李伟", event="发布") for t in texts], None
    )
    pks = await pks_of(store, GENERAL)
    assert [r for r, _ in await store.records.lexical(build_match("新版本"), pks, 10)] == [ids[0]]
    assert {r for r, _ in await store.records.lexical(build_match("喝茶"), pks, 10)} == {ids[1]}
    assert await store.records.lexical_by_owner(build_match("喝茶"), pks, ["李伟"], 5) == {
        "李伟": [ids[1]]
    }
