"""The forget suite: every way a message goes runs one cascade, and nothing is left behind.

Each test seeds real messages (with vectors) and derived records (with vectors and chains) in
a real SQLite file, forgets something, then looks for the forgotten words everywhere: FTS5,
vector search, /recall, every column of every table, and the raw database file with its WAL
checkpointed. Everyone else's messages must all still be there, and the receipt's counts must
equal what the tables lost.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import Receipt
from speakermem.memory.governance.service import ForgetIncomplete, Governance
from speakermem.memory.models import DeleteEvent, Layer, NewRecord, RecordScope, Scope
from speakermem.memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract

GENERAL = Scope(platform="test", workspace="w1", channel="general")
SECRET = Scope(platform="test", workspace="w1", channel="secret")

# distinctive words (porter leaves them whole) per speaker
ALICE_WORDS = ("zorblatt", "quixvane", "mervolin")
BOB_WORDS = ("plimwick", "dravenox")
CAROL_WORDS = ("tessaloon",)


def rec(
    content: str,
    from_ids: tuple[str, ...],
    *,
    owner: str,
    source: str,
    supersedes: int | None = None,
    layer: Layer = Layer.PROFILE,
) -> NewRecord:
    return NewRecord(
        layer=layer,
        record_scope=RecordScope.PERSON if owner != "GROUP" else RecordScope.GROUP,
        content=content,
        source=source,
        owner=owner,
        event="",
        time=T0,
        session_id=0,
        from_ids=from_ids,
        supersedes=supersedes,
        writer_model="test",
        prompt_version="t1",
    )


async def seed(engine: MemoryEngine, embedder: HashEmbedder) -> dict[str, int]:
    """Messages in two channels, records with chains and mixed support; returns record ids."""
    await engine.ingest_many(
        [
            msg(GENERAL, "a1", "Alice", "I bought a zorblatt for the garden", 0),
            msg(GENERAL, "b1", "Bob", "my plimwick is broken again", 1),
            msg(GENERAL, "a2", "Alice", "the quixvane arrives on friday", 2),
            msg(GENERAL, "c1", "Carol", "tessaloon practice tonight", 3),
            msg(GENERAL, "b2", "Bob", "Alice and I fixed the dravenox together", 4),
            msg(SECRET, "a3", "Alice", "mervolin is my secret project", 5),
            msg(SECRET, "c2", "Carol", "nobody knows about the launch", 6),
        ]
    )
    await engine.embed_pending()
    records = engine.store.records

    async def add(scope: Scope, r: NewRecord) -> int:
        vec = embedder.embed_sync([r.content])
        (rid,) = await records.add_records(scope, [r], vec)
        return rid

    ids: dict[str, int] = {}
    ids["alice_v1"] = await add(
        GENERAL, rec("Alice owns a zorblatt", ("a1",), owner="alice", source="alice")
    )
    ids["alice_v2"] = await add(
        GENERAL,
        rec(
            "Alice owns a zorblatt and a quixvane",
            ("a1", "a2"),
            owner="alice",
            source="alice",
            supersedes=ids["alice_v1"],
        ),
    )
    ids["bob"] = await add(
        GENERAL, rec("Bob has a broken plimwick", ("b1",), owner="bob", source="bob")
    )
    ids["group_mixed"] = await add(
        GENERAL,
        rec(
            "Alice and Bob fixed the dravenox; Bob's plimwick is broken",
            ("b1", "b2"),
            owner="GROUP",
            source="bob",
            layer=Layer.INTERACTION,
        ),
    )
    ids["bob_about_alice"] = await add(
        GENERAL,
        rec("Alice fixed the dravenox with Bob", ("b2",), owner="alice", source="bob"),
    )
    ids["carol"] = await add(
        GENERAL, rec("Carol practises tessaloon", ("c1",), owner="carol", source="carol")
    )
    ids["alice_secret"] = await add(
        SECRET, rec("Alice has a secret mervolin project", ("a3",), owner="alice", source="alice")
    )
    return ids


TABLES_COUNTED = (
    "messages_live",
    "records",
    "record_sources",
    "message_vectors",
    "messages_vec",
    "records_vec",
    "users",
    "user_aliases",
    "rederive_queue",
)


async def counts(engine: MemoryEngine) -> dict[str, int]:
    sql = {
        "messages_live": "SELECT count(*) FROM messages WHERE deleted_at IS NULL",
        "records": "SELECT count(*) FROM records",
        "record_sources": "SELECT count(*) FROM record_sources",
        "message_vectors": "SELECT count(*) FROM message_vectors",
        "messages_vec": "SELECT count(*) FROM messages_vec",
        "records_vec": "SELECT count(*) FROM records_vec",
        "users": "SELECT count(*) FROM users",
        "user_aliases": "SELECT count(*) FROM user_aliases",
        "rederive_queue": "SELECT count(*) FROM rederive_queue",
    }
    out = {}
    for name, q in sql.items():
        out[name] = int((await engine.store.db.read(q))[0][0])
    return out


def on_postgres(engine: MemoryEngine) -> bool:
    return engine.store.driver_name == "postgres"


async def fts_hits(engine: MemoryEngine, word: str) -> list[Any]:
    if on_postgres(engine):  # the tsvector columns stand for FTS5's tables
        msgs = await engine.store.db.read(
            "SELECT id FROM messages WHERE deleted_at IS NULL"
            " AND fts @@ phraseto_tsquery('speakermem', ?)",
            (word,),
        )
        recs = await engine.store.db.read(
            "SELECT id FROM records WHERE fts @@ phraseto_tsquery('speakermem', ?)", (word,)
        )
        return list(msgs) + list(recs)
    msgs = await engine.store.db.read(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (word,)
    )
    recs = await engine.store.db.read(
        "SELECT rowid FROM records_fts WHERE records_fts MATCH ?", (word,)
    )
    return list(msgs) + list(recs)


async def table_scan(engine: MemoryEngine, word: str) -> list[str]:
    """Every column of every table (FTS and vec shadow tables included) holding `word`."""
    found = []
    needle = word.encode()
    if on_postgres(engine):  # every column as text, tsvectors and vectors included
        tables = await engine.store.db.read(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            " AND table_type = 'BASE TABLE'"
        )
        for (table,) in tables:
            cols = await engine.store.db.read(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name = ?",
                (table,),
            )
            for (col,) in cols:
                for (value,) in await engine.store.db.read(f'SELECT "{col}"::text FROM "{table}"'):
                    if value is not None and word in value.casefold():
                        found.append(f"{table}.{col}")
        return found
    tables = await engine.store.db.read(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
    )
    for (table,) in tables:
        cols = [c[1] for c in await engine.store.db.read(f"PRAGMA table_info('{table}')")]
        for col in cols:
            for (value,) in await engine.store.db.read(f'SELECT "{col}" FROM "{table}"'):
                if (isinstance(value, str) and word in value.casefold()) or (
                    isinstance(value, bytes) and needle in value
                ):
                    found.append(f"{table}.{col}")
    return found


async def raw_file_has(engine: MemoryEngine, word: str) -> bool:
    if on_postgres(engine):
        # Postgres keeps deleted row versions in its pages until VACUUM FULL rewrites the
        # table (plain VACUUM does not zero them) and in WAL until it is recycled: the files
        # of every table and index are read after the rewrite an operator runs (README).
        async with engine.store.db.pool.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute("VACUUM FULL")
            await conn.execute("CHECKPOINT")
        rows = await engine.store.db.read(
            "SELECT current_setting('data_directory'), pg_relation_filepath(c.oid)"
            " FROM pg_class c WHERE pg_relation_filepath(c.oid) IS NOT NULL"
        )
        for base, rel in rows:
            first = Path(base) / rel
            for part in (first, *first.parent.glob(first.name + ".*")):
                if part.exists() and word.encode() in part.read_bytes():
                    return True
        return False
    await engine.store.db.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path = engine.store.db.path
    data = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        data += wal.read_bytes()
    return word.encode() in data


async def dense_ids(engine: MemoryEngine, word: str) -> set[str]:
    hits = await engine.search(word, [GENERAL, SECRET], mode="dense", limit=50)
    return {h.message.message_id for h in hits}


async def record_dense_ids(engine: MemoryEngine, embedder: HashEmbedder, word: str) -> set[int]:
    pks = await engine.channel_pks([GENERAL, SECRET])
    vec = embedder.embed_sync([word])[0]
    return {rid for rid, _ in await engine.store.records.dense(vec, pks, 50)}


async def recall_text(engine: MemoryEngine, question: str, scope: Scope) -> str:
    try:
        result = await RecallPipeline(engine).run(RecallRequest(question, scope))
    except AccessDenied:  # a channel whose memory is off answers nothing
        return ""
    rows = " ".join(rr.record.content for r in result.rows for rr in r.records)
    excerpts = " ".join(e.text for e in result.pack.excerpts)
    return f"{result.answer.text} {rows} {excerpts}".casefold()


async def assert_gone(
    engine: MemoryEngine, embedder: HashEmbedder, words: tuple[str, ...], message_ids: set[str]
) -> None:
    for word in words:
        assert await fts_hits(engine, word) == [], word
        assert not (await dense_ids(engine, word)) & message_ids, word
        assert await table_scan(engine, word) == [], word
        assert not await raw_file_has(engine, word), word
        for scope in (GENERAL, SECRET):
            assert word not in await recall_text(engine, f"what about the {word}?", scope)


def assert_receipt_matches(receipt: Receipt, before: dict[str, int], after: dict[str, int]) -> None:
    got = dict(receipt.counts)
    assert got.get("messages", 0) == before["messages_live"] - after["messages_live"]
    assert got.get("messages_fts", 0) == before["messages_live"] - after["messages_live"]
    for table in (
        "records",
        "record_sources",
        "message_vectors",
        "messages_vec",
        "records_vec",
        "users",
        "user_aliases",
    ):
        assert got.get(table, 0) == before[table] - after[table], table
    assert got.get("records_fts", 0) == got.get("records", 0)
    assert got.get("rederive_queued", 0) - got.get("rederive_queue_dropped", 0) == (
        after["rederive_queue"] - before["rederive_queue"]
    )


async def live_ids(engine: MemoryEngine) -> set[str]:
    rows = await engine.store.db.read("SELECT message_id FROM messages WHERE deleted_at IS NULL")
    return {r[0] for r in rows}


@pytest.mark.sqlite_only("seeds interaction rows with INSERT OR IGNORE / OR REPLACE")
async def test_forget_user_removes_everything_of_theirs_and_nothing_else(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    ids = await seed(engine, embedder)
    await engine.store.governance.add_alias("test", "w1", "alice", "Ally")
    async with engine.store.db.transaction() as tx:  # interaction rows (issue 11's tables)
        pk = {r[1]: r[0] for r in await tx.fetchall("SELECT id, message_id FROM messages")}
        await tx.execute(
            "INSERT OR IGNORE INTO message_addressees (message_pk, addressee, how)"
            " VALUES (?, 'alice', 'vocative'), (?, 'bob', 'reply')",
            (pk["b2"], pk["a2"]),
        )
        await tx.execute(
            "INSERT OR REPLACE INTO message_links (message_pk, parent_pk, how)"
            " VALUES (?, ?, 'explicit'), (?, ?, 'previous')",
            (pk["a2"], pk["a1"], pk["b2"], pk["a2"]),
        )
    for word in ALICE_WORDS:  # the words are really there before
        assert await fts_hits(engine, word)
        assert await raw_file_has(engine, word)
    assert {"a1", "a2"} & await dense_ids(engine, "zorblatt")
    before = await counts(engine)
    gov = Governance(engine)
    receipt = await gov.forget_user("test", "w1", "alice", actor="cli")
    after = await counts(engine)

    await assert_gone(engine, embedder, ALICE_WORDS, {"a1", "a2", "a3"})
    # everyone else's messages are all still there
    assert await live_ids(engine) == {"b1", "b2", "c1", "c2"}
    for word in (*BOB_WORDS, *CAROL_WORDS):
        assert await fts_hits(engine, word)
    # records built from Alice's messages, about her or naming her (the GROUP record says
    # "Alice and Bob fixed...") are gone; Bob's and Carol's stay
    left = {r[0] for r in await engine.store.db.read("SELECT id FROM records")}
    assert ids["bob"] in left and ids["carol"] in left
    assert not left & {
        ids["alice_v1"],
        ids["alice_v2"],
        ids["alice_secret"],
        ids["bob_about_alice"],
        ids["group_mixed"],
    }
    assert not await record_dense_ids(engine, embedder, "zorblatt quixvane") & {
        ids["alice_v1"],
        ids["alice_v2"],
    }
    # her name row and alias are gone, and nothing about her was queued to come back
    assert await engine.store.db.read("SELECT * FROM users WHERE user_id = 'alice'") == []
    assert await engine.store.db.read("SELECT * FROM user_aliases WHERE user_id = 'alice'") == []
    assert await table_scan(engine, "ally") == []
    queued = await engine.store.db.read("SELECT owner, source FROM rederive_queue")
    assert all("alice" not in tuple(row) for row in queued)
    assert_receipt_matches(receipt, before, after)
    assert receipt.counts["messages"] == 3 and receipt.counts["records"] == 5
    assert receipt.counts["records_naming"] == 1 and receipt.counts["forgotten_people"] == 1
    # the receipt is in the audit log, without the text
    (entry,) = await gov.audit(5)
    assert entry["action"] == "forget-user" and entry["receipt"] == receipt.counts
    # interaction rows of her messages, and rows saying someone spoke to her, are gone
    links = await engine.store.db.read(
        "SELECT count(*) FROM message_links l JOIN messages m ON m.id = l.message_pk"
        " WHERE m.message_id IN ('a1', 'a2', 'a3')"
    )
    assert links[0][0] == 0
    assert (
        await engine.store.db.read("SELECT * FROM message_addressees WHERE addressee = 'alice'")
        == []
    )
    # a replayed create of a forgotten message does not bring it back
    (again,) = await engine.ingest_many([msg(GENERAL, "a1", "Alice", "zorblatt again", 0)])
    assert again.status.value == "duplicate"
    assert await fts_hits(engine, "zorblatt") == []


async def test_forget_message_withdraws_citing_records_and_queues_remaining_support(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    ids = await seed(engine, embedder)
    before = await counts(engine)
    gov = Governance(engine)
    receipt = await gov.forget_message(GENERAL, "b1", actor="cli")
    after = await counts(engine)
    await assert_gone(engine, embedder, ("plimwick",), {"b1"})
    assert await live_ids(engine) == {"a1", "a2", "a3", "b2", "c1", "c2"}
    left = {r[0] for r in await engine.store.db.read("SELECT id FROM records")}
    assert ids["bob"] not in left and ids["group_mixed"] not in left
    assert ids["bob_about_alice"] in left
    # the GROUP record had other support (b2): it is queued to be derived again from it
    (queued,) = await engine.store.db.read("SELECT owner, source, from_ids FROM rederive_queue")
    assert tuple(queued) == ("GROUP", "bob", '["b2"]')
    assert_receipt_matches(receipt, before, after)
    assert (await gov.status())["writer_queue"]["rederive"] == 1


async def test_platform_delete_runs_the_cascade(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    """The old bug: a deleted message's records kept being cited."""
    ids = await seed(engine, embedder)
    before = await counts(engine)
    status = await engine.delete(DeleteEvent(scope=GENERAL, message_id="a2"))
    assert status.value == "applied"
    after = await counts(engine)
    await assert_gone(engine, embedder, ("quixvane",), {"a2"})
    receipt = engine.store.messages.last_receipt
    assert receipt is not None
    assert_receipt_matches(receipt, before, after)
    # the head citing a2 is withdrawn; the older version (a1 only) is the head again
    chain = await engine.store.records.chain(ids["alice_v1"])
    assert [(r.id, r.state.value, r.superseded_by) for r in chain] == [
        (ids["alice_v1"], "active", None)
    ]
    result = await RecallPipeline(engine).run(RecallRequest("what does Alice own?", GENERAL))
    cited = {mid for r in result.rows for rr in r.records for mid in rr.record.from_ids}
    assert "a2" not in cited
    # deleting again changes nothing
    assert (await engine.delete(DeleteEvent(scope=GENERAL, message_id="a2"))).value == "unchanged"


