"""Reciprocal-rank fusion: combine ranked lists without comparing their raw scores."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


def rrf(
    rankings: Sequence[Sequence[T]],
    *,
    k0: int,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[tuple[T, float]]:
    """Fuse ranked lists: score(d) = Σ w_i / (k0 + rank_i(d)), ranks from 1.

    Duplicates inside one list count once (at their best rank). Ties keep the order of
    first appearance, so the result is deterministic.
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    scores: dict[T, float] = {}
    first_seen: dict[T, int] = {}
    order = 0
    for ranking, weight in zip(rankings, weights, strict=True):
        seen: set[T] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + weight / (k0 + rank)
            if item not in first_seen:
                first_seen[item] = order
                order += 1
    fused = sorted(scores.items(), key=lambda kv: (-kv[1], first_seen[kv[0]]))
    return fused[:limit] if limit is not None else fused
