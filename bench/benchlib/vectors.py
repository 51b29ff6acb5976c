"""Vectors and embedders for the benchmarks: random unit vectors (the scans cost the same
whatever the values), query embedders that stand in for the model, and the real MiniLM."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

DIM = 384


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` random normal vectors of DIM dimensions, each normalised to length 1."""
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


class LookupEmbedder:
    """Embedder port that returns precomputed query vectors: search timings then measure the
    store, not the model (MiniLM query latency is reported separately)."""

    name = "lookup"
    dim = DIM

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


class FakeQueryEmbedder:
    """Random unit vectors from a worker thread: the cost of a thread hop (+ optional sleep),
    no model. Deterministic per text, so a repeated question gets the same vector."""

    name = "fake-random-unit"
    dim = DIM

    def __init__(self, sleep_ms: float = 0.0) -> None:
        self.sleep_s = sleep_ms / 1000.0

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(abs(hash(t)) % (2**32))
            v = rng.standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self._embed, list(texts))


def load_minilm(*, warm: bool = False, **options: Any) -> Any:
    """The real MiniLM embedder (`options`: MiniLMEmbedder's, e.g. quantize, threads),
    loaded (and with `warm`, one text embedded); None, with a message, where it cannot run."""
    try:
        from speakermem.integrations.embeddings.minilm import MiniLMEmbedder

        emb = MiniLMEmbedder(**options)
        emb.load()
        if warm:
            emb.embed_sync(["warm up"])
    except Exception as exc:  # any missing piece: report it and skip the MiniLM run
        print(f"  [skip] MiniLM embedder not usable here: {exc!r}", flush=True)
        return None
    return emb


def bot_embedder(kind: str, *, warm: bool = False) -> tuple[Any, str]:
    """The embedder a bot would run with, as the benchmark's --embedder asks: `none`; `minilm`
    (the int8 model, failing where it cannot run); `auto` (MiniLM when its weights are
    installed, else none). Returns the embedder (or None) and what it is, in words."""
    if kind == "none":
        return None, "none (--embedder none)"
    try:
        from speakermem.integrations.embeddings.minilm import MiniLMEmbedder

        emb = MiniLMEmbedder(quantize=True)
        emb.load()  # the bot loads the model at start-up, before traffic
        if warm:
            emb.embed_sync(["warm up"])
    except Exception as exc:
        if kind == "minilm":
            raise
        return None, f"none (MiniLM unavailable: {type(exc).__name__})"
    return emb, f"MiniLM ({emb.name}), background embedding on"


def add_embedder_option(p: Any) -> None:
    """--embedder auto|minilm|none for `bot_embedder`."""
    p.add_argument(
        "--embedder",
        choices=["auto", "minilm", "none"],
        default="auto",
        help="auto: MiniLM when its weights are installed",
    )