async def test_opt_out_forget_and_channel_purge(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    await seed(engine, embedder)
    gov = Governance(engine)
    before = await counts(engine)
    receipt = await gov.opt_out("test", "w1", "carol", forget=True, actor="test:carol")
    after = await counts(engine)
    await assert_gone(engine, embedder, ("tessaloon",), {"c1", "c2"})
    assert_receipt_matches(receipt, before, after)
    assert await gov.is_opted_out("test", "w1", "carol")

    before = await counts(engine)
    receipt = await gov.purge_channel(SECRET, actor="cli")
    after = await counts(engine)
    await assert_gone(engine, embedder, ("mervolin",), {"a3"})
    assert not await gov.channel_enabled(SECRET)
    assert await live_ids(engine) == {"a1", "a2", "b1", "b2"}
    assert_receipt_matches(receipt, before, after)


async def test_batches_and_reruns_are_idempotent(tmp_path: Any, embedder: HashEmbedder) -> None:
    """Batches of one message give the same end state; running the cascade again does nothing."""
    from speakermem.memory.config import GovernanceConfig
    from tests.conftest import make_config

    cfg = make_config(tmp_path)
    cfg.governance = GovernanceConfig(forget_batch=1)
    eng = await MemoryEngine.open(cfg, embedder)
    try:
        await seed(eng, embedder)
        gov = Governance(eng)
        first = await gov.forget_user("test", "w1", "bob", actor="cli")
        assert first.counts["messages"] == 2
        again = await gov.forget_user("test", "w1", "bob", actor="cli")
        assert again.counts == {}
        await assert_gone(eng, embedder, BOB_WORDS, {"b1", "b2"})
    finally:
        await eng.close()


async def test_withdrawing_a_middle_version_keeps_the_chain_linked(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    await engine.ingest_many(
        [
            msg(GENERAL, "m1", "Dana", "I live in Oslo", 0),
            msg(GENERAL, "m2", "Dana", "I moved to Bergen", 1),
            msg(GENERAL, "m3", "Dana", "now I live in Tromso", 2),
        ]
    )
    records = engine.store.records
    (v1,) = await records.add_records(
        GENERAL, [rec("Dana lives in Oslo", ("m1",), owner="dana", source="dana")], None
    )
    (v2,) = await records.add_records(
        GENERAL,
        [rec("Dana lives in Bergen", ("m2",), owner="dana", source="dana", supersedes=v1)],
        None,
    )
    (v3,) = await records.add_records(
        GENERAL,
        [rec("Dana lives in Tromso", ("m3",), owner="dana", source="dana", supersedes=v2)],
        None,
    )
    receipt = await Governance(engine).forget_message(GENERAL, "m2", actor="cli")
    chain = await records.chain(v1)
    assert [(r.id, r.supersedes, r.superseded_by, r.state.value) for r in chain] == [
        (v1, None, v3, "superseded"),
        (v3, v1, None, "active"),
    ]
    assert receipt.counts["records_relinked"] == 2
    # withdrawing the root keeps the head and makes it its own root
    await Governance(engine).forget_message(GENERAL, "m1", actor="cli")
    (only,) = await records.chain(v3)
    assert (only.id, only.chain_root, only.supersedes, only.state.value) == (v3, v3, None, "active")


async def test_retention_forgets_old_messages_and_their_records(
    engine: MemoryEngine, embedder: HashEmbedder
) -> None:
    ids = await seed(engine, embedder)
    gov = Governance(engine)
    await gov.set_retention("test", "w1", None, 30, actor="cli")
    await gov.set_retention("test", "w1", "secret", 365, actor="cli")  # channel overrides
    # "now" is 30 days and 3.5 minutes after T0: a1, b1, a2, c1 (0..3 min) are past the limit
    now = (T0 + timedelta(days=30, minutes=3.5)).timestamp()
    before = await counts(engine)
    receipt = await gov.apply_retention(now=now, actor="cli")
    after = await counts(engine)
    assert await live_ids(engine) == {"b2", "a3", "c2"}
    await assert_gone(engine, embedder, ("zorblatt", "quixvane", "tessaloon"), {"a1", "a2", "c1"})
    left = {r[0] for r in await engine.store.db.read("SELECT id FROM records")}
    assert left == {ids["bob_about_alice"], ids["alice_secret"]}
    assert_receipt_matches(receipt, before, after)
    assert (await gov.apply_retention(now=now, actor="cli")).counts == {}


@pytest.mark.sqlite_only("reads messages_fts (FTS5) directly")
@pytest.mark.parametrize("words", [("dravenox",)])
async def test_edit_recheck_withdraws_records_the_new_text_no_longer_supports(
    engine: MemoryEngine, embedder: HashEmbedder, words: tuple[str, ...]
) -> None:
    from speakermem.memory.models import EditEvent

    ids = await seed(engine, embedder)
    gov = Governance(engine)
    # an edit that keeps the claim: records stay
    status, receipt = await gov.apply_edit(
        EditEvent(
            scope=GENERAL,
            message_id="b2",
            text="Alice and I fixed the dravenox today",
            edited_at=T0 + timedelta(hours=1),
        )
    )
    assert status.value == "applied" and receipt.counts == {}
    # an edit that removes it: the record resting on b2 alone is withdrawn and queued (b2
    # still exists); the GROUP record keeps enough support from b1 at the gate's threshold;
    # the old words leave the index
    status, receipt = await gov.apply_edit(
        EditEvent(
            scope=GENERAL,
            message_id="b2",
            text="never mind, wrong chat",
            edited_at=T0 + timedelta(hours=2),
        )
    )
    left = {r[0] for r in await engine.store.db.read("SELECT id FROM records")}
    assert ids["bob_about_alice"] not in left and ids["group_mixed"] in left
    assert receipt.counts["records"] == 1
    assert (
        await engine.store.db.read(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (words[0],)
        )
        == []
    )
    queued = await engine.store.db.read("SELECT owner, source, from_ids FROM rederive_queue")
    assert [tuple(q) for q in queued] == [("alice", "bob", '["b2"]')]


async def test_a_crash_mid_cascade_leaves_nothing_half_applied(
    engine: MemoryEngine, embedder: HashEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is one transaction: a failure after records were withdrawn rolls it all back,
    and running the forget again finishes the job."""
    from speakermem.memory.store.governance import ForgetCascade

    await seed(engine, embedder)
    before = await counts(engine)
    original = ForgetCascade._withdraw_tx

    async def crash(self: ForgetCascade, *args: Any, **kwargs: Any) -> None:
        await original(self, *args, **kwargs)
        raise RuntimeError("power cut")

    monkeypatch.setattr(ForgetCascade, "_withdraw_tx", crash)
    gov = Governance(engine)
    with pytest.raises(ForgetIncomplete) as failed:
        await gov.forget_user("test", "w1", "alice", actor="cli")
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert await counts(engine) == before
    assert await fts_hits(engine, "zorblatt")
    # the receipt and the audit log say it is incomplete and claim only what stayed done
    # (her tombstone; the batch that failed counts nothing)
    assert not failed.value.receipt.complete
    assert failed.value.receipt.counts == {"forgotten_people": 1}
    (entry,) = await gov.audit(5)
    assert entry["args"]["complete"] is False and entry["receipt"] == {"forgotten_people": 1}
    assert [j.target for j in await engine.store.forget_jobs.open()] == ["alice"]
    monkeypatch.setattr(ForgetCascade, "_withdraw_tx", original)
    receipt = await gov.forget_user("test", "w1", "alice", actor="cli")
    assert_receipt_matches(receipt, before, await counts(engine))
    await assert_gone(engine, embedder, ALICE_WORDS, {"a1", "a2", "a3"})
    assert await engine.store.forget_jobs.open() == []  # this forget finished the first
