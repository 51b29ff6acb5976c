"""Background embedding that falls behind writes int8 drafts, then full-precision vectors
(memory/background_embedding.py), on both backends; and it needs no /recall gate."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from speakermem.memory.embed_order import falling_behind
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import DeleteEvent, EditEvent, Scope
from speakermem.memory.ports import BackgroundEmbedder
from tests.conftest import make_config, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract


class DraftingEmbedder(HashEmbedder):
    """A `BackgroundEmbedder` whose drafts differ from its final vectors (the negated final
    vector), recording which kind each background batch asked for."""

    drafts = True

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[bool, int]] = []

    async def embed_background(self, texts: Sequence[str], *, draft: bool) -> np.ndarray:
        self.batches.append((draft, len(texts)))
        vectors = self.embed_sync(texts)
        return -vectors if draft else vectors

    async def embed_draft(self, texts: Sequence[str]) -> np.ndarray:
        return await self.embed_background(texts, draft=True)


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(5.0):
        while not await check():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.02)


async def _fill(engine: MemoryEngine, scope: Scope, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await engine.ingest(msg(scope, f"m{i}", "Rachel", f"the launch review moved, note {i}", i))


async def _vectors(engine: MemoryEngine) -> dict[str, np.ndarray]:
    """message id -> its stored float vector."""
    pks = [pk for pk, *_ in await engine.store.db.read("SELECT id FROM messages")]
    stored = await engine.store.messages.vectors(pks)
    by_pk = await engine.store.messages.get_many(pks)
    return {by_pk[pk].message_id: vec for pk, vec in stored.items()}


async def _settled(engine: MemoryEngine) -> bool:
    return await engine.count_unembedded() == 0 and await engine.count_draft_vectors() == 0


def test_more_than_one_batch_waiting_is_falling_behind() -> None:
    assert not falling_behind(0, 16)
    assert not falling_behind(16, 16)
    assert falling_behind(17, 16)


async def test_a_backlog_gets_drafts_first_then_final_vectors(tmp_path: Path, scope: Scope) -> None:
    embedder = DraftingEmbedder()
    assert isinstance(embedder, BackgroundEmbedder)
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 40)
        assert await engine.embed_pending(batch_size=16, draft=embedder.embed_draft) == 40
        assert await engine.count_draft_vectors() == 40  # every one found, by a draft
        drafts = await _vectors(engine)
        final = embedder.embed_sync([f"Rachel: the launch review moved, note {i}" for i in (0,)])
        assert np.allclose(drafts["m0"], -final[0])

        embedder.batches.clear()
        engine.start_background_embedding()
        await _until(lambda: _settled(engine))
        vectors = await _vectors(engine)
        assert len(vectors) == 40
        assert np.allclose(vectors["m0"], final[0])  # the draft was written over
        assert embedder.batches == [(False, 16), (False, 16), (False, 8)]
    finally:
        await engine.close()


async def test_the_worker_drafts_only_while_behind(tmp_path: Path, scope: Scope) -> None:
    embedder = DraftingEmbedder()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 10)  # one batch waits: final vectors at once (`embed`)
        engine.start_background_embedding()
        await _until(lambda: _settled(engine))
        assert embedder.batches == [] and embedder.calls >= 1
        await engine.stop_background_embedding()

        embedder.batches.clear()
        await _fill(engine, scope, 40, start=10)  # more than a batch: drafts, then finals
        engine.start_background_embedding()
        await _until(lambda: _settled(engine))
        drafted = [n for draft, n in embedder.batches if draft]
        finals = [n for draft, n in embedder.batches if not draft]
        assert sum(drafted) == 40 and sum(finals) == 40
        assert embedder.batches.index((True, 16)) < embedder.batches.index((False, 16))
    finally:
        await engine.close()


async def test_a_recall_in_flight_does_not_hold_back_idle_priority_batches(
    tmp_path: Path, scope: Scope
) -> None:
    """Idle-class threads give way at the CPU: the /recall gate is not in their way."""
    embedder = DraftingEmbedder()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    engine.foreground.max_defer_s = 60.0
    try:
        await _fill(engine, scope, 40)
        async with engine.foreground.serving():  # a /recall that outlasts the test
            engine.start_background_embedding()
            await _until(lambda: _settled(engine))
        assert engine.foreground.deferrals == 0
    finally:
        await engine.close()


async def test_an_edited_message_keeps_no_stale_draft(tmp_path: Path, scope: Scope) -> None:
    """A draft read before an edit is not written over with the old text's vector: the
    edit queued the message for a first vector again."""
    embedder = DraftingEmbedder()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 20)
        await engine.embed_pending(batch_size=16, draft=embedder.embed_draft)
        stale = await engine.store.messages.draft_vectors(100)
        assert len(stale) == 20
        edited_at = msg(scope, "m3", "Rachel", "x", 30).ts
        edit = EditEvent(scope=scope, message_id="m3", text="moved to May", edited_at=edited_at)
        await engine.edit(edit)
        assert await engine.count_draft_vectors() == 19
        replaced = await engine.store.messages.replace_drafts(
            stale, embedder.embed_sync([text for _, _, text in stale])
        )
        assert replaced == 19
        assert await engine.count_unembedded() == 1  # m3 waits for its new text's vector
        assert await engine.count_draft_vectors() == 0
    finally:
        await engine.close()


async def test_a_deleted_message_leaves_no_draft(tmp_path: Path, scope: Scope) -> None:
    embedder = DraftingEmbedder()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 20)
        await engine.embed_pending(batch_size=16, draft=embedder.embed_draft)
        await engine.delete(DeleteEvent(scope=scope, message_id="m3"))
        assert await engine.count_draft_vectors() == 19
        assert "m3" not in await _vectors(engine)
        left = await engine.store.messages.draft_vectors(100)
        assert len(left) == 19 and all("note 3" not in text for _, _, text in left)
    finally:
        await engine.close()


class SlowFinals(DraftingEmbedder):
    """Final vectors wait for `release` (an idle-class batch waiting for a core)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def embed_background(self, texts: Sequence[str], *, draft: bool) -> np.ndarray:
        if not draft:
            await self.release.wait()
        return await super().embed_background(texts, draft=draft)


async def test_new_messages_get_drafts_while_a_replacement_waits(
    tmp_path: Path, scope: Scope
) -> None:
    """The drafts' replacement runs beside the worker: new messages never wait for it."""
    embedder = SlowFinals()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 40)
        await engine.embed_pending(batch_size=16, draft=embedder.embed_draft)
        engine.start_background_embedding()  # the replacer takes a batch of drafts and waits
        await _fill(engine, scope, 40, start=40)
        await _until(lambda: _is_unembedded(engine, 0))  # while every replacement waits
        assert await engine.count_draft_vectors() >= 40
        embedder.release.set()
        await _until(lambda: _settled(engine))
    finally:
        await engine.close()


async def _is_unembedded(engine: MemoryEngine, n: int) -> bool:
    return await engine.count_unembedded() == n


async def test_the_safety_net_without_workers_writes_final_vectors(
    tmp_path: Path, scope: Scope
) -> None:
    """Drafts only while the workers run (the replacer is there to replace them): the
    periodic safety net's own pass embeds final vectors."""
    embedder = DraftingEmbedder()
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await _fill(engine, scope, 40)
        await engine.embed_backlog()
        assert await _settled(engine)
        assert embedder.batches == [] and embedder.calls == 3  # 16 + 16 + 8 through `embed`
    finally:
        await engine.close()
