"""The interaction graph is kept current in the background, off the /recall path."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg

pytestmark = pytest.mark.contract


async def _addressees(engine: MemoryEngine, scope: Scope, mid: str) -> list[tuple[str, str]]:
    by_id = await engine.store.messages.by_ids(scope, [mid])
    pk = by_id[mid].pk
    return (await engine.store.interactions.addressees([pk])).get(pk, [])


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(5.0):  # the worker must catch up well within this
        while not await check():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.02)


async def test_worker_catches_up_the_backlog_then_follows_new_messages(
    engine: MemoryEngine, scope: Scope
) -> None:
    other = Scope(platform="test", workspace="w1", channel="random")
    # a backlog from before the worker started, in two channels
    await engine.ingest(msg(scope, "a1", "Rachel", "I need a new job", 0))
    await engine.ingest(msg(scope, "a2", "Ross", "Rachel, have you thought about fashion?", 1))
    await engine.ingest(msg(other, "b1", "Monica", "Joey, did you eat my sandwich?", 0))
    await engine.ingest(msg(other, "b2", "Joey", "maybe", 1))
    assert await engine.store.interactions.behind() != []
    engine.start_background_interactions()
    try:
        await _until(lambda: _has(engine, scope, "a2"))
        await _until(lambda: _has(engine, other, "b1"))
        assert await _addressees(engine, scope, "a2") == [("rachel", "vocative")]
        assert await engine.store.interactions.behind() == []
        # a live message is inferred without anyone asking /recall
        await engine.ingest(msg(scope, "a3", "Monica", "Ross, did you feed the monkey?", 2))
        await _until(lambda: _has(engine, scope, "a3"))
        assert await _addressees(engine, scope, "a3") == [("ross", "vocative")]
    finally:
        await engine.stop_background_interactions()
    # stopped: new messages wait for the next pass (or the next /recall's bounded catch-up)
    await engine.ingest(msg(scope, "a4", "Rachel", "Monica, no", 3))
    await asyncio.sleep(0.1)
    assert await _addressees(engine, scope, "a4") == []
    assert await engine.infer_interactions([scope]) == 1
    assert await _addressees(engine, scope, "a4") == [("monica", "vocative")]


async def _has(engine: MemoryEngine, scope: Scope, mid: str) -> bool:
    return bool(await _addressees(engine, scope, mid))


async def test_a_recall_does_not_queue_behind_a_pass_already_reading_the_channel(
    engine: MemoryEngine, scope: Scope
) -> None:
    from speakermem.memory.interactions import interaction_names

    await engine.ingest(msg(scope, "a1", "Rachel", "hello", 0))
    await engine.ingest(msg(scope, "a2", "Ross", "Rachel, hi", 1))
    (pk,) = await engine.channel_pks([scope])
    names = interaction_names(await engine.members(scope))
    lock = engine.store.interactions._locks.setdefault(pk, asyncio.Lock())
    async with lock:  # another pass (the background worker) is reading this channel
        assert await engine.store.interactions.update(pk, names, wait=False) == 0
        waiting = asyncio.create_task(engine.store.interactions.update(pk, names))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the default waits its turn
    assert await waiting == 2
    assert await engine.store.interactions.update(pk, names, wait=False) == 0  # up to date
