"""`IN (...)` lists in a few sizes, so SQLite's prepared-statement caches stop filling.

Python's sqlite3 keeps each connection's last 128 prepared statements (several KB to tens
of KB each), keyed by their text. A list of n values written as n `?` marks makes a new
text for every n, so as recalls meet lists of every length each connection's cache fills
with near-copies of the same query: in the load benchmark a recall process's SQLite memory
kept rising for minutes past its page-cache budget. Padding a list to the next power of two
by repeating its last value keeps the meaning of IN and leaves a handful of texts per query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def padded_size(n: int) -> int:
    """The bucket a list of `n` values is padded to: the next power of two."""
    if n < 1:
        raise ValueError("an IN list needs at least one value")
    return 1 << (n - 1).bit_length()


def in_list(values: Sequence[T]) -> tuple[str, list[T]]:
    """The `?` marks of an IN list over `values` and the values to bind to them."""
    padded = list(values)
    padded.extend(padded[-1:] * (padded_size(len(padded)) - len(padded)))
    return ",".join("?" * len(padded)), padded
