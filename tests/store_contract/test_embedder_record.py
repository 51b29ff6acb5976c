"""Which model wrote the vectors, and dropping them for a re-embed, on both backends."""

from __future__ import annotations

import numpy as np

from speakermem.memory.models import Scope
from speakermem.memory.store import Store
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.store_contract.conftest import embed_pending, pks_of, record, vector

GENERAL = Scope(platform="test", workspace="w1", channel="general")


async def test_the_store_records_its_embedder(store: Store) -> None:
    assert await store.messages.vectors_written_by() is None
    assert not await store.messages.has_vectors()
    await store.messages.set_vectors_written_by("model-a")
    await store.messages.set_vectors_written_by("model-b")
    assert await store.messages.vectors_written_by() == "model-b"


async def test_dropped_vectors_are_queued_again_and_records_rewritten(
    store: Store, embedder: HashEmbedder
) -> None:
    texts = ["the tea is ready", "bees in the garden", "cello practice"]
    await store.messages.ingest(
        [msg(GENERAL, f"m{i}", "Alice", t, i) for i, t in enumerate(texts)], channel_default=True
    )
    assert await embed_pending(store, embedder) == 3
    (rid,) = await store.records.add_records(
        GENERAL, [record("Alice keeps bees")], embedder.embed_sync(["Alice keeps bees"])
    )
    assert await store.messages.has_vectors()
    pks = await pks_of(store, GENERAL)

    assert await store.messages.drop_vectors() == 3
    assert await store.messages.count_pending_embeddings() == 3
    assert await store.messages.dense(vector(embedder, "bees garden"), pks, 5, 800) == []
    assert await embed_pending(store, embedder) == 3
    assert len(await store.messages.dense(vector(embedder, "bees garden"), pks, 5, 800)) == 3

    rows = await store.records.vector_texts(0, 10)
    assert rows == [(rid, pks[0], "Alice keeps bees")]
    other = np.roll(vector(embedder, "cello"), 1)[None, :]
    await store.records.replace_vectors(rows, other)
    (hit,) = await store.records.dense(other[0], pks, 1)
    assert hit[0] == rid and hit[1] > 0.99
    assert await store.records.vector_texts(rid, 10) == []
