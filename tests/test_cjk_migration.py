"""Stores made before CJK segmentation are re-indexed by their migration (SQLite 12,
PostgreSQL 16), which reports its progress, and then find CJK words inside messages and
records. Before it, a CJK word inside a run was found by neither backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import speakermem.memory.store.pg.schema as pg_schema
import speakermem.memory.store.sqlite.database as sqlite_database
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.search.fts_query import build_match
from speakermem.memory.store.sqlite.dialect import SQLITE
from tests.conftest import msg
from tests.store_contract.conftest import record

SCOPE = Scope(platform="test", workspace="w1", channel="general")
TEXTS = [
    ("李伟", "我们下周发布新版本"),
    ("佐藤", "リリースは来週の金曜日です"),
    ("민준", "릴리스는 다음 주 금요일이에요"),
    ("Dana", "the release notes are ready"),
    ("Eli", "lunch at noon"),
]
OLD_INDEX_SQL = (
    "INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)"
    " SELECT id, text, speaker_name, 'c' || channel_pk FROM messages WHERE id > ? ORDER BY id"
)
"""How releases before SQLite migration 12 indexed an ingested batch (raw text)."""


async def open_engine(path: Path, url: str | None, progress: Any = None) -> MemoryEngine:
    config = MemoryConfig(store=StoreConfig(db_path=path, db_url=url))
    return await MemoryEngine.open(config, None, progress=progress)


async def hits(engine: MemoryEngine, words: str) -> list[str]:
    pk = await engine.store.channels.lookup(SCOPE)
    assert pk is not None
    found = await engine.store.messages.lexical(build_match(words), [pk], 20)
    got = await engine.store.messages.get_many([p for p, _ in found])
    return [got[p].message_id for p, _ in found]


async def fill_old(engine: MemoryEngine) -> None:
    await engine.ingest_many([msg(SCOPE, f"m{i}", sp, t, i) for i, (sp, t) in enumerate(TEXTS)])
    await engine.store.records.add_records(
        SCOPE, [record("李伟计划下周发布新版本", owner="李伟", from_ids=("m0",))], None
    )
    assert await hits(engine, "发布") == []  # the bug: a CJK run was one token
    assert await hits(engine, "release") == ["m3"]


async def check_new(engine: MemoryEngine, seen: list[tuple[str, int, int]]) -> None:
    assert await hits(engine, "发布") == ["m0"]
    assert await hits(engine, "リリース") == ["m1"]
    assert await hits(engine, "릴리스") == ["m2"]
    assert await hits(engine, "release") == ["m3"]
    pk = await engine.store.channels.lookup(SCOPE)
    assert pk is not None
    assert len(await engine.store.records.lexical(build_match("新版本"), [pk], 5)) == 1
    assert {what for what, _, _ in seen} == {"messages", "records"}
    assert all(done <= total for _, done, total in seen)
    assert any(what == "records" and done == total == 1 for what, done, total in seen)


async def test_sqlite_migration_12_reindexes_cjk_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = sqlite_database.migrations
    monkeypatch.setattr(
        sqlite_database, "migrations", lambda n: [m for m in every(n) if m.version < 12]
    )
    monkeypatch.setattr(SQLITE, "index_new_messages", OLD_INDEX_SQL)
    old = await open_engine(tmp_path / "s.db", None)
    try:
        await fill_old(old)
    finally:
        await old.close()
    monkeypatch.undo()
    seen: list[tuple[str, int, int]] = []
    new = await open_engine(tmp_path / "s.db", None, lambda *a: seen.append(a))
    try:
        await check_new(new, seen)
        # only the messages holding CJK are indexed again (three), and the index agrees
        # with its content view token for token
        assert ("messages", 3, 3) in seen
        async with new.store.db.transaction() as tx:
            for table in ("messages_fts", "records_fts"):
                await tx.execute(
                    f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)"
                )
    finally:
        await new.close()


@pytest.mark.slow
async def test_postgres_migration_16_reindexes_cjk_messages(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = pg_schema.migrations
    monkeypatch.setattr(pg_schema, "migrations", lambda c: [m for m in every(c) if m.version < 16])
    old = await open_engine(tmp_path / "x.db", pg_url)
    try:
        await fill_old(old)
    finally:
        await old.close()
    monkeypatch.undo()
    seen: list[tuple[str, int, int]] = []
    new = await open_engine(tmp_path / "x.db", pg_url, lambda *a: seen.append(a))
    try:
        await check_new(new, seen)
    finally:
        await new.close()
