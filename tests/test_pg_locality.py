"""Search by channel on PostgreSQL without reading other channels' rows (migration 8).

`messages.fts` holds a channel tag lexeme (`c:<channel pk>`), so the GIN index intersects a
query's terms with the searched channels; the tag must never match a query word, and a
database made before the migration gets the tags on its existing rows. The sign bits sit
in a covering index per channel. A common word's document frequency may come from
ANALYZE's lexeme frequencies (DF_ESTIMATE_ABOVE), in one column or both (migration 14 keeps
the speaker name's words apart); phrases and rarer words are still counted.

Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import speakermem.memory.store.pg.messages as pgm
import speakermem.memory.store.pg.schema as pg_schema
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.search.fts_query import build_match
from tests.conftest import msg
from tests.fakes import HashEmbedder

A = Scope(platform="test", workspace="w1", channel="general")
B = Scope(platform="test", workspace="w1", channel="random")


async def open_engine(path: Path, url: str, *, check_embedder: bool = True) -> MemoryEngine:
    return await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=path, db_url=url)),
        HashEmbedder(),
        check_embedder=check_embedder,
    )


async def pk_of(engine: MemoryEngine, scope: Scope) -> int:
    pk = await engine.store.channels.lookup(scope)
    assert pk is not None
    return int(pk)


async def lexical_ids(engine: MemoryEngine, words: str, pks: list[int]) -> set[str]:
    hits = await engine.store.messages.lexical(build_match(words), pks, 100)
    got = await engine.store.messages.get_many([pk for pk, _ in hits])
    return {got[pk].message_id for pk, _ in hits}


async def test_channel_tags_filter_the_index_and_never_match_a_word(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # a "large" corpus: the tags filter
    eng = await open_engine(tmp_path / "x.db", pg_url)
    try:
        await eng.ingest_many(
            [
                msg(A, "a1", "Ann", "tomatoes c 1 here", 1),
                msg(A, "a2", "Ann", "basil only", 2),
                msg(B, "b1", "Bo", "tomatoes in the other channel", 3),
                msg(B, "b2", "Bo", "c:2 and c2 and 2", 4),
            ]
        )
        a, b = await pk_of(eng, A), await pk_of(eng, B)
        repo = eng.store.messages
        assert isinstance(repo, pgm.PgMessageRepo)
        assert "speakermem_channels" in await repo._channel_filter([a], (4.0, 5.0))
        db = eng.store.db
        tagged = await db.read(
            "SELECT message_id FROM messages WHERE fts @@ speakermem_channels(ARRAY[channel_pk])"
        )
        assert len(tagged) == 4
        assert await lexical_ids(eng, "tomatoes", [a]) == {"a1"}
        assert await lexical_ids(eng, "tomatoes", [b]) == {"b1"}
        assert await lexical_ids(eng, "tomatoes", [a, b]) == {"a1", "b1"}
        # the tags are c:<pk>; words that spell parts of a tag match only real words
        assert await lexical_ids(eng, f"c {a}", [a]) == {"a1"}
        assert await lexical_ids(eng, f"c:{b}", [b]) == {"b2"}
        assert await lexical_ids(eng, f"c{a}", [a]) == set()
        assert await lexical_ids(eng, "basil", [b]) == set()
        # the tag is not a token of the document length (fts_len counts it once already)
        lens = await db.read("SELECT message_id, fts_len FROM messages ORDER BY message_id")
        assert {r[0]: r[1] for r in lens} == {"a1": 6, "a2": 4, "b1": 7, "b2": 8}
    finally:
        await eng.close()


async def test_a_database_made_before_the_tags_is_converted(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = pg_schema.migrations
    assert [m.version for m in every(StoreConfig())][-1] >= 8

    def before_8(config: StoreConfig) -> list[Any]:
        return [m for m in every(config) if m.version < 8]

    monkeypatch.setattr(pg_schema, "migrations", before_8)
    # that release kept no record of its embedder (a later migration's table)
    old = await open_engine(tmp_path / "x.db", pg_url, check_embedder=False)
    # that release ingested without the admission gate (its tables come in a later migration)
    monkeypatch.setattr(old.store.channels.policy, "refusals", _no_gate)
    words = ["tomatoes", "basil", "report", "garden"]
    try:
        await old.ingest_many(
            [
                msg(A if i % 2 else B, f"m{i}", "Cy", f"{words[i % 4]} note {i}", i)
                for i in range(12)
            ]
        )
        await old.embed_pending()
        assert await old.store.db.schema_version() == 7
        a, b = await pk_of(old, A), await pk_of(old, B)
        # what the old schema's index finds in channel A (this code's search needs the tags)
        before = {
            w: {
                r[0]
                for r in await old.store.db.read(
                    "SELECT message_id FROM messages WHERE channel_pk = ?"
                    " AND fts @@ plainto_tsquery('speakermem', ?)",
                    (a, w),
                )
            }
            for w in words
        }
        qv = await old.embed_query("basil note")
        assert qv is not None
        dense_before = await old.store.messages.dense(qv, [a], 3, 10)
    finally:
        await old.close()
    monkeypatch.setattr(pg_schema, "migrations", every)
    new = await open_engine(tmp_path / "x.db", pg_url)
    try:
        db = new.store.db
        assert await db.schema_version() >= 8
        untagged = await db.read(
            "SELECT count(*) FROM messages WHERE NOT fts @@ speakermem_channels(ARRAY[channel_pk])"
        )
        assert untagged[0][0] == 0
        assert {w: await lexical_ids(new, w, [a]) for w in words} == before
        assert any(before.values())
        # i % 4 == 0 (tomatoes) are even: all in B
        assert await lexical_ids(new, "tomatoes", [b]) == {"m0", "m4", "m8"}
        assert await lexical_ids(new, "tomatoes", [a]) == set()
        dense_after = await new.store.messages.dense(qv, [a], 3, 10)
        assert dense_after == dense_before
        indexes = {
            r[0]
            for r in await db.read(
                "SELECT indexname FROM pg_indexes WHERE tablename = ?", ("messages_bits",)
            )
        }
        assert "messages_bits_channel_cover" in indexes
        assert "messages_bits_channel" not in indexes
    finally:
        await new.close()


async def test_common_word_frequency_comes_from_analyze(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # the large-corpus path reads dfs
    eng = await open_engine(tmp_path / "x.db", pg_url)
    try:
        db = eng.store.db
        async with db.transaction() as tx:
            await tx.execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
        await eng.ingest_many(
            [
                msg(A, f"m{i}", "Cy", ("common " if i % 2 else "") + f"word rare{i % 40}", i)
                for i in range(200)
            ]
        )
        async with db.transaction() as tx:
            await tx.execute("ANALYZE messages")
        # 100 more rows with the common word after ANALYZE: its sampled frequency (1/2 of
        # 200 rows) no longer matches the count (200 of 300)
        await eng.ingest_many(
            [msg(A, f"n{i}", "Cy", f"common later {i}", 1000 + i) for i in range(100)]
        )
        repo = eng.store.messages
        assert isinstance(repo, pgm.PgMessageRepo)
        items = [("common", "AB"), ("common", "A"), ("common word", "AB"), ("rare3", "AB")]
        exact = [200.0, 200.0, 100.0, 5.0]

        async def dfs() -> list[float | None]:
            repo._df.clear()
            repo._stats = None
            return await repo._doc_freqs(items)

        assert await dfs() == exact  # default threshold: every item counted
        monkeypatch.setattr(pgm, "DF_ESTIMATE_ABOVE", 50)
        got = await dfs()
        # single words take ANALYZE's frequency x live rows of their lexemes in the
        # searched columns (the text's alone too: the speaker name's words are lexemes of
        # their own); a phrase and a rare word are counted
        assert got == [150.0, 150.0, *exact[2:]]
    finally:
        await eng.close()


async def test_channels_holding_most_rows_are_filtered_by_channel_pk(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tags filter only channels holding under TAG_SHARE of the rows; a channel with
    most of them is filtered by channel_pk (its tag's posting list is nearly the whole
    index). Both find the same rows."""
    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)
    eng = await open_engine(tmp_path / "x.db", pg_url)
    try:
        await eng.ingest_many(
            [msg(A, f"a{i}", "Ann", f"tomatoes {i}", i) for i in range(18)]
            + [msg(B, f"b{i}", "Bo", f"tomatoes {i}", 100 + i) for i in range(2)]
        )
        await eng.embed_pending()
        repo = eng.store.messages
        assert isinstance(repo, pgm.PgMessageRepo)
        a, b = await pk_of(eng, A), await pk_of(eng, B)
        stats = await repo._cached_stats()
        assert stats is not None and stats[0] == 20
        assert "speakermem_channels" in await repo._channel_filter([b], stats)
        assert "channel_pk" in await repo._channel_filter([a], stats)
        assert "channel_pk" in await repo._channel_filter([a, b], stats)
        assert await lexical_ids(eng, "tomatoes", [b]) == {"b0", "b1"}
        assert await lexical_ids(eng, "tomatoes", [a]) == {f"a{i}" for i in range(18)}
        monkeypatch.setattr(pgm, "TAG_SHARE", 1.0)  # the tags for A too: the same rows
        assert "speakermem_channels" in await repo._channel_filter([a], stats)
        assert await lexical_ids(eng, "tomatoes", [a]) == {f"a{i}" for i in range(18)}
    finally:
        await eng.close()


async def _no_gate(*args: Any, **kwargs: Any) -> dict[int, Any]:
    return {}
