"""The SQL that differs between the backends, as one small object per backend.

The repositories (memory/store/*.py) are backend-neutral: they write their SQL once, with
SQLite's `?` placeholders (the PostgreSQL database translates them), and ask the database's
`dialect` for the few fragments each backend spells its own way: row locks, upserts, JSON
functions, the rows of a batch bound as one parameter, the full-text write after an ingest
and the vector encoding of System 2. Everything else a backend does differently (FTS5
against tsvector BM25, vec0 against pgvector search, advisory locks) lives in that backend's
own modules (memory/store/sqlite/, memory/store/pg/), never in a subclass hook.

A new fragment belongs here when the same statement differs only in spelling; a new
algorithm (a different query plan, a cache) belongs in the backend's module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Batch:
    """Rows of a batch bound as parameters and read as a table (one statement for the lot):
    `FROM {source} {join} t ON t.x = {column(0)}`, with `params(rows)` bound to `source`."""

    source: str
    """The table expression of the rows, with alias `j`."""
    join: str
    """How to join a table to the rows so the planner loops over the rows (SQLite's CROSS
    JOIN keeps the given order of the loops; PostgreSQL plans a JOIN itself)."""
    columns: tuple[str, ...]
    """The SQL expression of each column of a row."""
    encode: Callable[[Sequence[Sequence[Any]]], tuple[Any, ...]]
    """Rows -> the parameters of `source`."""

    def column(self, i: int) -> str:
        return self.columns[i]

    def params(self, rows: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
        return self.encode(rows)


class Dialect(ABC):
    """What a backend spells its own way (see the module docstring)."""

    name: str
    """'sqlite' or 'postgres'."""

    for_update: str
    """Appended to a SELECT whose rows the transaction then changes, so a concurrent
    writer of them waits (PostgreSQL); SQLite's one writer needs none."""
    for_share: str
    """Appended to a SELECT whose rows must not change until the transaction commits."""
    claim_lock: str
    """Appended to the Writer queue's claim: lock the rows claimed, skip those another
    worker holds (PostgreSQL); SQLite's one writer serialises claims already."""
    pending_in_order: str
    """Index hint of the pending-segments scan: SQLite's planner, without statistics,
    would sort every pending segment first; PostgreSQL plans from its statistics."""
    index_new_messages: str | None
    """The full-text write after an ingest batch (one parameter: the largest message id
    before the batch), None where the index follows the rows by itself."""
    vector_cast: str
    """The placeholder of a vector parameter (with its cast)."""

    @abstractmethod
    def greatest(self, a: str, b: str) -> str:
        """The larger of two SQL values."""

    @abstractmethod
    def truthy(self, expr: str) -> str:
        """A condition true when the integer `expr` (0 or 1) is not 0."""

    @abstractmethod
    def insert_or_ignore(self, into: str, rest: str) -> str:
        """`INSERT INTO {into} {rest}` that skips rows whose key exists already."""

    @abstractmethod
    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """Insert one row of `columns` (each bound by a `?`), replacing the other columns of
        a row with the same `key`."""

    @abstractmethod
    def json_elements(self, expr: str, alias: str) -> str:
        """A table expression whose column `{alias}.value` is each element (as text) of the
        JSON array `expr`."""

    @abstractmethod
    def json_array_agg(self, expr: str, order_by: str) -> str:
        """An aggregate: the JSON array text of `expr` over the group."""

    @abstractmethod
    def table_exists(self) -> str:
        """A query of one row whose first column is true when the table named by its one
        parameter exists."""

    @abstractmethod
    def batch(self, types: Sequence[str]) -> Batch:
        """Rows of these column types ('bigint', 'text') as one bound table."""

    @abstractmethod
    def vector_param(self, vector: np.ndarray) -> Any:
        """A float32 vector as bound to `vector_cast`."""

    @abstractmethod
    def vector_column(self, column: str) -> str:
        """A vector column as selected for `vector_matrix`."""

    @abstractmethod
    def vector_matrix(self, values: Sequence[Any]) -> np.ndarray:
        """Selected `vector_column` values as a float32 matrix, one row each."""
