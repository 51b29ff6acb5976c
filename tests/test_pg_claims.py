"""Writer workers claim segments with a lease (issue 13), on both backends.

Each test opens two stores on one database, as two worker processes would: on PostgreSQL
two connection pools whose transactions really overlap (the claim locks rows with FOR
UPDATE SKIP LOCKED), on SQLite two connections to one file (BEGIN IMMEDIATE serialises
them). Segments (and the one message the records cite) are inserted as rows directly, so
the claims are tested apart from ingestion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Layer, MessageEvent, NewRecord, RecordScope, Scope
from speakermem.memory.store import LeaseLost, Store, WriterRunLog, make_store
from speakermem.memory.writer.runner import Writer
from tests.conftest import T0, make_config
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, LLMServer, Reply

pytestmark = pytest.mark.contract

LEASE = 60.0


def _store(tmp_path: Path) -> Store:
    cfg = make_config(tmp_path)
    return make_store(cfg.store, gap_seconds=1800.0, window=20)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    a = _store(tmp_path)
    await a.open()
    b = _store(tmp_path)
    await b.open()
    try:
        yield a, b
    finally:
        await b.close()
        await a.close()


def _scope(i: int) -> Scope:
    return Scope(platform="test", workspace="w1", channel=f"c{i}")


async def _pending(store: Store, channels: int, per_channel: int) -> list[int]:
    """`per_channel` pending segments in each of `channels` channels, interleaved (ids
    alternate between channels, as busy channels' segments do); their ids."""
    ids: list[int] = []
    now = time.time() - 3600
    async with store.db.transaction() as tx:
        pks = [await store.channels.ensure(tx, _scope(c)) for c in range(channels)]
        for c, pk in enumerate(pks):  # the message `_record`s cite (records cite live ones)
            await tx.execute(
                "INSERT INTO messages (channel_pk, platform, workspace, channel, message_id,"
                " speaker_id, speaker_name, text, ts, session_id, turn_index)"
                " VALUES (?, ?, ?, ?, 'm1', 'alice', 'Alice', 'I like tea and coffee', ?, 0, 0)",
                (pk, *_scope(c).key(), now),
            )
        for _ in range(per_channel):
            for c, pk in enumerate(pks):
                ids.append(
                    await tx.insert(
                        "INSERT INTO segments (channel_pk, platform, workspace, channel, state,"
                        " n_messages, opened_at, last_message_at, closed_at)"
                        " VALUES (?, ?, ?, ?, 'pending', 1, ?, ?, ?)",
                        (pk, *_scope(c).key(), now, now, now),
                    )
                )
    return ids


async def _write(store: Store, worker_id: str, segment_id: int, scope: Scope) -> list[int]:
    """What a worker does when its LLM call returns: commit (no records here)."""
    run = WriterRunLog(model="m", prompt_version="v", started_at=time.time())
    return await store.records.commit_segment(segment_id, scope, [], None, run, worker_id=worker_id)


async def _states(store: Store) -> dict[int, str]:
    return {r[0]: r[1] for r in await store.db.read("SELECT id, state FROM segments")}


def _record(text: str) -> NewRecord:
    return NewRecord(
        layer=Layer.CORE,
        record_scope=RecordScope.PERSON,
        content=text,
        source="alice",
        owner="alice",
        event="",
        time=T0,
        session_id=None,
        from_ids=("m1",),
        writer_model="m",
        prompt_version="v",
    )


async def _contents(store: Store) -> list[str]:
    return [r[0] for r in await store.db.read("SELECT content FROM records ORDER BY id")]


async def _claim_row(store: Store, segment_id: int) -> tuple[object, ...]:
    row = await store.db.read(
        "SELECT state, claimed_by, lease_until, attempts, next_attempt_at, last_error"
        " FROM segments WHERE id = ?",
        (segment_id,),
    )
    return tuple(row[0])


async def test_two_claimers_never_get_the_same_segment(workers: tuple[Store, Store]) -> None:
    a, b = workers
    ids = await _pending(a, channels=10, per_channel=1)
    got_a, got_b = await asyncio.gather(
        a.segments.claim("worker-a", LEASE, limit=4), b.segments.claim("worker-b", LEASE, limit=4)
    )
    ids_a, ids_b = {s.id for s in got_a}, {s.id for s in got_b}
    assert len(ids_a) == len(ids_b) == 4
    assert not ids_a & ids_b
    # leased segments stay out of later claims: only the two unclaimed ones are left
    rest = await a.segments.claim("worker-a", LEASE, limit=10)
    assert {s.id for s in rest} == set(ids) - ids_a - ids_b
    assert await b.segments.claim("worker-b", LEASE, limit=10) == []
    holders = dict(await a.db.read("SELECT id, claimed_by FROM segments"))
    assert {holders[i] for i in ids_b} == {"worker-b"}


async def test_a_claim_whose_lease_ran_out_is_claimed_again(
    workers: tuple[Store, Store],
) -> None:
    a, b = workers
    (seg_id,) = await _pending(a, channels=1, per_channel=1)
    t0 = time.time()
    (seg,) = await a.segments.claim("worker-a", 30.0, now=t0)
    assert seg.id == seg_id
    assert await b.segments.claim("worker-b", 30.0, now=t0 + 29.0) == []
    # worker-a stalls past its lease (or died): worker-b takes the segment over
    (again,) = await b.segments.claim("worker-b", 30.0, now=t0 + 31.0)
    assert again.id == seg_id
    assert not await a.segments.renew(seg_id, "worker-a", 30.0)
    assert await b.segments.renew(seg_id, "worker-b", 30.0)
    await _write(b, "worker-b", seg_id, seg.scope)
    # the first worker's late commit writes nothing: the segment is done once
    assert await _write(a, "worker-a", seg_id, seg.scope) == []
    assert (await a.db.read("SELECT count(*) FROM writer_runs"))[0][0] == 1
    assert await _states(a) == {seg_id: "done"}
    assert await a.segments.claim("worker-a", 30.0, now=t0 + 1000.0) == []


async def test_two_workers_committing_one_segment_at_once_write_it_once(
    workers: tuple[Store, Store],
) -> None:
    """A lease ran out while its worker was still writing: both workers commit together."""
    a, b = workers
    (seg_id,) = await _pending(a, channels=1, per_channel=1)
    t0 = time.time()
    (seg,) = await a.segments.claim("worker-a", 1.0, now=t0)
    (again,) = await b.segments.claim("worker-b", 1.0, now=t0 + 2.0)
    assert again.id == seg.id

    run = WriterRunLog(model="m", prompt_version="v", started_at=t0)
    got = await asyncio.gather(
        a.records.commit_segment(
            seg_id, seg.scope, [_record("alice likes tea")], None, run, worker_id="worker-a"
        ),
        b.records.commit_segment(
            seg_id, seg.scope, [_record("alice likes coffee")], None, run, worker_id="worker-b"
        ),
        return_exceptions=True,
    )
    # the worker that lost its lease commits nothing, whichever commit ran first (before
    # worker-b's: its claim is gone; after: the segment is done)
    assert isinstance(got[0], LeaseLost) or got[0] == []
    assert isinstance(got[1], list) and len(got[1]) == 1
    assert await _contents(a) == ["alice likes coffee"]
    assert (await a.db.read("SELECT count(*) FROM writer_runs"))[0][0] == 1


async def test_a_channel_is_claimed_in_order_one_segment_at_a_time(
    workers: tuple[Store, Store],
) -> None:
    a, b = workers
    first, second = await _pending(a, channels=1, per_channel=2)
    (seg,) = await a.segments.claim("worker-a", LEASE, limit=5)
    assert seg.id == first
    # the channel's later segment waits while the earlier one is in flight ...
    assert await b.segments.claim("worker-b", LEASE, limit=5) == []
    # ... and while it backs off after a failure (defer also ends the lease)
    assert await a.segments.defer(first, "endpoint down", 3600.0, worker_id="worker-a")
    assert await b.segments.claim("worker-b", LEASE, limit=5) == []
    (retry,) = await b.segments.claim("worker-b", LEASE, now=time.time() + 3601.0)
    assert retry.id == first and retry.attempts == 1
    await _write(b, "worker-b", first, retry.scope)
    (nxt,) = await a.segments.claim("worker-a", LEASE)
    assert nxt.id == second


async def test_release_gives_a_segment_back_at_once(workers: tuple[Store, Store]) -> None:
    a, b = workers
    (seg_id,) = await _pending(a, channels=1, per_channel=1)
    await a.segments.claim("worker-a", LEASE)
    assert not await b.segments.release(seg_id, "worker-b")  # not the holder
    assert await a.segments.release(seg_id, "worker-a")
    assert [s.id for s in await b.segments.claim("worker-b", LEASE)] == [seg_id]


async def test_two_workers_write_every_segment_exactly_once(
    workers: tuple[Store, Store],
) -> None:
    """200 segments over 20 channels, two workers claiming and committing concurrently."""
    ids = await _pending(workers[0], channels=20, per_channel=10)
    written: dict[str, list[int]] = {"worker-a": [], "worker-b": []}
    scope_of: dict[int, Scope] = {}
    for r in await workers[0].db.read("SELECT id, platform, workspace, channel FROM segments"):
        scope_of[r[0]] = Scope(platform=r[1], workspace=r[2], channel=r[3])

    async def worker(store: Store, name: str) -> None:
        idle = 0
        while idle < 3:
            claimed = await store.segments.claim(name, LEASE, limit=3)
            if not claimed:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            for seg in claimed:
                await asyncio.sleep(0.005)  # the LLM call: the other worker claims meanwhile
                await _write(store, name, seg.id, scope_of[seg.id])
                written[name].append(seg.id)

    await asyncio.gather(worker(workers[0], "worker-a"), worker(workers[1], "worker-b"))
    everything = written["worker-a"] + written["worker-b"]
    assert sorted(everything) == sorted(ids)  # each segment once, none lost
    assert written["worker-a"] and written["worker-b"]  # both did work
    assert set((await _states(workers[0])).values()) == {"done"}
    runs = await workers[0].db.read("SELECT segment_id FROM writer_runs ORDER BY id")
    assert sorted(r[0] for r in runs) == sorted(ids)
    # each channel's segments were committed in id order, whichever worker wrote them
    commits = [r[0] for r in runs]
    by_channel: dict[Scope, list[int]] = {}
    for sid in commits:
        by_channel.setdefault(scope_of[sid], []).append(sid)
    assert all(order == sorted(order) for order in by_channel.values())


# ---- a worker that lost its lease never overwrites ----------------------------------------


async def test_a_worker_that_lost_its_lease_changes_nothing_and_the_new_holder_commits_once(
    workers: tuple[Store, Store],
) -> None:
    """worker-a stalls past its lease, worker-b claims the segment; everything worker-a does
    afterwards (defer, release, renew, commit) leaves worker-b's claim and the segment as
    they are, and worker-b's commit is the one that applies."""
    a, b = workers
    (seg_id,) = await _pending(a, channels=1, per_channel=1)
    t0 = time.time()
    (seg,) = await a.segments.claim("worker-a", 30.0, now=t0 - 40.0)  # ran out 10 s ago
    (again,) = await b.segments.claim("worker-b", 30.0, now=t0)
    assert again.id == seg_id
    held_by_b = await _claim_row(a, seg_id)
    assert held_by_b[:2] == ("pending", "worker-b")

    assert not await a.segments.defer(seg_id, "endpoint down", 3600.0, worker_id="worker-a")
    assert not await a.segments.release(seg_id, "worker-a")
    assert not await a.segments.renew(seg_id, "worker-a", 30.0)
    run = WriterRunLog(model="m", prompt_version="v", started_at=t0)
    with pytest.raises(LeaseLost):
        await a.records.commit_segment(
            seg_id, seg.scope, [_record("alice likes tea")], None, run, worker_id="worker-a"
        )
    # worker-b's claim, lease and attempt count are untouched; nothing was written
    assert await _claim_row(b, seg_id) == held_by_b
    assert await _contents(b) == []
    assert (await b.db.read("SELECT count(*) FROM writer_runs"))[0][0] == 0

    ids = await b.records.commit_segment(
        seg_id, seg.scope, [_record("alice likes coffee")], None, run, worker_id="worker-b"
    )
    assert len(ids) == 1
    assert await _states(a) == {seg_id: "done"}
    # a still later commit by worker-a finds the segment done: still one record, one run
    assert (
        await a.records.commit_segment(
            seg_id, seg.scope, [_record("alice likes tea")], None, run, worker_id="worker-a"
        )
        == []
    )
    assert await _contents(a) == ["alice likes coffee"]
    assert (await a.db.read("SELECT count(*) FROM writer_runs"))[0][0] == 1


async def test_a_lapsed_lease_no_one_took_over_is_still_the_workers_own(
    workers: tuple[Store, Store],
) -> None:
    """A lease that ran out only lets another worker claim the segment; until one does, the
    worker that holds it may still defer or commit it."""
    a, _b = workers
    first, second = await _pending(a, channels=2, per_channel=1)
    t0 = time.time()
    segs = await a.segments.claim("worker-a", 30.0, limit=2, now=t0 - 40.0)
    assert [s.id for s in segs] == [first, second]
    assert await a.segments.defer(first, "endpoint down", 60.0, worker_id="worker-a", now=t0)
    state, claimed_by, lease_until, attempts, next_at, error = await _claim_row(a, first)
    assert (state, claimed_by, lease_until, attempts, error) == (
        "pending",
        None,
        None,
        1,
        "endpoint down",
    )
    assert next_at == pytest.approx(t0 + 60.0)
    run = WriterRunLog(model="m", prompt_version="v", started_at=t0)
    ids = await a.records.commit_segment(
        second, segs[1].scope, [_record("alice likes tea")], None, run, worker_id="worker-a"
    )
    assert len(ids) == 1 and (await _states(a))[second] == "done"


async def test_without_a_worker_id_a_live_lease_is_left_alone(
    workers: tuple[Store, Store],
) -> None:
    """The in-process Writer (no claim, no worker id) does not write or defer a segment a
    worker's live lease holds; once that lease ran out it may."""
    a, b = workers
    (seg_id,) = await _pending(a, channels=1, per_channel=1)
    t0 = time.time()
    (seg,) = await b.segments.claim("worker-b", 30.0, now=t0)
    run = WriterRunLog(model="m", prompt_version="v", started_at=t0)
    assert not await a.segments.defer(seg_id, "endpoint down", 60.0, now=t0 + 10.0)
    with pytest.raises(LeaseLost):
        await a.records.commit_segment(seg_id, seg.scope, [_record("alice likes tea")], None, run)
    assert (await _claim_row(a, seg_id))[:4] == ("pending", "worker-b", t0 + 30.0, 0)
    # the lease runs out (worker-b died): the in-process Writer defers it, then writes it
    assert await a.segments.defer(seg_id, "endpoint down", 0.0, now=t0 + 31.0)
    ids = await a.records.commit_segment(seg_id, seg.scope, [_record("alice likes tea")], None, run)
    assert len(ids) == 1 and await _states(a) == {seg_id: "done"}


async def test_a_writer_worker_that_lost_its_lease_logs_it_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole worker path: worker-a's LLM call outlasts its lease without a renewal
    getting through (the process stalled: another worker's clock is past the lease), so
    worker-b claims the segment; worker-a's round ends "lost" with a warning and commits
    nothing, worker-b writes the segment once. The in-process Writer, meanwhile, leaves a
    segment under a live lease alone."""
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    scope = _scope(0)
    try:
        base = time.time() - 300
        for i in range(3):
            await engine.ingest(
                MessageEvent(
                    scope=scope,
                    message_id=f"m{i}",
                    speaker_id="alice",
                    speaker_name="Alice",
                    text=f"message {i} about the trip",
                    ts=datetime.fromtimestamp(base + i, UTC),
                )
            )
        assert await engine.store.segments.close_channel(scope) == 1
        fast = WriterConfig(retry_base_s=0.01, retry_max_s=0.05)
        async with LLMServer() as server:
            arrived = asyncio.Event()

            async def slow(body: dict[str, Any]) -> Reply:
                arrived.set()
                await asyncio.sleep(0.6)  # past the lease: renewals keep worker-a's until...
                return Reply(content="{}")

            server.script(Handler(slow))
            llm = OpenAICompatLLM(server.base_url, "k", "m", 5.0, "json_schema", max_retries=0)
            async with llm:
                writer = Writer(engine, llm, fast)
                task = asyncio.ensure_future(writer.write_claimed("worker-a", lease_s=0.3))
                await asyncio.wait_for(arrived.wait(), 5.0)  # worker-a's call is in flight
                # ... worker-b, whose clock is past that lease (worker-a stalled), claims it
                (seg,) = await engine.store.segments.claim("worker-b", 30.0, now=time.time() + 10.0)
                # the in-process Writer does not touch a segment a live lease holds
                inprocess = await Writer(engine, llm, fast).flush(seg)
                assert inprocess.status == "lost"
                (late,) = await task
                assert late.status == "lost" and late.segment_id == seg.id
                assert await _runs_per_segment(engine) == {}
                done = await Writer(engine, llm, fast).flush(seg, worker_id="worker-b")
        assert done.status == "committed"
        rows = await engine.store.db.read("SELECT state, claimed_by FROM segments")
        assert [tuple(r) for r in rows] == [("done", "worker-b")]
        assert await _runs_per_segment(engine) == {seg.id: 1}
        assert any(
            "not written" in r.getMessage() and "worker-b" in r.getMessage() for r in caplog.records
        )
    finally:
        await engine.close()


async def _runs_per_segment(engine: MemoryEngine) -> dict[int, int]:
    rows = await engine.store.db.read(
        "SELECT segment_id, count(*) FROM writer_runs GROUP BY segment_id"
    )
    return {int(r[0]): int(r[1]) for r in rows}


async def test_due_leaves_out_what_a_live_lease_holds_and_its_channels_later_segments(
    workers: tuple[Store, Store],
) -> None:
    """`due` (the in-process Writer, `speakermem write`) does not offer a segment a worker is
    writing, nor overtake it with the channel's next one; once the lease ran out it does."""
    a, b = workers
    # interleaved: channel 0's two segments are ids[0] and ids[2], channel 1's ids[1] and ids[3]
    ids = await _pending(a, channels=2, per_channel=2)
    t0 = time.time()
    (seg,) = await b.segments.claim("worker-b", 30.0, now=t0)
    assert seg.id == ids[0]
    assert [s.id for s in await a.segments.due(limit=10, now=t0 + 1.0)] == [ids[1], ids[3]]
    assert [s.id for s in await a.segments.due(limit=10, now=t0 + 31.0)] == ids
