"""Several processes on one PostgreSQL store: shared channels and rosters, the ingest lock,
segment ids (split from test_pg_database.py, whose helpers it shares)."""

from __future__ import annotations

import asyncio

import pytest

from speakermem.memory.store import Store, StoreBusy, make_store
from tests.test_pg_database import (
    config,
    opened,
)


async def test_two_processes_share_channels_and_rosters(pg_url: str) -> None:
    """Two stores (two pools: two processes' sessions) create the same new channel and
    sync its roster at the same time: one channel row, one id, every member once."""
    from speakermem.memory.models import Scope

    stores = [make_store(config(pg_url), gap_seconds=60, window=5) for _ in range(2)]
    for store in stores:
        await store.open()
    try:
        scope = Scope(platform="t", workspace="w", channel="c")
        listed: list[tuple[str, str | None, bool]] = [
            (f"u{i}", f"User {i}", False) for i in range(1500)
        ]

        async def ensure(store: Store) -> int:
            async with store.db.transaction() as tx:
                return await store.channels.ensure(tx, scope)

        pks = await asyncio.gather(*(ensure(s) for s in stores))
        assert pks[0] == pks[1]
        await asyncio.gather(
            stores[0].channels.sync_members(scope, listed[:1000], at=10.0),
            stores[1].channels.sync_members(scope, listed[500:], at=10.0),
        )
        assert await stores[0].db.read("SELECT count(*) FROM channels") == [(1,)]
        rows = await stores[0].db.read(
            "SELECT user_id, count(*) FROM roster GROUP BY user_id HAVING count(*) > 1"
        )
        assert rows == []
        users = await stores[1].db.read("SELECT count(*) FROM users")
        assert users == [(1500,)]
        members = await stores[1].channels.members(scope, include_left=True)
        assert {m.user_id for m in members} == {uid for uid, _, _ in listed}
        # both rename everyone, listing them in opposite orders: row locks taken crosswise
        # would deadlock one of them; both go through
        renamed: list[tuple[str, str | None, bool]] = [
            (uid, f"Renamed {uid}", bot) for uid, _, bot in listed
        ]
        await asyncio.gather(
            stores[0].channels.sync_members(scope, renamed, at=20.0),
            stores[1].channels.sync_members(scope, renamed[::-1], at=20.0),
        )
        names = await stores[0].db.read("SELECT DISTINCT display_name LIKE 'Renamed %' FROM users")
        assert names == [(True,)]
    finally:
        for store in stores:
            await store.close()


async def test_the_ingest_lock_orders_one_channel_and_lets_others_through(pg_url: str) -> None:
    """A transaction holding channel c's ingest lock makes another process wait for c (past
    the wait: StoreBusy), not for channel d; once it commits, c is free again."""
    holder, other = await opened(pg_url), await opened(pg_url, lock_wait_s=0.3)
    c, d = ("t", "w", "c"), ("t", "w", "d")
    try:
        async with holder.transaction() as held:
            await held.ingest_lock([c])
            async with other.transaction() as tx:
                await tx.ingest_lock([d, d])
            with pytest.raises(StoreBusy):
                async with other.transaction() as tx:
                    await tx.ingest_lock([d, c])
        async with other.transaction() as tx:
            await tx.ingest_lock([c, d])
    finally:
        await holder.close()
        await other.close()


async def test_segment_ids_come_after_those_stored_by_max_plus_one(pg_url: str) -> None:
    """Before the per-channel lock, ingest wrote segment ids as max(id) + 1 and left the
    identity sequence at its start; the migration moves the sequence past them, so ids
    reserved now never collide with stored ones."""
    from speakermem.memory.store.pg.schema import SEGMENT_ID_SEQUENCE

    db = await opened(pg_url)
    try:
        async with db.transaction() as tx:
            pk = await tx.insert(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES ('t', 'w', 'c', 1)"
            )
            await tx.execute(  # as the old ingest wrote it
                "INSERT INTO segments (id, channel_pk, platform, workspace, channel, state,"
                " n_messages, opened_at, last_message_at) VALUES (40, ?, 't', 'w', 'c', 'pending',"
                " 1, 1, 1)",
                (pk,),
            )
            await tx.executescript_in_tx(SEGMENT_ID_SEQUENCE)
            ids = await tx.reserve_ids("segments", 3)
        assert len(set(ids)) == 3 and min(ids) > 40
    finally:
        await db.close()


async def test_two_processes_ingest_shared_and_own_channels_side_by_side(pg_url: str) -> None:
    """Two stores (two processes' pools) ingest batches at once, into channels of their own
    and into one they share: every message stored once, each channel's turns numbered
    without gap or repeat, its segments partition its messages with at most one open."""
    from speakermem.memory.models import Scope
    from tests.conftest import msg

    stores = [make_store(config(pg_url), gap_seconds=600, window=7) for _ in range(2)]
    for store in stores:
        await store.open()
    shared = Scope(platform="t", workspace="w", channel="shared")
    own = [Scope(platform="t", workspace="w", channel=f"own{i}") for i in range(2)]

    async def writer(i: int) -> None:
        for b in range(12):
            batch = [
                msg(scope, f"{scope.channel}-{i}-{b}-{k}", f"U{i}", f"hello {k}", b * 10 + k)
                for scope in (shared, own[i])
                for k in range(5)
            ]
            await stores[i].messages.ingest(batch, channel_default=True)

    try:
        await asyncio.gather(writer(0), writer(1))
        db = stores[0].db
        counts = await db.read(
            "SELECT c.channel, count(*), count(DISTINCT (m.session_id, m.turn_index)),"
            " min(m.turn_index), max(m.turn_index) FROM messages m"
            " JOIN channels c ON c.id = m.channel_pk GROUP BY c.channel ORDER BY c.channel"
        )
        assert [tuple(r) for r in counts] == [
            ("own0", 60, 60, 0, 59),
            ("own1", 60, 60, 0, 59),
            ("shared", 120, 120, 0, 119),
        ]
        sums = await db.read(
            "SELECT s.channel_pk, sum(s.n_messages), count(*) FILTER (WHERE s.state = 'open'),"
            " (SELECT count(*) FROM messages m WHERE m.channel_pk = s.channel_pk)"
            " FROM segments s GROUP BY s.channel_pk"
        )
        assert len(sums) == 3
        for _pk, in_segments, open_segments, messages in sums:
            assert in_segments == messages and open_segments <= 1
        stray = await db.read(
            "SELECT count(*) FROM messages m JOIN segments s ON s.id = m.segment_id"
            " WHERE s.channel_pk <> m.channel_pk"
        )
        assert stray == [(0,)]
    finally:
        for store in stores:
            await store.close()
