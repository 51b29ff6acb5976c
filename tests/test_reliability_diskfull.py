"""Disk full: the store refuses writes (SQLITE_FULL), events wait in a bounded spill, /recall
keeps answering, and once space returns the spill is replayed into the store exactly once.

The database is filled for real: the writer connection's `PRAGMA max_page_count` caps the
file a few pages above its size and filler messages are written until SQLite answers
SQLITE_FULL, then smaller ones until even they do not fit. Raising the cap again is
"space returns".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    Event,
    RosterAction,
    RosterEvent,
)
from speakermem.bot.settings import Settings
from speakermem.bot.spill import Spill, SpillFull
from speakermem.integrations.ops.metrics import Metrics
from speakermem.integrations.runtime import build_spill
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from speakermem.memory.store import StoreFull
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder

GENERAL = Scope(platform="test", workspace="w1", channel="general")
FILLER = Scope(platform="test", workspace="w1", channel="filler")
NO_LIMIT = 1_073_741_823


async def fill_to_the_brim(engine: MemoryEngine) -> int:
    """Cap the file a few pages above its size and write until nothing more fits."""
    db = engine.store.db
    pages = (await db.read("PRAGMA page_count"))[0][0]
    await db.writer.execute(f"PRAGMA max_page_count = {pages + 6}")
    n = 0
    for size in (600, 60, 6, 1):
        while True:
            text = " ".join(f"filler{n}x{k}" for k in range(size))
            try:
                await engine.ingest_many([msg(FILLER, f"f{n}", "Filler", text, n)])
            except StoreFull:
                break
            n += 1
            assert n < 5_000, "max_page_count did not limit the file"
    return n


async def space_returns(engine: MemoryEngine) -> None:
    await engine.store.db.writer.execute(f"PRAGMA max_page_count = {NO_LIMIT}")


async def live_ids(engine: MemoryEngine, scope: Scope = GENERAL) -> list[str]:
    rows = await engine.store.db.read(
        "SELECT m.message_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.channel = ? AND m.deleted_at IS NULL ORDER BY m.id",
        (scope.channel,),
    )
    return [r[0] for r in rows]


async def all_rows(engine: MemoryEngine) -> int:
    return int((await engine.store.db.read("SELECT count(*) FROM messages"))[0][0])


def fifty(start: int = 100) -> list[Event]:
    """47 messages, then an edit and a delete of two of them, and a member joining."""
    events: list[Event] = [
        msg(GENERAL, f"k{i}", ("Ann", "Bo")[i % 2], f"kayak trip note {i} paddles", start + i)
        for i in range(47)
    ]
    events.append(
        EditEvent(
            scope=GENERAL,
            message_id="k0",
            text="kayak trip moved to the lake",
            edited_at=T0 + timedelta(minutes=start + 60),
        )
    )
    events.append(DeleteEvent(scope=GENERAL, message_id="k1"))
    events.append(RosterEvent(scope=GENERAL, action=RosterAction.JOIN, user_id="cy", name="Cy"))
    return events


def recall(question: str) -> CommandInvocation:
    return CommandInvocation(scope=GENERAL, command="recall", user_id="ann", text=question)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        yield eng
    finally:
        await eng.close()


async def test_full_disk_spills_recall_answers_and_replay_stores_each_event_once(
    engine: MemoryEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spill_path = tmp_path / "test.db.spill.jsonl"
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(spill_path))
    for i in range(5):  # what is stored before the disk fills
        await d.handle(msg(GENERAL, f"s{i}", "Ann", f"the canoe budget is {i} hundred", i))
    await engine.embed_pending()
    assert await fill_to_the_brim(engine) > 0
    rows_full = await all_rows(engine)

    with caplog.at_level(logging.WARNING):
        for event in fifty():
            await d.handle(event)
    assert await all_rows(engine) == rows_full  # nothing stored
    assert await live_ids(engine) == [f"s{i}" for i in range(5)]
    # the delete of k1 did not wait behind the spill: it took k1's words out of it (a delete
    # is a forget) and went in at once as an early tombstone (ids only: the one row that
    # still fits), so k1 cannot come back
    assert d.spill is not None and d.spill.count == 48
    kinds = [json.loads(line)["kind"] for line in spill_path.read_text().splitlines()]
    assert kinds == ["message"] * 46 + ["edit", "roster"]
    assert "kayak trip note 1 " not in spill_path.read_text()
    assert spill_path.stat().st_mode & 0o777 == 0o600
    early = await engine.store.db.read(
        "SELECT message_id FROM early_changes WHERE deleted_at IS NOT NULL"
    )
    assert [r[0] for r in early] == ["k1"] and d.stats.handled["delete_unknown"] == 1
    # a clear error: the store's typed error in the log, counted for /metrics
    assert "is full" in caplog.text and "kept MessageEvent k0" in caplog.text
    assert d.stats.errors["store_full"] >= 1 and d.stats.handled["spilled"] == 49
    assert "spill_refused" not in d.stats.errors
    metrics = Metrics()
    metrics.watch(d, {})
    scraped = metrics.render().decode()
    assert 'speakermem_events_rejected_total{reason="error_store_full"}' in scraped
    assert 'speakermem_events_handled_total{outcome="spilled"} 49.0' in scraped

    # /recall keeps answering from what is stored
    answer = await d.recall(recall("what is the canoe budget?"))
    assert not answer.refused and answer.citations
    assert {c.message_id for c in answer.citations} <= {f"s{i}" for i in range(5)}

    # still full: a replay keeps everything in the spill, in order
    assert await d.replay_spill() == 0
    assert d.spill.count == 48

    # restart while full, then space returns: the start-up replay stores all 48 once
    restarted = Dispatcher(engine, RecallPipeline(engine), spill=Spill(spill_path))
    assert restarted.spill is not None and restarted.spill.count == 48
    await space_returns(engine)
    assert await restarted.replay_spill() == 48
    assert restarted.spill.count == 0 and not spill_path.exists()
    expected = ["s0", "s1", "s2", "s3", "s4", "k0", *(f"k{i}" for i in range(2, 47))]
    assert await live_ids(engine) == expected
    assert await all_rows(engine) == rows_full + 46  # k1's delete waits as an early tombstone
    edited = await engine.store.messages.get(GENERAL, "k0")
    assert edited is not None and edited.text == "kayak trip moved to the lake"
    members = {m.user_id for m in await engine.members(GENERAL)}
    assert {"ann", "bo", "cy"} <= members
    assert restarted.stats.handled["spill_replayed"] == 48

    # replaying again, even the same events again (a crash before they left the spill),
    # doubles nothing
    assert await restarted.replay_spill() == 0
    for event in fifty():
        await asyncio.to_thread(restarted.spill.append, event)  # type: ignore[arg-type]
    assert await restarted.replay_spill() == 50
    assert await live_ids(engine) == expected
    assert await all_rows(engine) == rows_full + 47  # k1 now stays as its tombstone
    edited = await engine.store.messages.get(GENERAL, "k0")
    assert edited is not None and edited.text == "kayak trip moved to the lake"
    hits = await engine.search("lake", [GENERAL], mode="lexical")
    assert [h.message.message_id for h in hits] == ["k0"]
    assert await engine.search("paddles", [GENERAL], mode="lexical", limit=100) != []


async def test_events_queue_behind_the_spill_and_the_periodic_retry_drains_it(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    d = Dispatcher(
        engine, RecallPipeline(engine), spill=Spill(tmp_path / "spill.jsonl"), spill_retry_s=0.05
    )
    await fill_to_the_brim(engine)
    await d.handle(msg(GENERAL, "a", "Ann", "first", 1))
    assert d.spill is not None and d.spill.count == 1
    await space_returns(engine)
    # within the retry interval a new event goes behind the waiting one, keeping order
    await d.handle(msg(GENERAL, "b", "Ann", "second", 2))
    assert d.spill.count == 2 and await live_ids(engine) == []
    task = asyncio.create_task(d.replay_spill_every(0.05))
    try:
        for _ in range(100):
            if not d.spill.count:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert d.spill.count == 0 and await live_ids(engine) == ["a", "b"]
    await asyncio.sleep(0.06)  # past the retry interval the next event replays first
    await d.handle(msg(GENERAL, "c", "Ann", "third", 3))
    assert await live_ids(engine) == ["a", "b", "c"]


async def test_a_full_spill_refuses_loudly_and_the_cap_is_a_setting(
    engine: MemoryEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db_path = tmp_path / "test.db"
    defaults = Settings(_env_file=None, db_path=db_path)  # type: ignore[call-arg]
    assert build_spill(defaults).path == tmp_path / "test.db.spill.jsonl"
    elsewhere = Settings(_env_file=None, db_path=db_path, spill_path=tmp_path / "x" / "s.jsonl")  # type: ignore[call-arg]
    assert build_spill(elsewhere).path == tmp_path / "x" / "s.jsonl"

    await fill_to_the_brim(engine)
    refused: dict[int, int] = {}
    for cap in (2_000, 4_000):
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            db_path=db_path,
            spill_path=tmp_path / f"cap{cap}.jsonl",
            spill_max_bytes=cap,
        )
        d = Dispatcher(engine, RecallPipeline(engine), spill=build_spill(settings))
        with caplog.at_level(logging.ERROR):
            for event in fifty():
                await d.handle(event)
        assert d.spill is not None and 0 < d.spill.count < 50
        assert d.spill.size_bytes <= cap
        refused[cap] = d.stats.errors["spill_refused"]
        forgotten = d.stats.handled["spill_forgotten"]  # k1's create, taken out by its delete
        turned_away = sum(d.stats.ignored.values())  # k1's create, its tombstone already there
        applied = d.stats.handled["delete_unknown"]  # the delete went in (an early tombstone)
        # the first pass spills k1 and its delete takes it out again; the second pass finds
        # the first one's tombstone and keeps no copy of k1 at all
        assert (forgotten, turned_away) == ((1, 0) if cap == 2_000 else (0, 1))
        assert applied == 1
        # each event kept or refused (or forgotten, turned away, or applied), none lost
        assert refused[cap] == 50 - d.spill.count - forgotten - turned_away - applied
    assert refused[2_000] > refused[4_000] > 0
    assert caplog.text.count("NOT STORED, refused") == refused[2_000] + refused[4_000]


def test_spill_file_survives_a_torn_line_and_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    spill = Spill(path, cap_bytes=10_000)
    spill.append(msg(GENERAL, "a", "Ann", "one", 1))
    spill.append(msg(GENERAL, "b", "Ann", "two", 2))
    with path.open("ab") as fh:
        fh.write(b'{"kind": "bogus", "event": {}}\n{"kind": "mess')  # a bad line, a torn one
    again = Spill(path, cap_bytes=10_000)
    assert again.count == 3 and path.read_bytes().endswith(b"\n")
    events = again.read()
    assert [getattr(e, "message_id", None) for e in events] == ["a", "b", None]
    again.drop_first(1)
    assert again.count == 2 and [getattr(e, "message_id", None) for e in again.read()] == [
        "b",
        None,
    ]
    with pytest.raises(SpillFull):
        Spill(path, cap_bytes=again.size_bytes + 10).append(msg(GENERAL, "c", "Ann", "x", 3))
