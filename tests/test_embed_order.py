"""Pending messages are embedded shortest first within a window, in small batches, with the
background gate before each batch: less padding per model batch, the same wait for /recall."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from speakermem.memory.embed_order import SORT_WINDOW, length_sorted_batches
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg

pytestmark = pytest.mark.contract


def test_batches_go_shortest_first_and_ties_keep_their_order() -> None:
    items = [(1, 7, "ccc"), (2, 7, "a"), (3, 7, "bb"), (4, 7, "a"), (5, 7, "dddd")]
    assert length_sorted_batches(items, 2) == [
        [(2, 7, "a"), (4, 7, "a")],
        [(3, 7, "bb"), (1, 7, "ccc")],
        [(5, 7, "dddd")],
    ]
    assert length_sorted_batches([], 16) == []
    with pytest.raises(ValueError):
        length_sorted_batches(items, 0)


async def test_the_backlog_is_embedded_by_length_in_small_gated_batches(
    engine: MemoryEngine, scope: Scope
) -> None:
    n = SORT_WINDOW + 40  # more than one window
    texts = [f"m{i} " + "word " * ((i * 37) % 23) for i in range(n)]
    await engine.ingest_many([msg(scope, f"x{i}", "ann", t, i) for i, t in enumerate(texts)])
    calls: list[list[str]] = []
    gates = 0

    async def record(batch: list[str]) -> np.ndarray:
        calls.append(batch)
        assert engine.embedder is not None
        return await engine.embedder.embed(batch)

    async def gate() -> None:
        nonlocal gates
        gates += 1

    done = await engine.embed_pending(batch_size=16, before_batch=gate, embed=record)
    assert done == n and await engine.count_unembedded() == 0
    assert all(len(c) <= 16 for c in calls) and gates == len(calls)
    # the first window is read oldest first and embedded shortest first
    embedded = [t.removeprefix("ann: ") for c in calls for t in c]  # the speaker goes first
    first_window = embedded[:SORT_WINDOW]
    lengths = [len(t) for t in first_window]
    assert lengths == sorted(lengths)
    assert set(first_window) == set(texts[:SORT_WINDOW])  # oldest first: the window is
    # every message once, whatever the order
    assert sorted(embedded) == sorted(texts)


async def test_a_large_batch_is_its_own_window(engine: MemoryEngine, scope: Scope) -> None:
    texts: Sequence[str] = [f"t{i} " + "x " * (i % 5) for i in range(300)]
    await engine.ingest_many([msg(scope, f"y{i}", "bo", t, i) for i, t in enumerate(texts)])
    sizes: list[int] = []

    async def record(batch: list[str]) -> np.ndarray:
        sizes.append(len(batch))
        assert engine.embedder is not None
        return await engine.embedder.embed(batch)

    assert await engine.embed_pending(batch_size=256, embed=record) == 300
    assert sizes == [256, 44]
