"""SQLite's spelling of the fragments that differ between backends (memory.store.dialect)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from speakermem.memory.store.dialect import Batch, Dialect


class SqliteDialect(Dialect):
    name = "sqlite"
    for_update = ""
    for_share = ""
    claim_lock = ""
    pending_in_order = " INDEXED BY segments_pending"
    # the whole batch in one statement: the write lock is held, so every new row has an id
    # above the largest before the batch
    index_new_messages = (
        "INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)"
        " SELECT id, speakermem_segment(text), speakermem_segment(speaker_name),"
        " 'c' || channel_pk FROM messages WHERE id > ? ORDER BY id"
    )
    vector_cast = "?"

    def greatest(self, a: str, b: str) -> str:
        return f"max({a}, {b})"

    def truthy(self, expr: str) -> str:
        return expr

    def insert_or_ignore(self, into: str, rest: str) -> str:
        return f"INSERT OR IGNORE INTO {into} {rest}"

    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        marks = ", ".join("?" * len(columns))
        return f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({marks})"

    def json_elements(self, expr: str, alias: str) -> str:
        return f"json_each({expr}) {alias}"

    def json_array_agg(self, expr: str, order_by: str) -> str:
        # the aliases' primary key index yields them in `order_by` order already
        return f"json_group_array({expr})"

    def table_exists(self) -> str:
        return "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"

    def batch(self, types: Sequence[str]) -> Batch:
        # one JSON array of rows: a single parameter whatever the batch size
        return Batch(
            source="json_each(?) AS j",
            join="CROSS JOIN",
            columns=tuple(f"json_extract(j.value, '$[{i}]')" for i in range(len(types))),
            encode=_json_rows,
        )

    def vector_param(self, vector: np.ndarray) -> Any:
        return np.ascontiguousarray(vector, dtype=np.float32).tobytes()

    def vector_column(self, column: str) -> str:
        return column

    def vector_matrix(self, values: Sequence[Any]) -> np.ndarray:
        matrix = np.frombuffer(b"".join(values), dtype=np.float32)
        return matrix.reshape(len(values), -1) if values else matrix


def _json_rows(rows: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    return (json.dumps([list(r) for r in rows]),)


SQLITE = SqliteDialect()
