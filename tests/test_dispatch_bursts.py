"""Bursts of new messages are stored in one transaction with the same outcome as one by one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract

ON = Scope(platform="test", workspace="w1", channel="general")
OFF = Scope(platform="test", workspace="w1", channel="quiet")
# same channel name and member in another workspace: memory on (default), not opted out
ELSEWHERE = Scope(platform="test", workspace="w2", channel="quiet")


def _events() -> list[MessageEvent]:
    events = [
        msg(ON, f"m{i}", ["Ann", "Bob", "Cy"][i % 3], f"note number {i} on the plan", i)
        for i in range(12)
    ]
    events.insert(3, msg(ON, "bot1", "Helper", "I am a bot", 3.5, speaker_is_bot=True))
    events.insert(5, msg(ON, "out1", "Olive", "an opted-out member speaks", 4.5))
    events.insert(7, msg(OFF, "q1", "Ann", "memory is off in this channel", 5.5))
    events.insert(8, msg(ELSEWHERE, "w2q", "Olive", "olive speaks in another workspace", 5.7))
    events.append(events[1])  # a duplicate delivery
    return events


async def _state(tmp_path: Path, name: str, batched: bool) -> tuple[Any, ...]:
    engine = await MemoryEngine.open(make_config(tmp_path / name), HashEmbedder())
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        await dispatcher.governance.set_channel(OFF, False, actor="test")
        await dispatcher.governance.opt_out("test", "w1", "olive", forget=False, actor="test")
        events = _events()
        if batched:
            await dispatcher.handle_many(events)
        else:
            for event in events:
                await dispatcher.handle(event)
        rows = await engine.store.db.read(
            "SELECT m.message_id, m.speaker_id, m.text, m.session_id, m.turn_index, m.segment_id"
            " FROM messages m JOIN channels c ON c.id = m.channel_pk"
            " ORDER BY c.workspace, c.channel, m.id"  # a burst is stored channel by channel
        )
        return (
            [tuple(r) for r in rows],
            dict(dispatcher.stats.handled),
            dict(dispatcher.stats.ignored),
            await engine.search("plan", [ON], limit=20),
        )
    finally:
        await engine.close()


async def test_a_burst_ends_like_the_same_messages_one_by_one(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one = await _state(tmp_path, "one", batched=False)
    many = await _state(tmp_path, "many", batched=True)
    expected = [f"m{i}" for i in range(12)] + ["w2q"]
    assert [r[0] for r in many[0]] == expected  # in order in each channel, nothing else
    assert many[0] == one[0]  # same rows, sessions, turns and segments
    assert many[1] == one[1] == {"message_stored": 13, "message_duplicate": 1}
    assert many[2] == one[2] == {"bot_message": 1, "opted_out": 1, "channel_off": 1}
    assert [h.message.message_id for h in many[3]] == [h.message.message_id for h in one[3]]


async def test_a_burst_reads_its_filters_per_workspace_not_per_message(
    tmp_path: Path,
) -> None:
    engine = await MemoryEngine.open(make_config(tmp_path / "q"), HashEmbedder())
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        await dispatcher.governance.set_channel(OFF, False, actor="test")
        await dispatcher.governance.opt_out("test", "w1", "olive", forget=False, actor="test")
        # the admission gate reads the policy in the ingest transaction: count its queries
        policy = engine.store.channels.policy
        calls: list[str] = []
        original = policy._rows

        async def counted(tx: Any, sql: str, params: Any) -> Any:
            if "store_secrets" not in sql:  # the tombstone key is read once per process
                calls.append("switches" if "channel_policy" in sql else "people")
            return await original(tx, sql, params)

        policy._rows = counted  # type: ignore[method-assign]
        await dispatcher.handle_many(_events())
        # two workspaces: one switch query and one opt-out/tombstone query each, none per
        # message
        assert sorted(calls) == ["people"] * 2 + ["switches"] * 2
        rows = await engine.store.db.read("SELECT message_id FROM messages")
        stored = {r[0] for r in rows}
        assert "w2q" in stored and "out1" not in stored and "q1" not in stored
    finally:
        await engine.close()


async def test_a_failed_burst_is_applied_one_by_one(tmp_path: Path) -> None:
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        real = engine.ingest_many
        calls = 0

        async def failing_once(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("the batch's transaction failed")
            return await real(*args, **kwargs)

        engine.ingest_many = failing_once  # type: ignore[method-assign]
        events = [msg(ON, f"m{i}", "Ann", f"text {i}", i) for i in range(5)]
        await dispatcher.handle_many(events)
        stored = await engine.store.messages.by_ids(ON, [f"m{i}" for i in range(5)])
        assert sorted(stored) == [f"m{i}" for i in range(5)]
        assert dispatcher.stats.handled["message_stored"] == 5
    finally:
        await engine.close()


async def test_concurrent_handlers_share_transactions_and_store_each_message_once(
    tmp_path: Path,
) -> None:
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        real = engine.ingest_many
        batches: list[int] = []
        writing, release = asyncio.Event(), asyncio.Event()

        async def counted(events: Any, **kwargs: Any) -> Any:
            batches.append(len(events))
            writing.set()
            await release.wait()  # a write takes a while: arrivals meanwhile group up
            return await real(events, **kwargs)

        engine.ingest_many = counted  # type: ignore[method-assign]
        events = [msg(ON, f"m{i}", "Ann", f"text {i}", i) for i in range(120)]
        events.append(events[7])  # a duplicate delivery among them
        # the first wave arrives together and goes as one batch; the second arrives while
        # that batch is being written and goes together in the next one
        first = [asyncio.create_task(dispatcher.handle_grouped(e)) for e in events[:60]]
        await asyncio.wait_for(writing.wait(), 30)
        second = [asyncio.create_task(dispatcher.handle_grouped(e)) for e in events[60:]]
        for _ in range(5):
            await asyncio.sleep(0)  # let the second wave join the queue
        assert not any(t.done() for t in first)  # nobody returns before their batch is written
        release.set()
        await asyncio.wait_for(asyncio.gather(*first, *second), 60)
        stored = await engine.store.messages.by_ids(ON, [f"m{i}" for i in range(120)])
        assert len(stored) == 120
        assert (await engine.store.messages.counts())["messages"] == 120
        assert dispatcher.stats.handled == {"message_stored": 120, "message_duplicate": 1}
        assert batches == [60, 61]  # two transactions for 121 deliveries
    finally:
        await engine.close()


async def test_a_cancelled_handler_strands_nobody(tmp_path: Path) -> None:
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        events = [msg(ON, f"m{i}", "Ann", f"text {i}", i) for i in range(10)]
        tasks = [asyncio.create_task(dispatcher.handle_grouped(e)) for e in events]
        await asyncio.sleep(0)  # all of them have handed their message in
        tasks[0].cancel()  # e.g. the request that started the batch went away
        await asyncio.gather(*tasks[1:])
        stored = await engine.store.messages.by_ids(ON, [f"m{i}" for i in range(10)])
        assert sorted(stored) == sorted(f"m{i}" for i in range(10))  # m0 as well
    finally:
        await engine.close()
