"""The speaker name's words as lexemes of their own in PostgreSQL's full text (migration 14).

`messages.fts` stores the text's words as plain lexemes and the speaker name's as `s:<word>`,
so the GIN index answers a word searched in one column without reading the rows that hold
it in the other (a weight label is only checked on the heap); a phrase stays in one column,
as FTS5's do; a database made before the migration gets the new lexemes on its rows.

Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import speakermem.memory.store.pg.messages as pgm
import speakermem.memory.store.pg.schema as pg_schema
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.search.fts_query import build_match
from speakermem.memory.store.pg.dialect import translate
from speakermem.memory.store.pg.messages_schema import SPEAKER_PREFIX
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

A = Scope(platform="test", workspace="w1", channel="general")

# Alice writes most rows; two rows by others name her in the text, one ends with "hello"
CORPUS = [
    *[("Alice Ng", f"status update number {i} on the report") for i in range(30)],
    ("Bob", "I asked alice about the report"),
    ("Carol", "Alice said the garden party moved"),
    ("Alice Ng", "well hello"),
    ("Bob", "say hello alice"),
]


async def open_engine(path: Path, url: str | None, *, check_embedder: bool = True) -> MemoryEngine:
    return await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=path, db_url=url)),
        HashEmbedder(),
        check_embedder=check_embedder,
    )


def events() -> list[Any]:
    return [msg(A, f"m{i}", name, text, i) for i, (name, text) in enumerate(CORPUS)]


@pytest.fixture
async def pair(tmp_path: Path, pg_url: str) -> AsyncIterator[tuple[MemoryEngine, MemoryEngine]]:
    lite = await open_engine(tmp_path / "s.db", None)
    pg = await open_engine(tmp_path / "p.db", pg_url)
    try:
        for eng in (lite, pg):
            await eng.ingest_many(events())
        yield lite, pg
    finally:
        await lite.close()
        await pg.close()


async def matched(eng: MemoryEngine, match: str) -> set[str]:
    pk = await eng.store.channels.lookup(A)
    assert pk is not None
    hits = await eng.store.messages.lexical(match, [pk], 100)
    got = await eng.store.messages.get_many([p for p, _ in hits])
    return {got[p].message_id for p, _ in hits}


async def test_columns_and_phrases_match_as_on_sqlite(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    """A word or phrase limited to one column, or searched in both, matches the rows
    SQLite's FTS5 matches; a phrase never runs from the text into the speaker's name."""
    lite, pg = pair
    for match in [
        '{text} : "alice"',
        '{speaker_name} : "alice"',
        '"alice"',
        '{speaker_name} : "alice ng"',
        '{text} : "alice ng"',
        '"hello alice"',  # m32: text ends "hello", spoken by Alice Ng: no phrase
        '{text} : "hello alice"',
        build_match("what did alice say about the report", text_only={"alice"}),
    ]:
        want = await matched(lite, match)
        assert await matched(pg, match) == want, match
    assert await matched(pg, '"hello alice"') == {"m33"}
    # per-session counts match a term in either column, a phrase within one of them
    terms = ['"hello alice"', '"alice"', '"ng"', '"report"']
    counts = []
    for eng in (lite, pg):
        pk = await eng.store.channels.lookup(A)
        assert pk is not None
        got = await eng.store.messages.session_term_counts(terms, [pk])
        counts.append({t: sum(c.values()) for t, c in got.items()})
    assert counts[0] == counts[1] == {'"hello alice"': 1, '"alice"': 34, '"ng"': 31, '"report"': 31}


async def test_a_name_in_the_text_is_answered_by_the_index(
    pair: tuple[MemoryEngine, MemoryEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Searching a roster name in the text only reads the rows that hold it there: the GIN
    index returns no row of the speaker's own messages for the heap to throw away."""
    _, pg = pair
    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # large-corpus path: dfs counted too
    db = pg.store.db
    seen: list[tuple[str, Any]] = []
    for name in ("read", "read_prepared"):
        monkeypatch.setattr(db, name, _spy(getattr(db, name), seen))
    assert await matched(pg, '{text} : "alice"') == {"m30", "m31", "m33"}
    monkeypatch.undo()
    fts_reads = [(sql, p) for sql, p in seen if "fts @@" in sql]
    assert fts_reads  # the document-frequency count and the ranking
    removed = 0
    async with db.reader() as conn:
        await conn.execute("SET enable_seqscan = off")
        try:
            for sql, params in fts_reads:
                cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + translate(sql), params)
                plan = (await cur.fetchone())[0]
                removed += _rechecked_away(plan if isinstance(plan, list) else json.loads(plan))
        finally:
            await conn.execute("RESET enable_seqscan")
    assert removed == 0


def _spy(read: Any, seen: list[tuple[str, Any]]) -> Any:
    async def spy(sql: str, params: Any = ()) -> list[Any]:
        seen.append((sql, params))
        return await read(sql, params)

    return spy


