"""PostgreSQL's spelling of the fragments that differ between backends (memory.store.dialect),
and its placeholders: the repositories write SQLite's `?`, which `translate` turns into
psycopg's `%s` once per statement text."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from speakermem.memory.store.dialect import Batch, Dialect


class PgDialect(Dialect):
    name = "postgres"
    for_update = " FOR UPDATE"
    for_share = " FOR SHARE"
    # two workers claiming at once never wait on each other and never get the same segment
    claim_lock = " FOR UPDATE SKIP LOCKED"
    pending_in_order = ""
    index_new_messages = None  # `messages.fts` is a generated column (messages_schema.py)
    vector_cast = "?::vector"

    def greatest(self, a: str, b: str) -> str:
        return f"greatest({a}, {b})"

    def truthy(self, expr: str) -> str:
        return f"{expr} <> 0"

    def insert_or_ignore(self, into: str, rest: str) -> str:
        return f"INSERT INTO {into} {rest} ON CONFLICT DO NOTHING"

    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        marks = ", ".join("?" * len(columns))
        rest = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {rest}"
        )

    def json_elements(self, expr: str, alias: str) -> str:
        return f"json_array_elements_text({expr}::json) AS {alias}(value)"

    def json_array_agg(self, expr: str, order_by: str) -> str:
        return f"json_agg({expr} ORDER BY {order_by})::text"

    def table_exists(self) -> str:
        return "SELECT to_regclass(?) IS NOT NULL"

    def batch(self, types: Sequence[str]) -> Batch:
        # one array per column, unnested side by side
        names = [f"c{i}" for i in range(len(types))]
        arrays = ", ".join(f"?::{t}[]" for t in types)
        return Batch(
            source=f"unnest({arrays}) AS j({', '.join(names)})",
            join="JOIN",
            columns=tuple(f"j.{n}" for n in names),
            encode=functools.partial(_column_arrays, len(types)),
        )

    def vector_param(self, vector: np.ndarray) -> Any:
        return vector_text(vector)

    def vector_column(self, column: str) -> str:
        return f"{column}::real[]"

    def vector_matrix(self, values: Sequence[Any]) -> np.ndarray:
        return np.array(list(values), dtype=np.float32)


def _column_arrays(width: int, rows: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    return tuple([r[i] for r in rows] for i in range(width))


def vector_text(vector: np.ndarray) -> str:
    """pgvector's text form of a float32 vector (exact: float32 values print exactly)."""
    values = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1).tolist()
    return "[" + ",".join(map(repr, values)) + "]"


POSTGRES = PgDialect()


@functools.lru_cache(maxsize=4096)
def translate(sql: str) -> str:
    """SQLite-style SQL to psycopg's format: `?` -> `%s`, `%` -> `%%`.

    A `?` inside a quoted string ('...'), a quoted identifier ("..."), a dollar-quoted body
    ($$...$$, $tag$...$tag$) or a comment is text, not a placeholder, and stays. A `%` is
    doubled everywhere, because psycopg reads `%` anywhere in the statement (quotes
    included) when it binds parameters.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # '' or "" escapes the quote
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "$" and (tag := _DOLLAR_TAG.match(sql, i)) is not None:
            close = sql.find(tag.group(0), tag.end())
            end = n if close < 0 else close + len(tag.group(0))
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")
