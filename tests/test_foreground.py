"""A member waiting on /recall comes before background work (embedding, the graph worker),
and /recall never waits on the write lock while the graph worker runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg

pytestmark = pytest.mark.contract


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(5.0):
        while not await check():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.02)


async def _unembedded(engine: MemoryEngine) -> int:
    return (await engine.store.messages.counts())["unembedded"]


async def _fill(engine: MemoryEngine, scope: Scope, n: int) -> None:
    for i in range(n):
        await engine.ingest(msg(scope, f"m{i}", "Rachel", f"the launch review moved, note {i}", i))


async def test_background_embedding_waits_while_a_recall_is_in_flight(
    engine: MemoryEngine, scope: Scope
) -> None:
    engine.foreground.max_defer_s = 60.0
    await _fill(engine, scope, 5)
    async with engine.foreground.serving():
        engine.start_background_embedding()
        await asyncio.sleep(0.3)
        assert await _unembedded(engine) == 5  # nothing embedded while the member waits
        assert engine.foreground.deferrals >= 1
    await _until(lambda: _is(engine, 0))  # and all of it once the /recall is done
    await engine.stop_background_embedding()


async def test_background_work_is_deferred_at_most_max_defer(
    engine: MemoryEngine, scope: Scope
) -> None:
    engine.foreground.max_defer_s = 0.05
    await _fill(engine, scope, 40)
    async with engine.foreground.serving():  # a /recall that never ends
        engine.start_background_embedding()
        # batches of 16, one per deferral: everything embedded all the same
        await _until(lambda: _is(engine, 0))
    await engine.stop_background_embedding()
    assert engine.foreground.deferrals >= 3


async def _is(engine: MemoryEngine, n: int) -> bool:
    return await _unembedded(engine) == n


async def test_recall_marks_itself_foreground(engine: MemoryEngine, scope: Scope) -> None:
    await _fill(engine, scope, 3)
    seen: list[int] = []
    store_search = engine.store.messages.lexical

    async def spy(*args: object, **kwargs: object) -> object:
        seen.append(engine.foreground.active)
        return await store_search(*args, **kwargs)  # type: ignore[arg-type]

    engine.store.messages.lexical = spy  # type: ignore[method-assign]
    await RecallPipeline(engine).run(RecallRequest("what about the launch review?", scope))
    assert seen and all(n == 1 for n in seen)
    assert engine.foreground.active == 0


async def test_recall_does_not_wait_on_the_write_lock_while_the_graph_worker_runs(
    engine: MemoryEngine, scope: Scope
) -> None:
    engine.start_background_interactions()
    try:
        engine.foreground.max_defer_s = 60.0
        async with engine.foreground.serving():
            # new messages the (deferred) graph worker has not read yet
            await _fill(engine, scope, 6)
            assert await engine.store.interactions.behind() != []
            release = asyncio.Event()
            held = asyncio.Event()

            async def hold_write_lock() -> None:
                async with engine.store.db.transaction():  # e.g. a big ingest burst
                    held.set()
                    await release.wait()

            holder = asyncio.create_task(hold_write_lock())
            await held.wait()
            try:
                async with asyncio.timeout(3.0):
                    result = await RecallPipeline(engine).run(
                        RecallRequest("what about the launch review?", scope)
                    )
            finally:
                release.set()
                await holder
        assert result.answer.citations
    finally:
        await engine.stop_background_interactions()


async def test_without_the_graph_worker_recall_catches_the_graph_up_itself(
    engine: MemoryEngine, scope: Scope
) -> None:
    await _fill(engine, scope, 6)
    assert await engine.store.interactions.behind() != []
    await RecallPipeline(engine).run(RecallRequest("what about the launch review?", scope))
    assert await engine.store.interactions.behind() == []


async def test_minilm_question_does_not_queue_behind_a_batch() -> None:
    from speakermem.integrations.embeddings import minilm

    try:
        minilm.locate_model_dir()
    except minilm.EmbedderUnavailable:
        pytest.skip("all-MiniLM-L6-v2 weights not installed")
    emb = minilm.MiniLMEmbedder()
    emb.load()
    release = threading.Event()
    # occupy every background thread as long background batches would
    loop = asyncio.get_running_loop()
    busy = [loop.run_in_executor(emb._executor, release.wait, 60.0) for _ in range(emb.threads)]
    try:
        async with asyncio.timeout(30.0):
            vec = await emb.embed_query("when is the launch review?")
        assert vec.shape == (384,)
        assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4
        assert not any(b.done() for b in busy)  # the batch threads were taken all along
    finally:
        release.set()
        await asyncio.gather(*busy)
        emb.close()


async def test_the_safety_net_pass_hands_the_backlog_to_the_gated_worker(
    engine: MemoryEngine, scope: Scope
) -> None:
    engine.foreground.max_defer_s = 60.0
    await _fill(engine, scope, 40)
    async with engine.foreground.serving():
        engine.start_background_embedding()
        async with asyncio.timeout(1.0):  # returns at once: no long run of its own
            await engine.embed_backlog()
        assert await _unembedded(engine) == 40  # nothing embedded past the waiting member
    await _until(lambda: _is(engine, 0))
    await engine.stop_background_embedding()


async def test_without_the_worker_the_safety_net_embeds_everything(
    engine: MemoryEngine, scope: Scope
) -> None:
    await _fill(engine, scope, 40)
    await engine.embed_backlog()
    assert await _unembedded(engine) == 0
