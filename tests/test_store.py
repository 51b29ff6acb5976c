"""The SQLite store's own details, read with SQL: migrations and WAL, the FTS5 and vec0
rows behind the indexes, the schema's checks, the sign-bit cache, IN-list texts.

What the store does (on every backend) is the contract suite's: tests/store_contract/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import (
    DeleteEvent,
    EditEvent,
    Layer,
    NewRecord,
    RecordScope,
    Scope,
)
from speakermem.memory.store import ChangeStatus, IngestStatus, WriterRunLog
from speakermem.memory.store.sqlite.schema import migrations
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder


async def count(engine: MemoryEngine, sql: str, params: tuple = ()) -> int:
    rows = await engine.store.db.read(sql, params)
    return int(rows[0][0])


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


async def test_rows_carry_their_scope_and_replays_add_no_index_rows(
    engine: MemoryEngine, scope: Scope
) -> None:
    events = [msg(scope, f"m{i}", "Alice", f"text {i}", i) for i in range(30)]
    await engine.ingest_many(events)
    await engine.ingest_many([*events, events[3]])
    await engine.ingest(events[0])
    assert await count(engine, "SELECT count(*) FROM messages") == 30
    assert await count(engine, "SELECT count(*) FROM messages_fts") == 30
    row = await engine.store.db.read(
        "SELECT platform, workspace, channel FROM messages WHERE message_id = 'm1'"
    )
    assert tuple(row[0]) == scope.key()


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


async def test_record_rows_provenance_and_the_schemas_checks(
    engine: MemoryEngine, scope: Scope, embedder: HashEmbedder
) -> None:
    await engine.ingest_many(
        [msg(scope, "m1", "Alice", "I am vegetarian", 0), msg(scope, "m2", "Alice", "now vegan", 1)]
    )
    await engine.store.segments.close_channel(scope)
    (segment,) = await engine.store.segments.due(limit=1)
    run = WriterRunLog(model="test", prompt_version="writer-v1", started_at=0)
    (rid,) = await engine.store.records.commit_segment(
        segment.id, scope, [_record("Alice is vegetarian")], None, run
    )
    update = _record("Alice is vegan", supersedes=rid, from_ids=("m2",))
    await engine.store.records.add_records(scope, [update], None)
    src = await engine.store.db.read("SELECT record_id, message_pk FROM record_sources")
    assert len(src) == 2
    seg_state = await engine.store.db.read("SELECT state FROM segments WHERE id = ?", (segment.id,))
    assert seg_state[0][0] == "done"
    rows = await engine.store.db.read("SELECT from_ids FROM records WHERE id = ?", (rid,))
    assert json.loads(rows[0][0]) == ["m1"]
    # the schema refuses a record without provenance
    with pytest.raises(Exception, match="CHECK constraint failed"):
        await engine.store.db.writer.execute(
            "INSERT INTO records (channel_pk, platform, workspace, channel, layer, record_scope,"
            " content, source, owner, time, from_ids, chain_root, writer_model, prompt_version,"
            " created_at) VALUES (1,'t','w','c','core','PERSON','x','a','a',0,'[]',0,'m','v',0)"
        )


async def test_a_failed_batch_leaves_no_index_rows(
    engine: MemoryEngine, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    await engine.ingest_many([msg(scope, "keep", "Al", "already stored", 0)])

    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(engine.store.channels, "upsert_users", boom)
    with pytest.raises(RuntimeError):
        await engine.ingest_many([msg(scope, f"n{i}", "Al", "new", 1 + i) for i in range(5)])
    assert await count(engine, "SELECT count(*) FROM messages") == 1
    assert await count(engine, "SELECT count(*) FROM messages_fts") == 1


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
        from speakermem.memory.models import MessageEvent

        MessageEvent(**fields)  # type: ignore[arg-type]
    assert info.value.errors()[0]["loc"][0] in {"message_id", "text", "speaker_id"}


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


async def test_cached_sign_bits_see_another_connections_writes(
    engine: MemoryEngine, scope: Scope, tmp_path: Path, embedder: HashEmbedder
) -> None:
    """The cache skips its currency check while nothing was committed; a commit by another
    connection (another process's store) must make it check again."""
    texts = [f"topic{i} alpha beta" for i in range(150)]
    await engine.ingest_many([msg(scope, f"m{i}", "Al", t, i) for i, t in enumerate(texts)])
    await engine.embed_pending()
    repo = engine.store.messages
    repo.bits_cache_min_rows = 100
    repo._shadow_knn = True

    async def top(eng: MemoryEngine, question: str) -> list[str]:
        hits = await eng.search(question, [scope], mode="dense", limit=3)
        return [h.message.message_id for h in hits]

    before = await top(engine, "tomatoes basil gardening")
    assert await top(engine, "tomatoes basil gardening") == before  # cached, unchanged
    assert len(repo._bits_cache) == 1
    other = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await other.ingest_many([msg(scope, "new", "Bo", "gardening tomatoes basil", 200)])
        await other.embed_pending()
    finally:
        await other.close()
    assert (await top(engine, "tomatoes basil gardening"))[0] == "new"


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
            # the database's key, and which model wrote its vectors: facts of the whole store
            " 'message_links', 'interaction_cursor', 'store_secrets', 'store_meta')"
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
