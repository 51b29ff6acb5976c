"""System 2's search on PostgreSQL (the commits and reads are the neutral `RecordRepo`'s).

- Lexical search reads the `records.fts` tsvector (records_schema.py). The FTS5 MATCH text
  the callers build (quoted words and phrases joined by OR, memory.search.fts_query) is
  parsed as System 1 parses it (pg/bm25.py), and the matches are ranked by Okapi BM25
  computed in SQL as FTS5's bm25(records_fts) does: k1 1.2, b 0.75, both columns weighted
  1.0, IDF over all records, document length the row's token count (`records.fts_len`).
  Scores are negative, lower is better, as FTS5's. A phrase counts once per column it is
  in (a tsvector keeps no phrase counts), where FTS5 counts each occurrence.
- Dense search is exact cosine distance (`<=>`) over `records_vec` per channel, as sqlite-vec
  does; vectors travel as pgvector's text form.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from speakermem.memory.store.pg.bm25 import K1, MIN_IDF, B, parse_match
from speakermem.memory.store.pg.database import PgDatabase
from speakermem.memory.store.pg.dialect import vector_text
from speakermem.memory.store.pg.messages_schema import TS_CONFIG, fts_input
from speakermem.memory.store.records import RecordRepo

# Okapi BM25 as FTS5's bm25(records_fts) computes it, in one statement, per matching record r:
#   sum over terms t of idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * |r| / avg|r|))
# The terms are the quoted strings of the MATCH text, normalised as the tsvector is (a term
# given twice counts twice, as in FTS5). f: for a single word, its occurrences in content and
# event (positions in the tsvector); for a phrase, 1 when the content has it plus 1 when the
# event has it (content is labelled 'A', event 'B', so a phrase never spans the two columns,
# as in FTS5). idf(t) counts the records matching t among all records, as FTS5 does; |r| is
# the row's token count (records.fts_len). Parameters: the terms (text[]), the number of
# records (N), b / avg|r| and the channel pks (bigint[]); callers append filters on r. The
# IDFs are MATERIALIZED: computed once per query, not once per matching row.
_LABEL = r"regexp_replace(t.query::text, '''([^'']*)''', '''\1'':{w}', 'g')::tsquery"
_BM25_SQL = f"""
WITH terms AS (
    SELECT CASE WHEN numnode(t.query) = 1 THEN btrim(t.query::text, '''') END AS lex,
           {_LABEL.format(w="A")} AS qa, {_LABEL.format(w="B")} AS qb, t.query
    FROM unnest(?::text[]) AS raw(term)
    CROSS JOIN LATERAL (
        SELECT phraseto_tsquery('{TS_CONFIG}', {fts_input("raw.term")}) AS query
    ) AS t
    WHERE numnode(t.query) > 0
), matching AS (
    SELECT terms.*, CASE WHEN lex IS NOT NULL THEN query ELSE qa || qb END AS m FROM terms
), weighted AS MATERIALIZED (
    SELECT m.lex, m.qa, m.qb,
           greatest(ln((?::float8 - h.hits + 0.5) / (h.hits + 0.5)), {MIN_IDF}) AS idf
    FROM matching AS m
    CROSS JOIN LATERAL (SELECT count(*) AS hits FROM records WHERE fts @@ m.m) AS h
)
SELECT r.id AS id, r.owner AS owner, r.source AS source, -(
    SELECT coalesce(sum(x.idf * x.f * {K1 + 1}
        / (x.f + {K1} * ({1 - B} + ?::float8 * r.fts_len))), 0)
    FROM (
        SELECT w.idf, CASE WHEN w.lex IS NOT NULL THEN coalesce(tf.n, 0)
            ELSE (CASE WHEN r.fts @@ w.qa THEN 1 ELSE 0 END)
                 + (CASE WHEN r.fts @@ w.qb THEN 1 ELSE 0 END) END AS f
        FROM weighted AS w LEFT JOIN (
            SELECT u.lexeme, array_length(u.positions, 1) AS n FROM unnest(r.fts) AS u
        ) AS tf ON tf.lexeme = w.lex
    ) AS x
    WHERE x.f > 0
) AS score
FROM records r
WHERE r.fts @@ (SELECT string_agg('(' || m::text || ')', ' | ')::tsquery FROM matching)
  AND r.channel_pk = ANY(?::bigint[])"""


class PgRecordRepo(RecordRepo):
    db: PgDatabase

    # ---- lexical ------------------------------------------------------------------------

    STATS_TTL_S = 30.0
    """How long BM25's corpus figures (records, mean length: a full scan) are reused. This
    repository's own writes refresh them at once; other processes' within the TTL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (read at, repository generation, records, mean length)
        self._stats: tuple[float, int, int, float] | None = None

    async def _corpus_stats(self) -> tuple[int, float]:
        """(records, their mean token count): BM25's N and average length, over every
        record, as FTS5's records_fts holds them (superseded ones too)."""
        now = time.monotonic()
        if (
            self._stats is not None
            and now - self._stats[0] < self.STATS_TTL_S
            and self._stats[1] == self.generation
        ):
            return self._stats[2], self._stats[3]
        generation = self.generation
        r = (await self.db.read("SELECT count(*), coalesce(avg(fts_len), 0) FROM records"))[0]
        self._stats = (now, generation, int(r[0]), float(r[1]))
        return int(r[0]), float(r[1])

    async def _scored(self, match: str, channel_pks: Sequence[int]) -> tuple[str, list[Any]] | None:
        """SQL selecting (id, owner, source, score) of the channels' matching records, score
        the negative BM25 (one round trip, two when the corpus figures are read); None when
        nothing can match. Filters on `r` may be appended. A column filter of the MATCH text
        does not apply to records."""
        terms = [raw for raw, _ in parse_match(match)]
        if not terms or not channel_pks:
            return None
        rows, mean = await self._corpus_stats()
        pks = list(dict.fromkeys(int(pk) for pk in channel_pks))
        return _BM25_SQL, [terms, float(rows), B / max(mean, 1e-9), pks]

    async def lexical(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        *,
        active_only: bool = True,
        owner: str | None = None,
        source: str | None = None,
        exclude_owner: str | None = None,
    ) -> list[tuple[int, float]]:
        scored = await self._scored(match, channel_pks) if match else None
        if scored is None:
            return []
        sql, params = scored
        if active_only:
            sql += " AND r.state = 'active'"
        if owner is not None:
            sql += " AND r.owner = ?"
            params.append(owner)
        if source is not None:
            sql += " AND r.source = ?"
            params.append(source)
        if exclude_owner is not None:
            sql += " AND r.owner != ?"
            params.append(exclude_owner)
        rows = await self.db.read_prepared(
            f"SELECT id, score FROM ({sql}) AS s ORDER BY score, id LIMIT ?", [*params, limit]
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    async def _best_by(
        self,
        column: str,
        match: str,
        channel_pks: Sequence[int],
        keys: list[str],
        per_key: int,
        about_others: bool,
    ) -> dict[str, list[int]]:
        scored = await self._scored(match, channel_pks)
        if scored is None:
            return {}
        sql, params = scored
        sql += f" AND r.{column} = ANY(?::text[]) AND r.state = 'active'"
        params.append(keys)
        if about_others:
            sql += " AND r.owner != r.source"
        rows = await self.db.read_prepared(
            f"SELECT id, grp FROM (SELECT id, {column} AS grp, row_number() OVER"
            f" (PARTITION BY {column} ORDER BY score, id) AS rn FROM ({sql}) AS s) AS ranked"
            " WHERE rn <= ? ORDER BY grp, rn",
            [*params, per_key],
        )
        out: dict[str, list[int]] = {}
        for rid, grp in rows:
            out.setdefault(grp, []).append(rid)
        return out

    async def matching_owners(
        self, match: str, channel_pks: Sequence[int], limit: int
    ) -> list[str]:
        if not match or not channel_pks or limit <= 0:
            return []
        scored = await self._scored(match, channel_pks)
        if scored is None:
            return []
        sql, params = scored
        sql += " AND r.state = 'active' AND r.record_scope = 'PERSON'"
        rows = await self.db.read_prepared(
            f"SELECT owner FROM ({sql}) AS s ORDER BY score, id LIMIT ?", [*params, limit]
        )
        return list(dict.fromkeys(r[0] for r in rows))

    # ---- dense --------------------------------------------------------------------------

    async def dense(
        self, query: np.ndarray, channel_pks: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        """Exact cosine KNN over the channels' record vectors (the union of per-channel
        top-k lists cut to `limit` is the top `limit` of all of them, so one query)."""
        if not channel_pks or limit <= 0:
            return []
        q = vector_text(query)
        marks = ",".join("?" * len(channel_pks))
        # ordered by the selected distance itself: `1 - distance` selected beside an ORDER
        # BY on the distance computed it twice for every record (a fifth of the scan)
        rows = await self.db.read(
            "SELECT rowid, embedding <=> ?::vector AS distance FROM records_vec"
            f" WHERE channel_pk IN ({marks}) ORDER BY distance, rowid LIMIT ?",
            [q, *channel_pks, limit],
        )
        return [(int(r[0]), 1 - float(r[1])) for r in rows]
