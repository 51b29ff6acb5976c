"""The Writer's queue through the protocol: segments close, wait their turn, and are claimed
by leases that run out."""

from __future__ import annotations

from datetime import timedelta

import pytest

from speakermem.memory.models import Scope
from speakermem.memory.store import Store, WriterRunLog
from tests.conftest import T0, msg
from tests.store_contract.conftest import WINDOW

GENERAL = Scope(platform="test", workspace="w1", channel="general")
OTHER = Scope(platform="test", workspace="w1", channel="other")


async def fill(store: Store, scope: Scope, n: int, *, start: float = 0, step: float = 0.1) -> None:
    await store.messages.ingest(
        [msg(scope, f"{scope.channel}{i}", "Al", f"t{i}", start + i * step) for i in range(n)],
        channel_default=True,
    )


async def test_segments_close_at_the_window_and_when_idle(store: Store) -> None:
    await fill(store, GENERAL, 2 * WINDOW + 2)
    counts = await store.segments.counts()
    assert counts["segments_pending"] == 2 and counts["segments_open"] == 1
    due = await store.segments.due(limit=10)
    assert [s.n_messages for s in due] == [WINDOW, WINDOW]
    assert [m.message_id for m in await store.messages.in_segment(due[0].id)] == [
        f"general{i}" for i in range(WINDOW)
    ]
    closed = await store.segments.close_idle(60, now=(T0 + timedelta(hours=2)).timestamp())
    assert closed == 1
    assert (await store.segments.counts())["segments_open"] == 0
    assert await store.segments.defer(due[0].id, "endpoint down", 3600)
    # a segment backing off holds back its channel's later segments (order is kept) ...
    assert await store.segments.due(limit=10) == []
    later = await store.segments.due(limit=10, now=(T0 + timedelta(days=3650)).timestamp())
    assert [s.id for s in later] == [due[0].id, due[1].id, due[1].id + 1]
    assert later[0].attempts == 1 and later[0].last_error == "endpoint down"
    # ... but not another channel's
    await fill(store, OTHER, WINDOW)
    assert [s.scope for s in await store.segments.due(limit=10)] == [OTHER]


async def test_the_backlog_sums_up_the_pending_segments(store: Store) -> None:
    assert await store.segments.backlog() == (0, 0, None, None)
    await fill(store, GENERAL, 2 * WINDOW + 2, step=1)
    await fill(store, OTHER, WINDOW, start=100, step=1)
    due = await store.segments.due(limit=10)
    assert len(due) == 3  # two in GENERAL, one in OTHER; GENERAL's third is open
    await store.segments.defer(due[1].id, "endpoint down", 60, now=1_000.0)
    await store.segments.defer(due[2].id, "endpoint down", 30, now=1_000.0)
    backlog = await store.segments.backlog()
    assert backlog.pending == 3 and backlog.deferred == 2
    assert backlog.oldest_opened_at == pytest.approx(due[0].opened_at.timestamp(), abs=1e-3)
    assert backlog.earliest_retry_at == 1_030.0


async def test_claims_are_leases_one_segment_of_a_channel_at_a_time(store: Store) -> None:
    await fill(store, GENERAL, 2 * WINDOW)
    await fill(store, OTHER, WINDOW)
    first = await store.segments.claim("w1", 60, limit=5, now=1_000.0)
    # each channel's oldest pending segment only: nothing overtakes one in flight
    assert [s.scope for s in first] == [GENERAL, OTHER]
    assert await store.segments.claim("w2", 60, limit=5, now=1_010.0) == []
    assert await store.segments.renew(first[0].id, "w1", 60, now=1_050.0)
    assert not await store.segments.renew(first[0].id, "w2", 60, now=1_050.0)
    # OTHER's lease ran out at 1,060: another worker takes it; GENERAL's was renewed
    taken = await store.segments.claim("w2", 60, limit=5, now=1_070.0)
    assert [s.id for s in taken] == [first[1].id]
    assert not await store.segments.release(first[1].id, "w1")  # w1 lost it
    assert not await store.segments.defer(first[1].id, "late", 10, worker_id="w1", now=1_080.0)
    assert await store.segments.release(first[1].id, "w2")
    again = await store.segments.claim("w3", 60, limit=5, now=1_080.0)
    assert [s.id for s in again] == [first[1].id]
    # a done segment lets its channel's next one be claimed
    done = WriterRunLog(model="test", prompt_version="v", started_at=0)
    await store.records.commit_segment(first[0].id, GENERAL, [], None, done, worker_id="w1")
    nxt = await store.segments.claim("w1", 60, limit=5, now=1_090.0)
    assert [s.scope for s in nxt] == [GENERAL] and nxt[0].id != first[0].id
