"""PostgreSQL's copy of the CJK segmentation against the Python one, and BM25 over CJK
text against SQLite's FTS5 on the same messages (one behaviour on both backends)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.search.cjk import index_text
from speakermem.memory.search.fts_query import build_match
from tests.conftest import msg

pytestmark = pytest.mark.slow

SCOPE = Scope(platform="test", workspace="w1", channel="general")
CORPUS = [
    ("李伟", "我们下周发布新版本，大家准备好"),
    ("王芳", "发布计划已经更新了。发布日期是周五"),
    ("王芳", "今天中午吃饺子"),
    ("佐藤", "リリースは来週の金曜日です"),
    ("田中", "昨日の会議で決めました、リリースノートも書きます"),
    ("민준", "릴리스는 다음 주 금요일이에요"),
    ("서연", "점심 먹었어요? 릴리스 노트 봤어요"),
    ("Dana", "release 发布 plan for Q3"),
    ("Dana", "the release notes are ready"),
    ("Li Wei", "人々は𠀋字を書く・ｶﾀｶﾅも"),
]
QUESTIONS = [
    "发布",
    "什么时候发布新版本？",
    "リリースはいつ？",
    "릴리스는 언제야?",
    "release plan",
    "李伟",
]

PIECES = [
    "发布",
    "计划",
    "李",
    "リリース",
    "は",
    "いつ",
    "릴리스",
    "는",
    "人々",
    "𠀋",
    "ｶﾀｶﾅ",
    "。",
    "、",
    "？",
    "！",
    "・",
    "「",
    "」",
    " ",
    "  ",
    "release",
    "Q3",
    "3.5",
    "-",
    "_",
    "e-mail",
    "ok",
    "\n",
    "ー",
    "〆",
    "０１",
]


async def open_engine(tmp_path: Path, url: str | None) -> MemoryEngine:
    return await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=tmp_path / "s.db", db_url=url)), None
    )


@pytest.fixture
async def pair(tmp_path: Path, pg_url: str) -> AsyncIterator[tuple[MemoryEngine, MemoryEngine]]:
    lite = await open_engine(tmp_path, None)
    pg = await open_engine(tmp_path, pg_url)
    try:
        events = [msg(SCOPE, f"m{i}", sp, t, i) for i, (sp, t) in enumerate(CORPUS)]
        for eng in (lite, pg):
            await eng.ingest_many(events)
        yield lite, pg
    finally:
        await lite.close()
        await pg.close()


async def test_the_sql_segmentation_gives_the_python_tokens(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    rng = random.Random(42)
    texts = [t for _, t in CORPUS] + ["", "plain English only"]
    texts += ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    rows = await pair[1].store.db.read(
        "SELECT u.t, speakermem_segment(u.t) FROM unnest(?::text[]) AS u(t)", (texts,)
    )
    for text, segmented in rows:
        assert segmented.split() == index_text(text).split(), text


@pytest.mark.parametrize("question", QUESTIONS)
async def test_cjk_bm25_scores_agree_with_fts5(
    pair: tuple[MemoryEngine, MemoryEngine], question: str
) -> None:
    match = build_match(question)
    results = []
    for eng in pair:
        pk = await eng.store.channels.lookup(SCOPE)
        assert pk is not None
        hits = await eng.store.messages.lexical(match, [pk], 100)
        got = await eng.store.messages.get_many([p for p, _ in hits])
        results.append({got[p].message_id: s for p, s in hits})
    assert results[0] and results[0].keys() == results[1].keys()
    for mid, score in results[0].items():
        assert results[1][mid] == pytest.approx(score, rel=1e-6), mid