def _rechecked_away(node: Any) -> int:
    """Rows the plan's bitmap heap scans of `messages` read and dropped on recheck."""
    if isinstance(node, list):
        return sum(_rechecked_away(n) for n in node)
    if not isinstance(node, dict):
        return 0
    own = 0
    if node.get("Node Type") == "Bitmap Heap Scan" and node.get("Relation Name") == "messages":
        own = int(node.get("Rows Removed by Index Recheck", 0))
    return own + sum(_rechecked_away(v) for k, v in node.items() if k in ("Plan", "Plans"))


async def test_a_database_made_before_is_converted(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate` on a database of migration 13 rewrites every row's document: the same
    lexemes, the speaker's prefixed, at the same positions as a new row's; the rewritten
    table is vacuumed, so index-only scans read no heap page."""
    every = pg_schema.migrations

    def before_14(config: StoreConfig) -> list[Any]:
        return [m for m in every(config) if m.version < 14]

    monkeypatch.setattr(pg_schema, "migrations", before_14)
    # that release kept no record of its embedder (a later migration's table)
    old = await open_engine(tmp_path / "x.db", pg_url, check_embedder=False)
    try:
        await old.ingest_many(events())
        assert await old.store.db.schema_version() == 13
        stale = await old.store.db.read(
            "SELECT count(*) FROM messages WHERE fts::text LIKE ?", (f"%'{SPEAKER_PREFIX}%",)
        )
        assert stale[0][0] == 0
    finally:
        await old.close()
    monkeypatch.setattr(pg_schema, "migrations", every)
    new = await open_engine(tmp_path / "x.db", pg_url)
    try:
        db = new.store.db
        assert await db.schema_version() >= 14
        pages = await db.read(
            "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'messages'"
        )
        assert pages[0][0] > 0 and pages[0][1] == pages[0][0]
        assert await matched(new, '{speaker_name} : "alice ng"') == {
            f"m{i}" for i in [*range(30), 32]
        }
        assert await matched(new, '{text} : "alice"') == {"m30", "m31", "m33"}
        # a row written now gets the document the migration gave the old rows
        await new.ingest_many([msg(A, "again", "Alice Ng", CORPUS[32][1], 99)])
        rows = await db.read(
            "SELECT message_id, fts::text, fts_len FROM messages WHERE message_id IN (?, ?)",
            ("m32", "again"),
        )
        docs = {r[0]: (r[1], r[2]) for r in rows}
        assert docs["m32"] == docs["again"]
        assert docs["m32"][0] == "'c:1' 'hello':2A 's:alic':3B 's:ng':4B 'well':1A"
    finally:
        await new.close()


async def test_speaker_names_narrow_the_speaker_ranking_as_on_sqlite(
    tmp_path: Path, pg_url: str
) -> None:
    """A ranking of some speakers' messages given their display names keeps the rows
    written under those names, as FTS5's speaker_name filter does on SQLite (the names
    narrow the rows in the index); a name without a word narrows nothing."""
    renamed = [
        MessageEvent(
            scope=A,
            message_id=f"r{i}",
            speaker_id="u7",
            speaker_name="Ann" if i < 3 else "Annie Lee",
            text=f"the report draft {i}",
            ts=T0 + timedelta(minutes=100 + i),
        )
        for i in range(6)
    ]
    got = []
    for url, path in ((None, "s.db"), (pg_url, "p.db")):
        eng = await open_engine(tmp_path / path, url)
        try:
            await eng.ingest_many([*events(), *renamed])
            pk = await eng.store.channels.lookup(A)
            assert pk is not None
            repo = eng.store.messages
            runs = []
            for names in (["Annie Lee"], ["Ann"], ["Annie Lee", "Bob"], ["!!"], []):
                hits = await repo.lexical(
                    '"report"', [pk], 100, speakers=["u7", "bob"], speaker_names=names
                )
                rows = await repo.get_many([p for p, _ in hits])
                runs.append({rows[p].message_id for p, _ in hits})
            got.append(runs)
        finally:
            await eng.close()
    assert got[0] == got[1]
    assert got[1][0] == {"r3", "r4", "r5"}
    assert got[1][2] == {"r3", "r4", "r5", "m30"}
    assert got[1][3] == got[1][4] == {f"r{i}" for i in range(6)} | {"m30"}


async def test_search_statements_are_prepared_once_per_connection(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search's large statements are prepared on the connection that runs them: the
    next search on it executes the prepared plan source instead of parsing the text again."""
    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # the document-frequency count too
    cfg = MemoryConfig(store=StoreConfig(db_path=tmp_path / "p.db", db_url=pg_url, readers=1))
    eng = await MemoryEngine.open(cfg, HashEmbedder())
    try:
        await eng.ingest_many(events())
        for _ in range(2):
            assert await matched(eng, '"report" OR "alice"')
        # one connection for reads (readers=1): it holds the prepared statements
        prepared = await eng.store.db.read("SELECT statement FROM pg_prepared_statements")
        texts = " ".join(r[0] for r in prepared)
        assert "WITH stats AS" in texts  # the ranking
        assert "WITH t1 AS MATERIALIZED" in texts  # the document frequencies
    finally:
        await eng.close()
