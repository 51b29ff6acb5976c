"""The store boundary: the repository methods that replaced SQL outside memory/store, each
against a real SQLite file, and a source scan that keeps SQL from leaking back out."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import DeleteEvent, Layer, NewRecord, RecordScope, Scope
from speakermem.memory.store import WriterRunLog
from speakermem.memory.store.diagnostics import last_writer_run, location, schema_version
from speakermem.memory.store.sqlite.schema import migrations
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]
GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")
OTHER = Scope(platform="test", workspace="w2", channel="general")


def _record(
    content: str,
    from_ids: tuple[str, ...],
    *,
    owner: str,
    source: str,
    minutes: float = 0,
    supersedes: int | None = None,
) -> NewRecord:
    return NewRecord(
        layer=Layer.PROFILE,
        record_scope=RecordScope.PERSON,
        content=content,
        source=source,
        owner=owner,
        event="",
        time=T0 + timedelta(minutes=minutes),
        session_id=0,
        from_ids=from_ids,
        supersedes=supersedes,
        writer_model="test",
        prompt_version="t1",
    )


async def _seed(engine: MemoryEngine) -> dict[str, int]:
    await engine.ingest_many(
        [
            msg(GENERAL, "a1", "Alice", "I moved to Lisbon", 0),
            msg(GENERAL, "a2", "Alice", "actually Porto now", 1),
            msg(GENERAL, "b1", "Bob", "welcome to the north", 2),
            msg(RANDOM, "a3", "Alice", "my bike is red", 3),
            msg(OTHER, "a4", "Alice", "hello second workspace", 4),
        ]
    )
    records = engine.store.records
    (lisbon,) = await records.add_records(
        GENERAL, [_record("Alice lives in Lisbon", ("a1",), owner="alice", source="alice")], None
    )
    (porto,) = await records.add_records(
        GENERAL,
        [
            _record(
                "Alice lives in Porto",
                ("a2",),
                owner="alice",
                source="alice",
                supersedes=lisbon,
                minutes=1,
            )
        ],
        None,
    )
    (told,) = await records.add_records(
        GENERAL,
        [_record("Bob welcomed Alice", ("b1",), owner="alice", source="bob", minutes=2)],
        None,
    )
    (bike,) = await records.add_records(
        RANDOM, [_record("Alice has a red bike", ("a3",), owner="alice", source="alice")], None
    )
    (far,) = await records.add_records(
        OTHER, [_record("Alice says hello", ("a4",), owner="alice", source="alice")], None
    )
    return {"lisbon": lisbon, "porto": porto, "told": told, "bike": bike, "far": far}


async def test_channel_record_ids_every_state_only_that_channel(engine: MemoryEngine) -> None:
    ids = await _seed(engine)
    repo = engine.store.governance
    # the superseded Lisbon record is included: a purge sweeps every state
    assert await repo.channel_record_ids(GENERAL) == sorted(
        [ids["lisbon"], ids["porto"], ids["told"]]
    )
    assert await repo.channel_record_ids(RANDOM) == [ids["bike"]]
    unknown = Scope(platform="test", workspace="w1", channel="nowhere")
    assert await repo.channel_record_ids(unknown) == []


async def test_user_records_and_active_user_records(engine: MemoryEngine) -> None:
    ids = await _seed(engine)
    repo = engine.store.governance
    every = await repo.user_records("test", "w1", "alice")
    # chain by chain (chain_root, id): the Lisbon->Porto chain first, then the others
    assert [r.id for r in every] == [ids["lisbon"], ids["porto"], ids["told"], ids["bike"]]
    assert [r.state.value for r in every][:2] == ["superseded", "active"]
    active = await repo.active_user_records("test", "w1", "alice")
    # the superseded record is left out; newest record time first
    assert [r.id for r in active] == [ids["told"], ids["porto"], ids["bike"]]
    # source matches as well as owner; another workspace is never mixed in
    assert [r.id for r in await repo.user_records("test", "w1", "bob")] == [ids["told"]]
    assert [r.id for r in await repo.user_records("test", "w2", "alice")] == [ids["far"]]
    assert await repo.active_user_records("test", "w1", "carol") == []


async def test_live_message_count_and_has_spoken(engine: MemoryEngine) -> None:
    await _seed(engine)
    repo = engine.store.governance
    assert await repo.live_message_count("test", "w1", "alice") == 3
    assert await repo.live_message_count("test", "w2", "alice") == 1
    await engine.delete(DeleteEvent(scope=GENERAL, message_id="a1"))
    assert await repo.live_message_count("test", "w1", "alice") == 2
    assert await repo.has_spoken("test", "w1", "bob")
    assert not await repo.has_spoken("test", "w2", "bob")
    assert not await repo.has_spoken("test", "w1", "nobody")


async def test_channel_workspaces_sorted_and_distinct(engine: MemoryEngine) -> None:
    assert await engine.store.channels.workspaces() == []
    slack = Scope(platform="slack", workspace="T1", channel="C1")
    await engine.ingest_many([msg(OTHER, "x1", "Ann", "hi", 0), msg(slack, "x2", "Ann", "yo", 1)])
    await engine.ingest_many([msg(GENERAL, "x3", "Ann", "hey", 2)])
    await engine.ingest_many([msg(RANDOM, "x4", "Ann", "again", 3)])
    assert await engine.store.channels.workspaces() == [
        ("slack", "T1"),
        ("test", "w1"),
        ("test", "w2"),
    ]


async def test_diagnostics_location_schema_and_last_writer_run(
    engine: MemoryEngine, scope: Scope, embedder: HashEmbedder
) -> None:
    store = engine.store
    assert Path(location(store)) == store.db.config.db_path
    latest = max(m.version for m in migrations(store.db.config.vec_chunk_size))
    assert await schema_version(store) == latest
    assert await last_writer_run(store) == (None, None)
    await engine.ingest_many([msg(scope, "m1", "Alice", "I am vegetarian", 0)])
    await store.segments.close_channel(scope)
    (segment,) = await store.segments.due(limit=1)
    await store.records.log_failed_run(
        segment.id, scope, WriterRunLog(model="t", prompt_version="p", started_at=50.0)
    )
    await store.records.log_failed_run(
        segment.id,
        scope,
        WriterRunLog(model="t", prompt_version="p", started_at=20.0, outcome="llm-error"),
    )
    # the latest start time, and the outcome of the newest row (not of the latest start)
    assert await last_writer_run(store) == (50.0, "llm-error")
    stats = await engine.stats()
    assert stats["db_path"] == location(store)
    assert stats["schema_version"] == latest


# Files outside memory/store that still hand `store.db` to a store class or query it; each is
# owned elsewhere and due to move behind a repository method. No other file may add one.
STILL_REACHING_DB = {
    "src/speakermem/integrations/ops/server.py",  # readiness probe "SELECT 1"
}


def _reaches_db(tree: ast.AST) -> list[int]:
    """Lines with `<...>.store.db` or `store.db`: the raw database object of a Store."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr != "db":
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "store") or (
            isinstance(owner, ast.Name) and owner.id == "store"
        ):
            lines.append(node.lineno)
    return lines


def test_scan_finds_a_store_db_reach() -> None:
    assert _reaches_db(ast.parse("async def f(e):\n    await e.store.db.read('x')\n")) == [2]
    assert _reaches_db(ast.parse("p = store.db.path\n")) == [1]
    assert _reaches_db(ast.parse("n = self.store.messages.counts()\n")) == []


def test_no_sql_outside_the_store() -> None:
    found: dict[str, list[int]] = {}
    for package in ("bot", "memory", "integrations"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("src/speakermem/memory/store/"):
                continue
            lines = _reaches_db(ast.parse(path.read_text(), filename=rel))
            if lines:
                found[rel] = lines
    leaked = {rel: lines for rel, lines in found.items() if rel not in STILL_REACHING_DB}
    assert leaked == {}, f"reach the store's database only through a repository: {leaked}"
