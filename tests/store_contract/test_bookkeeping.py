"""The store's bookkeeping through the protocol: catch-up cursors, reconciliation's reads,
tombstones, forgets in progress, job locks."""

from __future__ import annotations

from speakermem.memory.models import Scope
from speakermem.memory.store import Store
from tests.conftest import msg
from tests.store_contract.conftest import at, record

GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")
OTHER_WS = Scope(platform="test", workspace="w2", channel="general")


async def test_catchup_cursors_resume_where_a_run_stopped(store: Store) -> None:
    await store.messages.ingest(
        [msg(GENERAL, "a", "Al", "one", 0), msg(GENERAL, "b", "Al", "two", 5)],
        channel_default=True,
    )
    await store.channels.set_meta(GENERAL, name="general", is_private=False)
    newest = await store.catchup.newest("test")
    assert newest == {GENERAL: ("b", at(5), "general")}
    assert await store.catchup.newest("test", "w2") == {}
    await store.catchup.save(
        GENERAL, "catchup", cursor_id="a", cursor_ts=at(0), fetched=1, finished=False
    )
    await store.catchup.save(
        GENERAL, "catchup", cursor_id="b", cursor_ts=at(5), fetched=2, finished=True
    )
    await store.catchup.save(
        RANDOM,
        "reconcile",
        cursor_id=None,
        cursor_ts=None,
        fetched=0,
        finished=False,
        detail={"todo": [[1, 2]]},
    )
    (cur,) = await store.catchup.cursors("test")
    assert (cur.scope, cur.cursor_id, cur.fetched, cur.finished) == (GENERAL, "b", 2, True)
    kept = await store.catchup.cursor(RANDOM, "reconcile")
    assert kept is not None and kept.detail == {"todo": [[1, 2]]}
    assert await store.catchup.cursor(RANDOM, "catchup") is None


async def test_reconciliation_reads_a_channels_window_and_threads(store: Store) -> None:
    await store.messages.ingest(
        [
            msg(GENERAL, "a", "Al", "one", 0),
            msg(GENERAL, "b", "Al", "two", 10, thread_id="t1"),
            msg(GENERAL, "c", "Al", "three", 20, thread_id="t1"),
        ],
        channel_default=True,
    )
    rows = await store.reconcile.window(GENERAL, at(5), at(20))
    assert [r.message_id for r in rows] == ["c", "b"]  # newest first
    assert rows[0].thread_id == "t1" and rows[0].text == "three"
    assert await store.reconcile.count(GENERAL, at(0), at(20)) == 3
    assert [mid for _, mid in await store.reconcile.thread_messages(GENERAL, "t1")] == ["b", "c"]


async def test_a_tombstone_keeps_a_forgotten_person_out_until_lifted(store: Store) -> None:
    await store.messages.ingest(
        [msg(GENERAL, "a", "Alice Smith", "hi", 0), msg(GENERAL, "b", "Bob", "hi Alice", 1)],
        channel_default=True,
    )
    (rid,) = await store.records.add_records(
        GENERAL, [record("Bob greeted someone", owner="bob", from_ids=("b",))], None
    )
    (naming,) = await store.records.add_records(
        GENERAL,
        [record("Bob greeted Alice Smith", owner="bob", from_ids=("b",), event="Alice Smith")],
        None,
    )
    names = await store.tombstones.names_of("test", "w1", "alice smith")
    assert names == {"Alice Smith"}
    keys = await store.tombstones.bury("test", "w1", "alice smith", names)
    assert keys
    assert await store.tombstones.is_forgotten("test", "w1", "alice smith")
    assert not await store.tombstones.is_forgotten("test", "w2", "alice smith")
    assert await store.tombstones.count("test", "w1") == 1
    (out,) = await store.messages.ingest(
        [msg(GENERAL, "c", "Alice Smith", "back again", 2)], channel_default=True
    )
    assert out.status.refused
    # a record naming the forgotten person, committed after the tombstone, is dropped
    assert (
        await store.records.add_records(
            GENERAL,
            [record("Bob met Alice Smith", owner="bob", from_ids=("b",), event="Alice Smith")],
            None,
        )
        == []
    )
    assert await store.tombstones.records_naming("test", "w1", keys) == [naming]
    assert await store.tombstones.records_naming("test", "w1", keys, exclude=[naming]) == []
    assert rid != naming
    assert await store.tombstones.lift("test", "w1", "alice smith")
    assert not await store.tombstones.lift("test", "w1", "alice smith")
    assert await store.tombstones.count() == 0


async def test_a_forget_in_progress_stays_open_until_done(store: Store) -> None:
    first = await store.forget_jobs.start("test", "w1", "forget-user", "alice", "admin", {"a": 1})
    await store.forget_jobs.failed(first, "disk full")
    await store.forget_jobs.retried(first)
    second = await store.forget_jobs.start("test", "w1", "forget-user", "alice", "admin", {})
    other = await store.forget_jobs.start("test", "w2", "forget-user", "bob", "admin", {})
    opened = await store.forget_jobs.open("test", "w1")
    assert [(j.id, j.attempts, j.last_error) for j in opened] == [
        (first, 2, "disk full"),
        (second, 1, None),
    ]
    assert opened[0].args == {"a": 1}
    await store.forget_jobs.done(second)  # closes the earlier run of the same forget too
    assert [j.id for j in await store.forget_jobs.open()] == [other]


async def test_a_job_lock_lets_the_job_run(store: Store) -> None:
    async with store.locks.try_job("retention") as got:
        assert got
    async with store.locks.try_job("retention") as again:  # released after the job
        assert again
