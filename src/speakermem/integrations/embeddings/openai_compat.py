"""Embedder backed by any OpenAI-compatible ``/v1/embeddings`` endpoint.

Useful when a GPU box (vLLM, llama.cpp, TEI, Ollama, OpenAI itself) already serves an
embedding model. Vectors are re-normalised here because not every server normalises, and
the dimension is checked on every response so a misconfigured model cannot silently write
vectors of the wrong size into the store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import openai
from openai import AsyncOpenAI

logger = logging.getLogger(__name__)


class EmbeddingEndpointError(RuntimeError):
    """The embeddings endpoint failed or answered with something unusable."""


class EmbeddingDimensionMismatch(EmbeddingEndpointError):
    """The endpoint returned vectors of a different size than configured."""


class OpenAIEmbedder:
    """Implements the ``Embedder`` port over the ``openai`` SDK's async client."""

    def __init__(
        self,
        *,
        model: str,
        dim: int,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        batch_size: int = 128,
        client: AsyncOpenAI | None = None,
    ) -> None:
        if dim < 1:
            raise ValueError("dim must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.name = model
        self.model = model
        self.dim = dim
        self.batch_size = batch_size
        # Local servers usually ignore the key, but the SDK insists on one.
        self._client = client or AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "not-needed",
            timeout=timeout,
            max_retries=max_retries,
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed in batches of ``batch_size``; returns (len(texts), dim) float32, L2-normalised."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            out[start : start + len(chunk)] = await self._embed_batch(chunk)
        return out

    async def _embed_batch(self, chunk: list[str]) -> np.ndarray:
        # OpenAI (and several compatible servers) reject empty strings with a 400.
        payload = [t if t else " " for t in chunk]
        try:
            resp = await self._client.embeddings.create(
                model=self.model, input=payload, encoding_format="float"
            )
        except openai.APIError as exc:
            raise EmbeddingEndpointError(
                f"embeddings request to model {self.model!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        data = sorted(resp.data, key=lambda d: d.index)
        if len(data) != len(chunk):
            raise EmbeddingEndpointError(
                f"model {self.model!r} returned {len(data)} embeddings for {len(chunk)} inputs"
            )
        try:
            vecs = np.asarray([d.embedding for d in data], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingEndpointError(
                f"model {self.model!r} returned malformed embeddings (ragged or non-numeric; "
                "is the server sending base64?)"
            ) from exc
        if vecs.ndim != 2 or vecs.shape[1] != self.dim:
            got = vecs.shape[1] if vecs.ndim == 2 else "ragged"
            raise EmbeddingDimensionMismatch(
                f"model {self.model!r} returned {got}-dimensional vectors but the embedder is "
                f"configured for dim={self.dim}; fix the configured dimension or the model"
            )
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        if not np.all(np.isfinite(vecs)):
            raise EmbeddingEndpointError(f"model {self.model!r} returned non-finite values")
        return vecs / np.maximum(norms, 1e-12)

    async def aclose(self) -> None:
        """Close the underlying HTTP client."""
        await self._client.close()
