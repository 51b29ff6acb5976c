"""MiniLM's per-token states (the second graph output, for late-interaction scoring)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from speakermem.integrations.embeddings.minilm import MiniLMEmbedder


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniLMEmbedder]:
    emb = MiniLMEmbedder(cache_dir=Path(tmp_path_factory.mktemp("minilm-tokens")))
    yield emb
    emb.close()


@pytest.mark.slow
def test_one_unit_row_per_word_piece_without_special_tokens(embedder: MiniLMEmbedder) -> None:
    texts = ["Ross fed the monkey", "unbelievably hilarious", ""]
    states = embedder.token_embeddings_sync(texts)
    embedder.load()
    pieces = [
        len(e.ids) - 2 for e in embedder._tokenizer.encode_batch(texts, add_special_tokens=True)
    ]
    assert [s.shape for s in states] == [(n, embedder.dim) for n in pieces]
    assert pieces[1] > 2  # split into several word pieces
    for s in states[:2]:
        assert np.allclose(np.linalg.norm(s, axis=1), 1.0, atol=1e-5)


def test_states_do_not_depend_on_the_batch_or_its_padding(embedder: MiniLMEmbedder) -> None:
    short = "did you feed the monkey?"
    long = "the lasagna tasted of fashion magazines and nobody wanted to say it out loud"
    (alone,) = embedder.token_embeddings_sync([short])
    batched = embedder.token_embeddings_sync([long, short])[1]
    assert np.allclose(alone, batched, atol=1e-4)
    # context matters: the same word gets different states in different sentences
    a = embedder.token_embeddings_sync(["the bank of the river"])[0][1]
    b = embedder.token_embeddings_sync(["the bank raised its rates"])[0][1]
    assert float(a @ b) < 0.99


def test_max_tokens_caps_long_texts_and_sentence_vectors_are_unchanged(
    embedder: MiniLMEmbedder,
) -> None:
    text = " ".join(["monkey"] * 100)
    assert embedder.token_embeddings_sync([text], max_tokens=8)[0].shape == (8, embedder.dim)
    assert embedder.token_embeddings_sync([]) == []
    vec = embedder.embed_sync([text])
    assert vec.shape == (1, embedder.dim)
    assert float(np.linalg.norm(vec[0])) == pytest.approx(1.0, abs=1e-5)


async def test_async_form_runs_on_the_worker_thread(embedder: MiniLMEmbedder) -> None:
    got = await embedder.token_embeddings(["hello there"])
    assert np.allclose(got[0], embedder.token_embeddings_sync(["hello there"])[0], atol=1e-6)
    with pytest.raises(TypeError):
        await embedder.token_embeddings("hello")  # type: ignore[arg-type]
