"""The order pending messages are embedded in: by length, within a window; and when
background embedding is behind (`falling_behind`).

A model batch is padded to its longest text, so a batch of one long message and fifteen
short ones costs sixteen long ones. Reading a window of pending messages (oldest first) and
embedding it shortest first, in the same small batches, wastes little padding: measured
about half the CPU a message for MiniLM in batches of 16 (docs/benchmarks/embed.json, `sorted`),
while a /recall still waits for at most one small batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T", bound=tuple[int, int, str])

SORT_WINDOW = 128
"""Pending messages read at once and sorted by length (a window's messages wait at most for
the window's embedding, about a second and a half on one core)."""


def length_sorted_batches(items: Sequence[T], batch_size: int) -> list[list[T]]:
    """`items` ((pk, channel pk, text) tuples) shortest text first, in batches of
    `batch_size`; ties keep their order (oldest first)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    ordered = sorted(items, key=lambda item: len(item[2]))
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def falling_behind(pending: int, batch_size: int) -> bool:
    """Whether background embedding is behind: more than one batch waits for a first vector.
    Then each message gets a draft vector from the quicker graph (a message without one is
    found only by its words), and the full-precision vector once nothing waits."""
    return pending > batch_size
