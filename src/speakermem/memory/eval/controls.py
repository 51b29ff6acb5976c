"""One-shot retrieval controls for the evaluation (SPEC §8, shared/data/README.md).

Each returns the top-k message ids for a question over one channel's verbatim messages:
BM25 (rank-bm25 BM25Okapi on lowercased alphanumeric tokens, and Chinese, Japanese and
Korean runs as their character bigrams and unigrams: the standard CJK baseline, with the
n-grams the store indexes, memory/search/cjk.py) of the text and of "speaker text",
dense cosine on "speaker: text", and hybrid RRF (k0=60) of the better BM25 and dense with
100 candidates each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Okapi

from speakermem.memory.search.cjk import words_and_ngrams
from speakermem.memory.search.fusion import rrf


def bm25_tokens(text: str) -> list[str]:
    """Lowercased alphanumeric words; a CJK run as its bigrams and characters."""
    return words_and_ngrams(text)


@dataclass
class ChannelIndex:
    """A channel's messages with both BM25 indexes and the dense matrix."""

    ids: list[str]
    bm25_text: BM25Okapi
    bm25_speaker: BM25Okapi
    vectors: np.ndarray | None

    @classmethod
    def build(
        cls, rows: Sequence[tuple[str, str, str]], vectors: np.ndarray | None
    ) -> ChannelIndex:
        """rows: (message_id, speaker_name, text) in channel order."""
        ids = [r[0] for r in rows]
        text_docs = [bm25_tokens(r[2]) or ["_"] for r in rows]
        speaker_docs = [bm25_tokens(f"{r[1]} {r[2]}") or ["_"] for r in rows]
        return cls(ids, BM25Okapi(text_docs), BM25Okapi(speaker_docs), vectors)

    def _top(self, scores: np.ndarray, k: int) -> list[str]:
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.ids[i] for i in order]

    def bm25(self, question: str, k: int) -> list[str]:
        return self._top(np.asarray(self.bm25_text.get_scores(bm25_tokens(question))), k)

    def bm25_speaker_text(self, question: str, k: int) -> list[str]:
        return self._top(np.asarray(self.bm25_speaker.get_scores(bm25_tokens(question))), k)

    def dense(self, query_vector: np.ndarray | None, k: int) -> list[str]:
        if self.vectors is None or query_vector is None:
            return []
        return self._top(self.vectors @ query_vector, k)


def hybrid(lexical: Sequence[str], dense: Sequence[str], *, k: int, k0: int = 60) -> list[str]:
    return [mid for mid, _ in rrf([lexical, dense], k0=k0)][:k]
