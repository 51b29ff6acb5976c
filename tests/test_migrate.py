"""`speakermem migrate`: a SQLite store copied into PostgreSQL answers the same questions.

A SQLite store is filled through the engine (messages over two channels, an edit, a delete,
vectors, rosters with aliases, a segment whose records form an update chain, a policy, an
opt-out, an audit entry), copied with memory.store.migrate, and the PostgreSQL store is then
compared with the SQLite one through the repositories: searches, records and chains,
rosters, policies, the audit log. A second run writes nothing and leaves every count as it
was. Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import (
    DeleteEvent,
    EditEvent,
    Layer,
    NewRecord,
    RecordScope,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.memory.store import StoreError, WriterRunLog
from speakermem.memory.store.migrate import TABLES, VECTOR_TABLES, keyset_sql, migrate, upsert_sql
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

GENERAL = Scope(platform="slack", workspace="T1", channel="C-general")
RANDOM = Scope(platform="slack", workspace="T1", channel="C-random")

TOPICS = [
    "the staging deploy failed on the database migration",
    "lunch at the ramen place on friday",
    "Alice is training for the marathon in April",
    "the quarterly report is due next Tuesday",
    "Bob adopted a grey kitten named Pixel",
    "rollback plan for the payments service",
]
QUERIES = ["deploy migration", "marathon training", "kitten Pixel", "quarterly report"]


def _record(content: str, **kw: object) -> NewRecord:
    base: dict[str, object] = dict(
        layer=Layer.CORE,
        record_scope=RecordScope.PERSON,
        content=content,
        source="carol",  # g2 is hers: what she says about Alice (issue 39's attribution)
        owner="alice",
        event="sport",
        time=T0,
        session_id=1,
        from_ids=("g2",),
        writer_model="test",
        prompt_version="writer-v1",
    )
    base.update(kw)
    return NewRecord(**base)  # type: ignore[arg-type]


async def fill(engine: MemoryEngine, embedder: HashEmbedder) -> dict[str, int]:
    """A store with something in every kind of table; the ids the checks need."""
    people = [("alice", "Alice"), ("bob", "Bob"), ("carol", "Carol")]
    for scope in (GENERAL, RANDOM):
        for uid, name in people:
            await engine.roster(
                RosterEvent(scope=scope, action=RosterAction.JOIN, user_id=uid, name=name)
            )
    await engine.roster(
        RosterEvent(scope=GENERAL, action=RosterAction.ALIAS, user_id="alice", name="Ali")
    )
    await engine.roster(RosterEvent(scope=RANDOM, action=RosterAction.LEAVE, user_id="carol"))
    events = []
    for i in range(36):
        scope = GENERAL if i % 3 else RANDOM
        who = people[i % 3][1]
        events.append(msg(scope, f"{'g' if scope is GENERAL else 'r'}{i}", who, TOPICS[i % 6], i))
    await engine.ingest_many(events)
    await engine.edit(
        EditEvent(
            scope=GENERAL,
            message_id="g1",
            text="the staging deploy is green again after the hotfix",
            edited_at=T0.replace(hour=12),
        )
    )
    await engine.delete(DeleteEvent(scope=GENERAL, message_id="g4"))
    await engine.embed_pending()
    await engine.infer_interactions()

    store = engine.store
    await store.segments.close_channel(GENERAL)
    (segment,) = await store.segments.due(limit=1)
    run = WriterRunLog(model="test", prompt_version="writer-v1", started_at=0, proposed=1)
    first = _record("Alice trains for the April marathon")
    (rid,) = await store.records.commit_segment(
        segment.id, GENERAL, [first], embedder.embed_sync([first.content]), run
    )
    update = _record("Alice ran the April marathon", supersedes=rid, from_ids=("g2", "g5"))
    (rid2,) = await store.records.add_records(
        GENERAL, [update], embedder.embed_sync([update.content])
    )
    await store.governance.set_channel_retention(RANDOM, 30, "admin")
    await store.governance.set_opted_out("slack", "T1", "carol", True)
    await store.governance.log(
        platform="slack", workspace="T1", actor="admin", action="retention", target="C-random"
    )
    return {"rid": rid, "rid2": rid2}


@pytest.fixture
async def sqlite_store(tmp_path: Path, embedder: HashEmbedder) -> Path:
    path = tmp_path / "source.db"
    eng = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=path)), embedder)
    try:
        await fill(eng, embedder)
    finally:
        await eng.close()
    return path


async def open_both(
    path: Path, url: str, embedder: HashEmbedder
) -> tuple[MemoryEngine, MemoryEngine]:
    lite = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=path)), embedder)
    pg = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_url=url, db_path=path.with_name("unused.db"))),
        embedder,
    )
    return lite, pg


def hits(results: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(h.message.message_id, h.message.text) for h in results]


async def test_migrated_store_answers_like_the_source(
    sqlite_store: Path, pg_url: str, embedder: HashEmbedder
) -> None:
    report = await migrate(sqlite_store, pg_url, batch=7)  # small batches: several per table
    assert report.ok, report.mismatches()
    counts = {t.table: t.source for t in report.tables}
    assert set(counts) == {*TABLES, *VECTOR_TABLES}
    for table in ("messages", "message_vectors", "messages_vec", "records", "records_vec"):
        assert counts[table] > 0, table
    assert counts["records_vec"] == 2 and counts["audit_log"] == 1
    assert counts["message_addressees"] + counts["message_links"] > 0
    assert report.written >= sum(counts.values())

    lite, pg = await open_both(sqlite_store, pg_url, embedder)
    try:
        assert pg.store.driver_name == "postgres"
        for query in QUERIES:
            for mode in ("hybrid", "lexical", "dense"):
                want = hits(await lite.search(query, [GENERAL, RANDOM], limit=5, mode=mode))
                got = hits(await pg.search(query, [GENERAL, RANDOM], limit=5, mode=mode))
                assert got == want, (query, mode)
                assert want, (query, mode)
        # the edit and the delete came across as they are in the source
        edited = await pg.store.messages.get(GENERAL, "g1")
        assert edited is not None and "hotfix" in edited.text
        assert edited == await lite.store.messages.get(GENERAL, "g1")
        assert await pg.store.messages.get(GENERAL, "g4") == await lite.store.messages.get(
            GENERAL, "g4"
        )
        # records: the chain, the heads, both rankings
        rows = await lite.store.db.read("SELECT max(id) FROM records")
        rid2 = int(rows[0][0])
        chain = await pg.store.records.chain(rid2)
        assert chain == await lite.store.records.chain(rid2)
        assert [r.superseded_by for r in chain] == [rid2, None]
        pks = await pg.channel_pks([GENERAL])
        assert pks == await lite.channel_pks([GENERAL])
        assert await pg.store.records.heads(pks, owners=["alice"]) == (
            await lite.store.records.heads(pks, owners=["alice"])
        )
        for phrase in ('"marathon"', '"ran"'):
            want_ids = [r for r, _ in await lite.store.records.lexical(phrase, pks, 5)]
            assert [r for r, _ in await pg.store.records.lexical(phrase, pks, 5)] == want_ids
            assert want_ids, phrase
        vec = embedder.embed_sync(["Alice trains for the April marathon"])[0]
        assert [r for r, _ in await pg.store.records.dense(vec, pks, 2)] == [
            r for r, _ in await lite.store.records.dense(vec, pks, 2)
        ]
        # rosters (aliases, a member who left), policies, opt-outs, the audit log
        for scope in (GENERAL, RANDOM):
            assert await pg.members(scope, include_left=True) == await lite.members(
                scope, include_left=True
            )
            assert await pg.store.governance.channel_policy(
                scope
            ) == await lite.store.governance.channel_policy(scope)
        assert await pg.store.governance.is_opted_out("slack", "T1", "carol")
        assert await pg.store.governance.audit(10) == await lite.store.governance.audit(10)
        # new rows get fresh ids after the copied ones (identity sequences were moved)
        await pg.ingest(msg(GENERAL, "g-new", "Bob", "a message written after the move", 99))
        new = await pg.store.messages.get(GENERAL, "g-new")
        top = await lite.store.db.read("SELECT max(id) FROM messages")
        assert new is not None and new.pk > int(top[0][0])
    finally:
        await lite.close()
        await pg.close()


async def test_rerun_writes_nothing_and_catches_up_changes(
    sqlite_store: Path, pg_url: str, embedder: HashEmbedder
) -> None:
    first = await migrate(sqlite_store, pg_url)
    again = await migrate(sqlite_store, pg_url)
    assert again.ok and again.written == 0
    assert [(t.table, t.target) for t in again.tables] == [
        (t.table, t.target) for t in first.tables
    ]
    # a change in the source after the first run is carried over by the next one
    lite = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=sqlite_store)), embedder)
    try:
        await lite.edit(
            EditEvent(
                scope=RANDOM, message_id="r0", text="the deploy moved to Monday", edited_at=T0
            )
        )
        # (Bob: Carol opted out in `fill`, and the gate now keeps her messages out everywhere)
        await lite.ingest(msg(RANDOM, "r-late", "Bob", "one more after the first copy", 200))
    finally:
        await lite.close()
    third = await migrate(sqlite_store, pg_url)
    assert third.ok
    written = {t.table: t.written for t in third.tables}
    assert written["messages"] == 2  # the edited row and the new one, nothing else
    assert written["messages_vec"] == written["message_vectors"] == 1  # the edit's old vector
    lite, pg = await open_both(sqlite_store, pg_url, embedder)
    try:
        assert await pg.store.messages.get(RANDOM, "r0") == await lite.store.messages.get(
            RANDOM, "r0"
        )
        got = hits(await pg.search("deploy Monday", [RANDOM], limit=3, mode="lexical"))
        assert got[0] == ("r0", "the deploy moved to Monday")
    finally:
        await lite.close()
        await pg.close()


async def test_prune_carries_a_forget_over(
    sqlite_store: Path, pg_url: str, embedder: HashEmbedder
) -> None:
    await migrate(sqlite_store, pg_url)
    lite = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=sqlite_store)), embedder)
    try:
        await Governance(lite).forget_user("slack", "T1", "alice", actor="admin")
    finally:
        await lite.close()
    stale = await migrate(sqlite_store, pg_url)  # without prune her rows stay: counts differ
    assert not stale.ok
    assert {t.table for t in stale.mismatches()} >= {"message_vectors", "records", "records_vec"}
    pruned = await migrate(sqlite_store, pg_url, prune=True, batch=5)
    assert pruned.ok, pruned.mismatches()
    deleted = {t.table: t.deleted for t in pruned.tables}
    assert deleted["records"] == 2 and deleted["records_vec"] == 2  # the whole chain
    assert deleted["message_vectors"] > 0 and deleted["user_aliases"] == 1
    again = await migrate(sqlite_store, pg_url, prune=True)
    assert again.ok and again.written == 0 and sum(t.deleted for t in again.tables) == 0
    lite, pg = await open_both(sqlite_store, pg_url, embedder)
    try:
        for query in QUERIES:
            want = hits(await lite.search(query, [GENERAL, RANDOM], limit=5))
            assert hits(await pg.search(query, [GENERAL, RANDOM], limit=5)) == want
        # one of hers: as the forget left it in SQLite (its text gone)
        gone = await lite.store.messages.get(RANDOM, "r3")
        assert await pg.store.messages.get(RANDOM, "r3") == gone
        assert gone is None or "quarterly" not in gone.text
        for scope in (GENERAL, RANDOM):
            assert await pg.members(scope, include_left=True) == await lite.members(
                scope, include_left=True
            )
        pks = await pg.channel_pks([GENERAL])
        assert await pg.store.records.heads(pks, owners=["alice"]) == []
        assert await pg.store.governance.audit(10) == await lite.store.governance.audit(10)
    finally:
        await lite.close()
        await pg.close()


async def test_missing_source_and_bad_target_are_refused(tmp_path: Path, pg_url: str) -> None:
    with pytest.raises(StoreError, match="no SQLite database"):
        await migrate(tmp_path / "absent.db", pg_url)
    assert not (tmp_path / "absent.db").exists()
    (tmp_path / "x.db").touch()
    with pytest.raises(StoreError, match="postgresql://"):
        await migrate(tmp_path / "x.db", "mysql://somewhere/db")


async def test_a_target_with_other_data_is_refused_with_a_message(
    sqlite_store: Path, pg_url: str, embedder: HashEmbedder
) -> None:
    # the PostgreSQL store already holds the same channel under another id
    pg = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_url=pg_url, db_path=sqlite_store.with_name("u.db"))),
        embedder,
    )
    try:
        await pg.ingest(msg(Scope(platform="x", workspace="y", channel="z"), "m", "A", "hi", 0))
        await pg.ingest(msg(RANDOM, "r0", "Alice", "written here first", 0))
    finally:
        await pg.close()
    with pytest.raises(StoreError, match="channels: PostgreSQL's channel 1 \\(x/y/z\\)"):
        await migrate(sqlite_store, pg_url)
    # nothing was overwritten
    pg = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_url=pg_url, db_path=sqlite_store.with_name("u.db"))),
        embedder,
    )
    try:
        mine = await pg.store.messages.get(RANDOM, "r0")
        assert mine is not None and mine.text == "written here first"
        assert await pg.store.messages.get(GENERAL, "g1") is None
    finally:
        await pg.close()


def test_sql_builders() -> None:
    sql = upsert_sql("t", ["id", "a", "b"], ["id"], 2, casts={"b": "vector"}, keep=["a"])
    assert sql.startswith("INSERT INTO t (id, a, b) VALUES (?, ?, ?::vector), (?, ?, ?::vector)")
    assert "ON CONFLICT (id) DO UPDATE SET b = excluded.b WHERE ROW(t.b)" in sql
    assert "a = excluded.a" not in sql
    assert upsert_sql("k", ["x", "y"], ["x", "y"], 1).endswith("ON CONFLICT (x, y) DO NOTHING")
    assert keyset_sql("k", ["x", "y", "z"], ["x", "y"], after=True) == (
        "SELECT x, y, z FROM k WHERE (x, y) > (?, ?) ORDER BY x, y LIMIT ?"
    )
    assert "WHERE" not in keyset_sql("k", ["x"], ["x"], after=False)


def await_run(path: Path, sql: str) -> int:
    """Run one statement on the SQLite file through the store (rows changed)."""
    import asyncio

    async def run() -> int:
        eng = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=path)))
        try:
            async with eng.store.db.transaction() as tx:
                cur = await tx.execute(sql)
                return int(cur.rowcount)
        finally:
            await eng.close()

    return asyncio.run(run())


def test_cli_migrate(sqlite_store: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from speakermem.integrations.cli.main import main

    argv = ["migrate", "--from", f"sqlite:{sqlite_store}", "--to", pg_url]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "messages" in out and "records_vec" in out and "all counts match" in out
    assert main([*argv, "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["written"] == 0
    by_table = {t["table"]: t for t in data["tables"]}
    assert by_table["messages"]["source"] == by_table["messages"]["target"] == 36
    # rows gone from the SQLite file: a mismatch (exit 1) until --prune deletes them too
    lite = await_run(sqlite_store, "DELETE FROM audit_log")
    assert lite == 1
    assert main(argv) == 1
    assert "--prune" in capsys.readouterr().err
    assert main([*argv, "--prune", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {t["table"]: t["deleted"] for t in data["tables"]}["audit_log"] == 1
    assert (
        main(["migrate", "--from", f"sqlite:{sqlite_store.with_name('nope.db')}", "--to", pg_url])
        == 2
    )
