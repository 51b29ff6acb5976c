"""Round-trips through the real SQLite store: every table, the indexes, idempotency."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from memory.engine import MemoryEngine
from memory.models import (
    DeleteEvent,
    EditEvent,
    Layer,
    NewRecord,
    RecordScope,
    RecordState,
    RosterAction,
    RosterEvent,
    Scope,
)
from memory.store import ChainConflict, ChangeStatus, IngestStatus, WriterRunLog
from memory.store.schema import migrations
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract


async def count(engine: MemoryEngine, sql: str, params: tuple = ()) -> int:
    rows = await engine.store.db.read(sql, params)
    return int(rows[0][0])


@pytest.mark.sqlite_only(
    "SQLite's migration list and WAL journal mode (PostgreSQL's: tests/test_pg_database.py)"
)
async def test_migrations_are_recorded_and_idempotent(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    eng = await MemoryEngine.open(cfg)
    versions = [m.version for m in migrations(cfg.store.vec_chunk_size)]
    assert await eng.store.db.schema_version() == max(versions)
    await eng.close()
    eng = await MemoryEngine.open(cfg)  # reopening applies nothing twice
    rows = await eng.store.db.read("SELECT version, name FROM schema_migrations")
    assert sorted(r[0] for r in rows) == sorted(versions)
    journal = await eng.store.db.read("PRAGMA journal_mode")
    assert journal[0][0] == "wal"
    await eng.close()


async def test_message_round_trip_with_all_fields(engine: MemoryEngine, scope: Scope) -> None:
    event = msg(
        scope,
        "m1",
        "Alice",
        "Lunch at noon? <@bob>",
        0,
        thread_id="t9",
        reply_to="m0",
        addressees=("bob",),
    )
    (outcome,) = await engine.ingest_many([event])
    assert outcome.status is IngestStatus.STORED
    stored = await engine.store.messages.get(scope, "m1")
    assert stored is not None
    assert stored.scope == scope
    assert (stored.speaker_id, stored.speaker_name) == ("alice", "Alice")
    assert stored.text == "Lunch at noon? <@bob>"
    assert stored.ts == T0
    assert (stored.thread_id, stored.reply_to, stored.addressees) == ("t9", "m0", ("bob",))
    assert (stored.session_id, stored.turn_index) == (1, 0)
    row = await engine.store.db.read(
        "SELECT platform, workspace, channel FROM messages WHERE message_id = 'm1'"
    )
    assert tuple(row[0]) == scope.key()


async def test_replayed_ids_never_duplicate(engine: MemoryEngine, scope: Scope) -> None:
    events = [msg(scope, f"m{i}", "Alice", f"text {i}", i) for i in range(30)]
    first = await engine.ingest_many(events)
    again = await engine.ingest_many([*events, events[3]])
    single = await engine.ingest(events[0])
    assert all(o.status is IngestStatus.STORED for o in first)
    assert all(o.status is IngestStatus.DUPLICATE for o in again)
    assert single.status is IngestStatus.DUPLICATE
    assert await count(engine, "SELECT count(*) FROM messages") == 30
    assert await count(engine, "SELECT count(*) FROM messages_fts") == 30
    # the same id in another channel is a different message
    other = Scope(platform="test", workspace="w1", channel="random")
    (o,) = await engine.ingest_many([msg(other, "m0", "Bob", "hi", 0)])
    assert o.status is IngestStatus.STORED


async def test_sessions_split_on_idle_gap_with_turn_indexes(
    engine: MemoryEngine, scope: Scope
) -> None:
    minutes = [0, 1, 2, 40, 41, 200, 199.5]
    await engine.ingest_many([msg(scope, f"m{i}", "Al", f"x{i}", m) for i, m in enumerate(minutes)])
    got = {}
    for i in range(len(minutes)):
        m = await engine.store.messages.get(scope, f"m{i}")
        assert m is not None
        got[i] = (m.session_id, m.turn_index)
    assert got == {0: (1, 0), 1: (1, 1), 2: (1, 2), 3: (2, 0), 4: (2, 1), 5: (3, 0), 6: (3, 1)}
    started = await engine.store.messages.session_started(scope, [1, 2, 3])
    assert started[2] == pytest.approx((T0 + timedelta(minutes=40)).timestamp())


async def test_session_break_flag_forces_a_new_session(engine: MemoryEngine, scope: Scope) -> None:
    await engine.ingest_many(
        [msg(scope, "a", "Al", "one", 0), msg(scope, "b", "Al", "two", 1, session_break=True)]
    )
    b = await engine.store.messages.get(scope, "b")
    assert b is not None and (b.session_id, b.turn_index) == (2, 0)


@pytest.mark.sqlite_only(
    "ends with FTS5's integrity-check command (PostgreSQL: tests/test_pg_search.py)"
)
async def test_fts_and_vectors_follow_edits_and_deletes(engine: MemoryEngine, scope: Scope) -> None:
    await engine.ingest_many(
        [
            msg(scope, "m1", "Alice", "the marmalade recipe is great", 0),
            msg(scope, "m2", "Bob", "I prefer strawberry jam", 1),
        ]
    )
    assert await engine.embed_pending() == 2
    hits = await engine.search("marmalade", [scope], mode="lexical")
    assert [h.message.message_id for h in hits] == ["m1"]

    status = await engine.edit(
        EditEvent(scope=scope, message_id="m1", text="the pancake recipe", edited_at=T0)
    )
    assert status is ChangeStatus.APPLIED
    assert await engine.search("marmalade", [scope], mode="lexical") == []
    assert [
        h.message.message_id for h in await engine.search("pancake", [scope], mode="lexical")
    ] == ["m1"]
    # the edited message lost its vector until re-embedded
    assert await count(engine, "SELECT count(*) FROM messages_vec") == 1
    assert await engine.embed_pending() == 1
    dense = await engine.search("pancake recipe", [scope], mode="dense", limit=1)
    assert dense[0].message.message_id == "m1"
    edited = await engine.store.messages.get(scope, "m1")
    assert edited is not None and edited.edited_at == T0

    assert await engine.delete(DeleteEvent(scope=scope, message_id="m2")) is ChangeStatus.APPLIED
    assert await engine.search("strawberry", [scope], mode="lexical") == []
    assert all(h.message.message_id != "m2" for h in await engine.search("jam", [scope]))
    assert await count(engine, "SELECT count(*) FROM messages_vec") == 1
    assert await count(engine, "SELECT count(*) FROM message_vectors") == 1
    # a replayed create of a deleted message does not bring it back
    (again,) = await engine.ingest_many([msg(scope, "m2", "Bob", "I prefer strawberry jam", 1)])
    assert again.status is IngestStatus.DUPLICATE
    assert await engine.search("strawberry", [scope], mode="lexical") == []
    # edits and deletes of unknown messages are reported, not invented
    assert await engine.delete(DeleteEvent(scope=scope, message_id="zz")) is ChangeStatus.UNKNOWN
    assert (
        await engine.edit(EditEvent(scope=scope, message_id="zz", text="x", edited_at=T0))
        is ChangeStatus.UNKNOWN
    )
    # FTS integrity check: the external-content index matches the table
    await engine.store.db.writer.execute(
        "INSERT INTO messages_fts(messages_fts, rank) VALUES('integrity-check', 1)"
    )


async def test_vectors_skip_messages_edited_while_embedding(
    engine: MemoryEngine, scope: Scope, embedder: HashEmbedder
) -> None:
    await engine.ingest_many([msg(scope, "m1", "Al", "first words", 0)])
    items = await engine.store.messages.pending_embeddings(10)
    await engine.edit(EditEvent(scope=scope, message_id="m1", text="changed", edited_at=T0))
    stored = await engine.store.messages.store_vectors(
        items, embedder.embed_sync([t for _, _, t in items])
    )
    assert stored == 0  # stale vector refused; the message stays pending
    assert await engine.store.messages.count_pending_embeddings() == 1


async def test_search_is_restricted_to_given_channels(engine: MemoryEngine, scope: Scope) -> None:
    private = Scope(platform="test", workspace="w1", channel="secret")
    await engine.ingest_many(
        [
            msg(scope, "p1", "Al", "the budget meeting is friday", 0),
            msg(private, "s1", "Bo", "the budget budget budget secret", 0),
        ]
    )
    await engine.embed_pending()
    for mode in ("lexical", "dense", "hybrid"):
        hits = await engine.search("budget", [scope], mode=mode)  # type: ignore[arg-type]
        assert {h.message.scope.channel for h in hits} == {"general"}, mode
    assert await engine.search("budget", []) == []


async def test_roster_events_round_trip(engine: MemoryEngine, scope: Scope) -> None:
    await engine.roster(
        RosterEvent(scope=scope, action=RosterAction.JOIN, user_id="u1", name="Ann")
    )
    await engine.roster(RosterEvent(scope=scope, action=RosterAction.JOIN, user_id="u2", name="Bo"))
    await engine.roster(
        RosterEvent(scope=scope, action=RosterAction.RENAME, user_id="u1", name="Annie")
    )
    await engine.roster(
        RosterEvent(scope=scope, action=RosterAction.ALIAS, user_id="u1", name="Nan")
    )
    await engine.roster(RosterEvent(scope=scope, action=RosterAction.LEAVE, user_id="u2"))
    members = await engine.members(scope)
    assert [(m.user_id, m.display_name, m.aliases) for m in members] == [("u1", "Annie", ("Nan",))]
    everyone = await engine.members(scope, include_left=True)
    assert {m.user_id for m in everyone} == {"u1", "u2"}
    assert await engine.store.channels.find_user("test", "w1", "nan") == ["u1"]
    assert await engine.store.channels.find_user("test", "w1", "ANNIE") == ["u1"]
    readable = await engine.store.channels.readable_channels("test", "w1", "u2")
    assert readable == []
    # rejoining clears left_at; a speaker's first message adds them to the roster
    await engine.roster(RosterEvent(scope=scope, action=RosterAction.JOIN, user_id="u2"))
    await engine.ingest_many([msg(scope, "m1", "Cy", "hello", 0)])
    assert {m.user_id for m in await engine.members(scope)} == {"u1", "u2", "cy"}
    with pytest.raises(ValueError):
        await engine.roster(RosterEvent(scope=scope, action=RosterAction.RENAME, user_id="u1"))


async def test_segments_close_at_window_and_idle(tmp_path: Path, scope: Scope) -> None:
    eng = await MemoryEngine.open(make_config(tmp_path, segment_window=5))
    try:
        await eng.ingest_many([msg(scope, f"m{i}", "Al", f"t{i}", i * 0.1) for i in range(12)])
        counts = await eng.store.segments.counts()
        assert counts["segments_pending"] == 2 and counts["segments_open"] == 1
        due = await eng.store.segments.due(limit=10)
        assert [s.n_messages for s in due] == [5, 5]
        assert [m.message_id for m in await eng.store.messages.in_segment(due[0].id)] == [
            f"m{i}" for i in range(5)
        ]
        closed = await eng.store.segments.close_idle(60, now=(T0 + timedelta(hours=2)).timestamp())
        assert closed == 1
        assert (await eng.store.segments.counts())["segments_open"] == 0
        await eng.store.segments.defer(due[0].id, "endpoint down", 3600)
        # a segment backing off holds back its channel's later segments (order is kept) ...
        assert await eng.store.segments.due(limit=10) == []
        later = await eng.store.segments.due(limit=10, now=(T0 + timedelta(days=3650)).timestamp())
        assert [s.id for s in later] == [due[0].id, due[1].id, due[1].id + 1]
        # ... but not another channel's
        other = Scope(platform="test", workspace="w1", channel="other")
        await eng.ingest_many([msg(other, f"o{i}", "Bo", f"t{i}", i * 0.1) for i in range(5)])
        assert [s.scope for s in await eng.store.segments.due(limit=10)] == [other]
    finally:
        await eng.close()


async def test_segment_backlog_sums_up_the_pending_ones(tmp_path: Path, scope: Scope) -> None:
    eng = await MemoryEngine.open(make_config(tmp_path, segment_window=5))
    try:
        assert await eng.store.segments.backlog() == (0, 0, None, None)
        other = Scope(platform="test", workspace="w1", channel="other")
        await eng.ingest_many([msg(scope, f"m{i}", "Al", f"t{i}", i) for i in range(12)])
        await eng.ingest_many([msg(other, f"o{i}", "Bo", f"t{i}", 100 + i) for i in range(5)])
        due = await eng.store.segments.due(limit=10)
        assert len(due) == 3  # two in `scope`, one in `other`; `scope`'s third is open
        await eng.store.segments.defer(due[1].id, "endpoint down", 60, now=1_000.0)
        await eng.store.segments.defer(due[2].id, "endpoint down", 30, now=1_000.0)
        backlog = await eng.store.segments.backlog()
        assert backlog.pending == 3 and backlog.deferred == 2
        assert backlog.oldest_opened_at == pytest.approx(due[0].opened_at.timestamp(), abs=1e-3)
        assert backlog.earliest_retry_at == 1_030.0
    finally:
        await eng.close()


def _record(content: str, owner: str = "alice", **kw: object) -> NewRecord:
    base: dict[str, object] = dict(
        layer=Layer.CORE,
        record_scope=RecordScope.PERSON,
        content=content,
        source=owner,
        owner=owner,
        event="diet",
        time=T0,
        session_id=1,
        from_ids=("m1",),
        writer_model="test",
        prompt_version="writer-v1",
    )
    base.update(kw)
    return NewRecord(**base)  # type: ignore[arg-type]


@pytest.mark.sqlite_only("expects SQLite's CHECK error text through its writer connection")
async def test_records_chain_indexes_and_run_log(
    engine: MemoryEngine, scope: Scope, embedder: HashEmbedder
) -> None:
    await engine.ingest_many(
        [msg(scope, "m1", "Alice", "I am vegetarian", 0), msg(scope, "m2", "Alice", "now vegan", 1)]
    )
    seg = (await engine.store.segments.due(limit=1)) or []
    assert seg == []  # still open
    await engine.store.segments.close_channel(scope)
    (segment,) = await engine.store.segments.due(limit=1)
    first = [_record("Alice is vegetarian")]
    run = WriterRunLog(
        model="test",
        prompt_version="writer-v1",
        started_at=0,
        proposed=1,
        accepted=1,
        rejected={"ungrounded": 2},
    )
    (rid,) = await engine.store.records.commit_segment(
        segment.id, scope, first, embedder.embed_sync(["Alice is vegetarian"]), run
    )
    # a redo of a done segment commits nothing (crash-safe replays)
    assert await engine.store.records.commit_segment(segment.id, scope, first, None, run) == []
    update = _record("Alice is vegan", supersedes=rid, from_ids=("m2",))
    (rid2,) = await engine.store.records.add_records(scope, [update], None)
    chain = await engine.store.records.chain(rid2)
    assert [r.id for r in chain] == [rid, rid2]
    assert chain[0].state is RecordState.SUPERSEDED and chain[0].superseded_by == rid2
    assert chain[1].supersedes == rid and chain[1].chain_root == rid
    heads = await engine.store.records.heads(await engine.channel_pks([scope]), owners=["alice"])
    assert [h.content for h in heads] == ["Alice is vegan"]
    with pytest.raises(ChainConflict):
        await engine.store.records.add_records(scope, [_record("x", supersedes=rid)], None)
    pks = await engine.channel_pks([scope])
    assert [r for r, _ in await engine.store.records.lexical('"vegan"', pks, 5)] == [rid2]
    assert [
        r
        for r, _ in await engine.store.records.dense(
            embedder.embed_sync(["Alice is vegetarian"])[0], pks, 1
        )
    ] == [rid]
    src = await engine.store.db.read("SELECT record_id, message_pk FROM record_sources")
    assert len(src) == 2
    stats = await engine.store.records.writer_stats()
    assert stats["flushes"] == 1 and stats["rejected"] == {"ungrounded": 2}
    seg_state = await engine.store.db.read("SELECT state FROM segments WHERE id = ?", (segment.id,))
    assert seg_state[0][0] == "done"
    # the schema refuses a record without provenance
    with pytest.raises(Exception, match="CHECK constraint failed"):
        await engine.store.db.writer.execute(
            "INSERT INTO records (channel_pk, platform, workspace, channel, layer, record_scope,"
            " content, source, owner, time, from_ids, chain_root, writer_model, prompt_version,"
            " created_at) VALUES (1,'t','w','c','core','PERSON','x','a','a',0,'[]',0,'m','v',0)"
        )
    rows = await engine.store.db.read("SELECT from_ids FROM records WHERE id = ?", (rid,))
    assert json.loads(rows[0][0]) == ["m1"]


async def test_failed_batch_stores_nothing_and_keeps_earlier_rows(
    engine: MemoryEngine, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    await engine.ingest_many([msg(scope, "keep", "Al", "already stored", 0)])
    repo = engine.store.messages
    original = repo.channels.upsert_users

    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(repo.channels, "upsert_users", boom)
    with pytest.raises(RuntimeError):
        await engine.ingest_many([msg(scope, f"n{i}", "Al", "new", 1 + i) for i in range(5)])
    monkeypatch.setattr(repo.channels, "upsert_users", original)
    assert await count(engine, "SELECT count(*) FROM messages") == 1
    assert await count(engine, "SELECT count(*) FROM messages_fts") == 1
    # and the same batch goes through afterwards, exactly once
    await engine.ingest_many([msg(scope, f"n{i}", "Al", "new", 1 + i) for i in range(5)])
    assert await count(engine, "SELECT count(*) FROM messages") == 6


@pytest.mark.parametrize(
    "bad",
    [
        {"message_id": ""},
        {"text": "x" * 40_001},
        {"text": "bad \udcff bytes"},
        {"speaker_id": ""},
    ],
)
def test_malformed_messages_are_rejected_with_a_clear_error(scope: Scope, bad: dict) -> None:
    fields = dict(
        scope=scope, message_id="m1", speaker_id="al", speaker_name="Al", text="ok", ts=T0
    )
    fields.update(bad)
    with pytest.raises(ValidationError) as info:
        from memory.models import MessageEvent

        MessageEvent(**fields)  # type: ignore[arg-type]
    assert info.value.errors()[0]["loc"][0] in {"message_id", "text", "speaker_id"}


async def test_dense_search_ranks_by_exact_cosine(engine: MemoryEngine, scope: Scope) -> None:
    texts = [f"topic{i} alpha beta" for i in range(50)] + ["gardening tomatoes basil"]
    await engine.ingest_many([msg(scope, f"m{i}", "Al", t, i) for i, t in enumerate(texts)])
    await engine.embed_pending()
    hits = await engine.search("tomatoes basil gardening", [scope], mode="dense", limit=3)
    assert hits[0].message.message_id == "m50"
    assert hits[0].dense_rank == 1 and hits[0].lexical_rank is None
    vec = np.frombuffer(
        (await engine.store.db.read("SELECT embedding FROM message_vectors LIMIT 1"))[0][0],
        dtype=np.float32,
    )
    assert vec.shape == (384,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-4


@pytest.mark.sqlite_only("the sign-bit cache is the SQLite store's")
async def test_sign_bits_are_cached_only_for_large_partitions_and_never_stale(
    engine: MemoryEngine, scope: Scope
) -> None:
    texts = [f"topic{i} alpha beta" for i in range(150)]  # three vec0 chunks of 64
    await engine.ingest_many([msg(scope, f"m{i}", "Al", t, i) for i, t in enumerate(texts)])
    await engine.embed_pending()
    repo = engine.store.messages

    async def top(question: str) -> list[str]:
        hits = await engine.search(question, [scope], mode="dense", limit=5)
        return [h.message.message_id for h in hits]

    repo.bits_cache_min_rows = 151  # a larger partition than this one: read every time
    uncached = await top("topic7 alpha beta")
    assert not repo._bits_cache
    repo.bits_cache_min_rows = 150
    assert await top("topic7 alpha beta") == uncached
    assert len(repo._bits_cache) == 1
    assert await top("topic7 alpha beta") == uncached  # served from the cache

    # a new row in the cached partition: the entry is stale and must not hide it
    await engine.ingest_many([msg(scope, "new", "Bo", "gardening tomatoes basil", 200)])
    await engine.embed_pending()
    assert (await top("tomatoes basil gardening"))[0] == "new"


@pytest.mark.sqlite_only("reads sqlite_master and PRAGMA table_info")
async def test_every_table_carries_its_scope(engine: MemoryEngine) -> None:
    """SPEC §3: every row carries platform/workspace/channel (users are per workspace)."""
    tables = [
        r[0]
        for r in await engine.store.db.read(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE '%VIRTUAL%'"
            " AND name NOT LIKE 'messages_fts%' AND name NOT LIKE 'records_fts%'"
            " AND name NOT LIKE '%_vec_%' AND name NOT LIKE 'sqlite_%'"
            # message_vectors is the float payload of a messages row, keyed by its id; the
            # interaction graph's rows are likewise keyed by message (or channel) pk
            " AND name NOT IN ('schema_migrations', 'message_vectors', 'message_addressees',"
            " 'message_links', 'interaction_cursor', 'store_secrets')"  # the database's key
        )
    ]
    assert {"messages", "records", "record_sources", "roster", "segments", "writer_runs"} <= set(
        tables
    )
    for table in tables:
        cols = {r[1] for r in await engine.store.db.read(f"PRAGMA table_info({table})")}
        needed = (
            {"platform", "workspace"}
            # per-workspace tables: people, their preferences and tombstones, workspace
            # policy, admin audit, forgets in progress
            if table
            in (
                "users",
                "user_aliases",
                "user_prefs",
                "workspace_policy",
                "audit_log",
                "forgotten_people",
                "forgotten_names",
                "forget_jobs",
            )
            else {"platform", "workspace", "channel"}
        )
        assert needed <= cols, table


@pytest.mark.sqlite_only("SQLite's IN lists (PostgreSQL's reads bind arrays: one text already)")
async def test_in_lists_of_any_length_share_a_few_statement_texts(
    engine: MemoryEngine, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each connection caches prepared statements by their text: lists of every length
    must not each make a new one (memory.store.inlists), and padding must not change what
    the reads return."""
    fruit = ["apples" if i % 3 == 0 else "pears" for i in range(70)]
    events = [msg(scope, f"m{i}", f"P{i % 40}", f"note {i} about {fruit[i]}", i) for i in range(70)]
    await engine.ingest_many(events)
    stored = await engine.store.messages.by_ids(scope, [e.message_id for e in events])
    pks = [stored[e.message_id].pk for e in events]
    speakers = [f"p{i}" for i in range(40)]
    (channel_pk,) = await engine.channel_pks([scope])

    texts: dict[str, set[str]] = {}
    real_read = engine.store.db.read
    label = ""

    async def spy(sql: str, params: tuple | list = ()) -> list:
        texts.setdefault(label, set()).add(sql)
        return await real_read(sql, params)

    monkeypatch.setattr(engine.store.db, "read", spy)
    label = "get_many"
    for n in range(1, 71):
        assert set(await engine.store.messages.get_many(pks[:n])) == set(pks[:n])
    label = "lexical"
    for k in range(1, 41):
        hits = await engine.store.messages.lexical(
            "apples", [channel_pk], 100, speakers=speakers[:k]
        )
        wanted = {pks[i] for i in range(70) if i % 40 < k and fruit[i] == "apples"}
        assert {pk for pk, _ in hits} == wanted
    assert len(texts["get_many"]) <= 8  # 1, 2, 4, ..., 128 values
    assert len(texts["lexical"]) <= 7  # 1, 2, 4, ..., 32, 64 values
