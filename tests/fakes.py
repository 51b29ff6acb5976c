"""Deterministic test doubles for ports (not stubs of the code under test).

`HashEmbedder` maps words to fixed random directions and sums them, so texts that
share words have similar vectors: enough to exercise the real vector index.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

_WORD = re.compile(r"\w+")


class HashEmbedder:
    name = "hash-test"

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.calls = 0

    def _word(self, word: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in _WORD.findall(text.casefold()):
                out[i] += self._word(word)
            norm = np.linalg.norm(out[i])
            out[i] = (
                out[i] / norm
                if norm
                else self._word("<empty>") / np.linalg.norm(self._word("<empty>"))
            )
        return out

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return self.embed_sync(texts)
