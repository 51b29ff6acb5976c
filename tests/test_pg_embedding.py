"""The embedder's pending set on PostgreSQL (`messages_unembedded`, migration 7).

Storing a vector must not rewrite the message's row (an update of `messages` is a new row
version plus an entry in each of its indexes, the full-text GIN index among them); the
pending set must stay exact through ingest, store_vectors, edits, deletes, early deletes
and `speakermem migrate`, and equal SQLite's at every step. A database made before the
migration is converted: its live unembedded messages become the pending set.

Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import speakermem.memory.store.pg.schema as pg_schema
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import DeleteEvent, EditEvent, Scope
from speakermem.memory.store.migrate import migrate
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

SCOPE = Scope(platform="test", workspace="w1", channel="general")
OTHER = Scope(platform="test", workspace="w1", channel="random")


async def open_engine(path: Path, url: str | None, embedder: HashEmbedder) -> MemoryEngine:
    return await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=path, db_url=url)), embedder
    )


async def pending(engine: MemoryEngine) -> dict[str, str]:
    """message id -> text to embed, of every message the embedder would be handed."""
    repo = engine.store.messages
    items = await repo.pending_embeddings(10_000)
    stored = await repo.get_many([pk for pk, _, _ in items])
    out = {stored[pk].message_id: text for pk, _, text in items}
    assert await repo.count_pending_embeddings() == len(out)
    assert (await repo.counts())["unembedded"] == len(out)
    return out


async def check_pg_invariant(engine: MemoryEngine) -> None:
    """Every live message has a vector or is pending, never both; tombstones neither; the
    table holds nothing else."""
    db = engine.store.db
    live = {r[0] for r in await db.read("SELECT id FROM messages WHERE deleted_at IS NULL")}
    dead = {r[0] for r in await db.read("SELECT id FROM messages WHERE deleted_at IS NOT NULL")}
    queued = {r[0] for r in await db.read("SELECT id FROM messages_unembedded")}
    vectors = {r[0] for r in await db.read("SELECT id FROM message_vectors")}
    indexed = {r[0] for r in await db.read("SELECT rowid FROM messages_vec")}
    assert vectors == indexed
    assert queued | vectors == live
    assert not queued & vectors
    assert not (queued | vectors) & dead


async def row_versions(engine: MemoryEngine) -> dict[int, tuple[str, str]]:
    """id -> (xmin, ctid) of every messages row: any update, HOT or not, changes both."""
    rows = await engine.store.db.read("SELECT id, xmin::text, ctid::text FROM messages")
    return {int(r[0]): (r[1], r[2]) for r in rows}


async def test_storing_vectors_leaves_the_message_rows_untouched(
    tmp_path: Path, pg_url: str
) -> None:
    embedder = HashEmbedder()
    pg = await open_engine(tmp_path / "x.db", pg_url, embedder)
    try:
        events = [
            msg(SCOPE if i % 3 else OTHER, f"m{i}", "Al", f"message number {i}", i)
            for i in range(60)
        ]
        await pg.ingest_many(events)
        before = await row_versions(pg)
        assert len(before) == 60 and len(await pending(pg)) == 60
        assert await pg.embed_pending() == 60
        assert await row_versions(pg) == before
        assert await pending(pg) == {}
        await check_pg_invariant(pg)
        db = pg.store.db
        # the pgvector column (bound in binary) holds the very floats of the exact payload,
        # which are the embedder's vector of the message's text
        exact = await pg.store.messages.vectors(list(before))
        assert len(exact) == 60
        texts = {
            pk: f"{m.speaker_name}: {m.text}"
            for pk, m in (await pg.store.messages.get_many(list(before))).items()
        }
        for pk, vec in exact.items():
            assert (vec == embedder.embed_sync([texts[pk]])[0]).all()
        for rowid, literal in await db.read("SELECT rowid, embedding::text FROM messages_vec"):
            got = np.array(literal.strip("[]").split(","), dtype=np.float32)
            assert (got == exact[int(rowid)]).all()
        # nothing of the old design is left: the partial index became the table
        kinds = await db.read("SELECT relkind FROM pg_class WHERE relname = 'messages_unembedded'")
        assert [r[0] for r in kinds] == ["r"]
    finally:
        await pg.close()


async def test_pending_set_is_exact_and_equal_on_both_backends(tmp_path: Path, pg_url: str) -> None:
    embedder = HashEmbedder()
    lite = await open_engine(tmp_path / "lite.db", None, embedder)
    pg = await open_engine(tmp_path / "pg.db", pg_url, embedder)
    engines = (lite, pg)

    async def both(expected: dict[str, str]) -> None:
        for eng in engines:
            assert await pending(eng) == expected, eng.store.driver_name
        await check_pg_invariant(pg)

    def edit(mid: str, text: str, minutes: float) -> EditEvent:
        return EditEvent(
            scope=SCOPE, message_id=mid, text=text, edited_at=T0 + timedelta(minutes=minutes)
        )

    try:
        texts = {f"m{i}": f"plan number {i}" for i in range(6)}
        for eng in engines:
            await eng.ingest_many(
                [msg(SCOPE, mid, "Bo", text, i) for i, (mid, text) in enumerate(texts.items())]
            )
        await both({mid: f"Bo: {text}" for mid, text in texts.items()})

        # the first three get vectors
        for eng in engines:
            items = await eng.store.messages.pending_embeddings(3)
            vecs = embedder.embed_sync([t for _, _, t in items])
            assert await eng.store.messages.store_vectors(items, vecs) == 3
        await both({f"m{i}": f"Bo: plan number {i}" for i in (3, 4, 5)})

        # a vector of text read before an edit is refused; the others are stored
        for eng in engines:
            items = await eng.store.messages.pending_embeddings(10)
            await eng.edit(edit("m3", "plan three changed", 30))
            vecs = embedder.embed_sync([t for _, _, t in items])
            assert await eng.store.messages.store_vectors(items, vecs) == 2
        await both({"m3": "Bo: plan three changed"})

        # an edit of an embedded message makes it pending again, with the new text
        for eng in engines:
            await eng.edit(edit("m0", "plan zero changed", 31))
        await both({"m0": "Bo: plan zero changed", "m3": "Bo: plan three changed"})

        # a newer edit with the same words moves only the time
        for eng in engines:
            await eng.edit(edit("m1", "plan number 1", 32))
        await both({"m0": "Bo: plan zero changed", "m3": "Bo: plan three changed"})

        # deletes: a pending message leaves the set, an embedded one loses its vector
        for eng in engines:
            await eng.delete(DeleteEvent(scope=SCOPE, message_id="m3"))
            await eng.delete(DeleteEvent(scope=SCOPE, message_id="m2"))
        await both({"m0": "Bo: plan zero changed"})

        # a message whose delete arrived first is stored forgotten: never pending
        for eng in engines:
            await eng.delete(DeleteEvent(scope=SCOPE, message_id="early"))
            await eng.ingest(msg(SCOPE, "early", "Bo", "gone before it came", 40))
            await eng.ingest(msg(SCOPE, "late", "Bo", "a new plan", 41))
        await both({"m0": "Bo: plan zero changed", "late": "Bo: a new plan"})

        for eng in engines:
            assert await eng.embed_pending() == 2
        await both({})
    finally:
        for eng in engines:
            await eng.close()


async def test_a_database_made_before_the_table_is_converted(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = HashEmbedder()
    every = pg_schema.migrations
    assert [m.version for m in every(StoreConfig())][-1] >= 7

    def before_7(config: StoreConfig) -> list[Any]:
        return [m for m in every(config) if m.version < 7]

    monkeypatch.setattr(pg_schema, "migrations", before_7)
    # that release kept no record of its embedder (a later migration's table)
    old = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db", db_url=pg_url)),
        embedder,
        check_embedder=False,
    )
    # that release ingested without the admission gate (its tables come in a later migration)
    monkeypatch.setattr(old.store.channels.policy, "refusals", _no_gate)
    try:
        await old.ingest_many([msg(SCOPE, f"m{i}", "Cy", f"old text {i}", i) for i in range(5)])
        db = old.store.db
        assert await db.schema_version() == 6
        # the old design's state: two embedded (the flag), one tombstone
        async with db.transaction() as tx:
            await tx.execute("UPDATE messages SET embedded = 1 WHERE message_id IN ('m0', 'm1')")
            await tx.execute(
                "UPDATE messages SET deleted_at = 1, text = '', embedded = 1"
                " WHERE message_id = 'm4'"
            )
    finally:
        await old.close()
    monkeypatch.setattr(pg_schema, "migrations", every)
    new = await open_engine(tmp_path / "x.db", pg_url, embedder)
    try:
        assert await new.store.db.schema_version() >= 7
        assert await pending(new) == {"m2": "Cy: old text 2", "m3": "Cy: old text 3"}
        # a message row deleted outright (by hand, `migrate --prune`) leaves the set too
        db = new.store.db
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM messages WHERE message_id IN ('m1', 'm2')")
        assert await pending(new) == {"m3": "Cy: old text 3"}
        assert [r[0] for r in await db.read("SELECT id FROM messages_unembedded")] == [
            r[0] for r in await db.read("SELECT id FROM messages WHERE message_id = 'm3'")
        ]
    finally:
        await new.close()


async def test_migrate_keeps_the_pending_set_and_vectors_made_on_postgres(
    tmp_path: Path, pg_url: str
) -> None:
    embedder = HashEmbedder()
    source = tmp_path / "source.db"
    lite = await open_engine(source, None, embedder)
    try:
        await lite.ingest_many([msg(SCOPE, f"m{i}", "Di", f"source text {i}", i) for i in range(6)])
        items = await lite.store.messages.pending_embeddings(4)
        await lite.store.messages.store_vectors(items, embedder.embed_sync([t for *_, t in items]))
        assert set(await pending(lite)) == {"m4", "m5"}
    finally:
        await lite.close()

    assert (await migrate(source, pg_url)).ok
    pg = await open_engine(tmp_path / "pg.db", pg_url, embedder)
    try:
        assert set(await pending(pg)) == {"m4", "m5"}
        await check_pg_invariant(pg)
        assert await pg.embed_pending() == 2  # the target embeds what the source had not
    finally:
        await pg.close()

    # a second run keeps those vectors (their text did not change)...
    # (the target's extra vectors show as count mismatches: `ok` is not asked here)
    again = await migrate(source, pg_url)
    assert again.written == 0
    pg = await open_engine(tmp_path / "pg.db", pg_url, embedder)
    try:
        assert await pending(pg) == {}
        await check_pg_invariant(pg)
    finally:
        await pg.close()

    # ...and an edit in the source since then brings the message back to the set
    lite = await open_engine(source, None, embedder)
    try:
        await lite.edit(
            EditEvent(scope=SCOPE, message_id="m1", text="changed in the source", edited_at=T0)
        )
    finally:
        await lite.close()
    third = await migrate(source, pg_url)
    written = {t.table: t.written for t in third.tables}
    assert written["messages"] == 1 and written["message_vectors"] == 1  # the old vector
    pg = await open_engine(tmp_path / "pg.db", pg_url, embedder)
    try:
        assert await pending(pg) == {"m1": "Di: changed in the source"}
        await check_pg_invariant(pg)
    finally:
        await pg.close()


async def _no_gate(*args: Any, **kwargs: Any) -> dict[int, Any]:
    return {}
