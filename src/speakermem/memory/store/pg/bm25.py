"""Okapi BM25 as FTS5 computes it, in PostgreSQL's SQL over the `fts` tsvector columns.

The callers' FTS5 MATCH expressions (OR-ed quoted words and phrases, some limited to a
column) are parsed into their quoted items (`parse_match`); each item becomes a tsquery,
and the statements below rank the matching rows with FTS5's constants and column weights,
so the ranking keeps the inverse document frequency that `ts_rank_cd` lacks. System 1's
statement is here; System 2's (memory/store/pg/records.py) uses the same constants.
"""

from __future__ import annotations

import math
import re

from speakermem.memory.store.pg.messages_schema import SPEAKER_PREFIX, TS_CONFIG, fts_input

K1, B = 1.2, 0.75
"""FTS5's bm25() constants."""
WEIGHT_TEXT, WEIGHT_SPEAKER = 1.0, 0.5
"""Column weights of every lexical query (bm25(messages_fts, 1.0, 0.5, 0.0) on SQLite)."""
MIN_IDF = 1e-6
"""FTS5 floors a term's IDF here when it occurs in more than half of the rows."""
DF_ESTIMATE_ABOVE = 5_000
"""A common word's document frequency comes from ANALYZE's sampled lexeme frequencies
(about 2 % off at 20,000 of a million rows) once it reaches this many rows; below it, and
for phrases and column-limited words, it is counted exactly (see `_DF_SQL`)."""

# A quoted FTS5 string, optionally behind a column filter: `{text} : "word"`, `"a b"`.
_ITEM = re.compile(r'(?:\{([^}]*)\}\s*:\s*)?"((?:[^"]|"")*)"')


def parse_match(match: str, *, columns: str = "AB") -> list[tuple[str, str]]:
    """The quoted strings of an FTS5 OR-expression as (raw text, columns 'A'/'B'/'AB').

    The callers' expressions are ORs of quoted words or phrases (`build_match`,
    `phrase_match`, `speaker_phrase`), some under a `{text}` or `{speaker_name}` filter;
    operators between them carry no other meaning here."""
    out: list[tuple[str, str]] = []
    for cols, raw in _ITEM.findall(match):
        weights = columns
        if cols.strip():
            names = set(cols.split())
            weights = "".join(
                w for w, name in (("A", "text"), ("B", "speaker_name")) if name in names
            )
            weights = "".join(c for c in weights if c in columns)
        if weights:
            out.append((raw.replace('""', '"'), weights))
    return out


def in_speaker_name(query: str) -> str:
    """SQL of tsquery `query` (an SQL expression) over the speaker name: each lexeme with
    SPEAKER_PREFIX (messages_schema.py). Lexemes hold no quote (the text search input has
    no punctuation), so rewriting the query's text form is safe."""
    return (
        f"regexp_replace(({query})::text, '''([^'']*)''', '''{SPEAKER_PREFIX}\\1''', 'g')::tsquery"
    )


def in_columns(query: str, columns: str, allowed: str = "'AB'") -> str:
    """SQL restricting tsquery `query` to the columns `columns` ('A' text, 'B' speaker
    name, 'AB' both), NULL when they are not among the term's `allowed` columns (all SQL
    expressions). The text's lexemes are the query's own, the speaker name's carry
    SPEAKER_PREFIX (messages_schema.py): either column is answered by the GIN index alone,
    where a weight label is checked on each row."""
    speaker = in_speaker_name(query)
    return (
        f"CASE WHEN strpos({allowed}, {columns}) = 0 THEN NULL WHEN {columns} = 'A'"
        f" THEN ({query}) WHEN {columns} = 'B' THEN {speaker} ELSE ({query}) || {speaker} END"
    )


# Okapi BM25 as FTS5 computes it, per matching row m:
#   sum over terms t of idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * |m| / avg|m|))
# idf(t) = ln((N - n_t + 0.5) / (n_t + 0.5)), floored at 1e-6, over all live messages (FTS5
# counts the whole index, not the searched channels). f: for a single word, its occurrences
# in the allowed columns weighted by column (text 1.0, speaker name 0.5), read from the
# positions of its lexeme (the text's) and of its `s:` lexeme (the speaker name's) in the
# tsvector (each matching row's tsvector keeps only the terms' lexemes, marked with weight
# 'D' by setweight and kept by ts_filter: no text or name lexeme is weighted 'D'; that is
# unnested in the select list and hash-joined to the terms: unnesting every lexeme, in a
# LATERAL join that filled a tuplestore per row, took half of the statement's time);
# for a phrase, 1.0 when it occurs in the text plus 0.5 when it occurs in the name (a
# tsvector keeps no phrase counts). |m| is the row's token count (messages.fts_len).
# `stats` reads N and avg|m| from the parameters, or (third parameter true) computes them;
# a term's document frequency comes from the parameters when known, else is counted; the
# rows scored are those matching any term, or any of the listed (essential) terms;
# the terms arrive as raw text and columns and are normalised here (one round trip).
MESSAGES_BM25_SQL = f"""
WITH stats AS (
    SELECT coalesce(?::float8, count(*)::float8) AS n,
           coalesce(?::float8, avg(fts_len)::float8, 0) AS avglen
    FROM messages WHERE deleted_at IS NULL AND ?::boolean
), t0 AS MATERIALIZED (
    SELECT u.i, u.ws, phraseto_tsquery('{TS_CONFIG}', {fts_input("u.raw")}) AS tq
    FROM unnest(?::text[], ?::text[]) WITH ORDINALITY AS u(raw, ws, i)
), q AS MATERIALIZED (
    SELECT t0.i, t0.ws,
           CASE WHEN numnode(t0.tq) = 1 THEN btrim(t0.tq::text, '''') END AS lex,
           {in_columns("t0.tq", "'A'", "t0.ws")} AS qa,
           {in_columns("t0.tq", "'B'", "t0.ws")} AS qb,
           {in_columns("t0.tq", "t0.ws", "t0.ws")} AS qw
    FROM t0 WHERE numnode(t0.tq) > 0
), terms AS MATERIALIZED (
    SELECT q.i, q.lex, '{SPEAKER_PREFIX}' || q.lex AS slex, q.ws, q.qa, q.qb, q.qw,
           CASE WHEN s.n - d.df + 0.5 > 0
                THEN greatest(ln((s.n - d.df + 0.5) / (d.df + 0.5)), ?::float8)
                ELSE ?::float8 END AS idf
    FROM q CROSS JOIN stats s CROSS JOIN LATERAL (
        SELECT coalesce((?::float8[])[q.i], (SELECT count(*) FROM messages
                        WHERE fts @@ q.qw AND deleted_at IS NULL)) AS df
    ) d
), hits AS MATERIALIZED (
    SELECT m.id, m.speaker_id, m.fts, m.fts_len FROM messages m
    WHERE m.fts @@ (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms
                    WHERE ?::int[] IS NULL OR i = ANY(?::int[]))
      AND m.deleted_at IS NULL AND {{channels}}
    {{filters}}
    UNION
    (SELECT m.id, m.speaker_id, m.fts, m.fts_len FROM messages m
     WHERE m.fts @@ (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms
                     WHERE NOT (i = ANY(?::int[])))
       AND m.deleted_at IS NULL AND {{channels}}
     {{filters}}
     LIMIT ?)
), tf AS (
    SELECT u.id, u.speaker_id, u.fts_len, t.i, sum(cardinality((u.v).positions) * t.w) AS f
    FROM (SELECT h.id, h.speaker_id, h.fts_len, unnest(ts_filter(
              setweight(h.fts, 'D', ARRAY(SELECT unnest(ARRAY[lex, slex]) FROM terms
                                          WHERE lex IS NOT NULL)),
              ARRAY['d']::"char"[])) AS v
          FROM hits h) AS u
    JOIN (SELECT i, lex AS lexeme, ?::float8 AS w FROM terms
          WHERE lex IS NOT NULL AND strpos(ws, 'A') > 0
          UNION ALL
          SELECT i, slex, ?::float8 FROM terms WHERE lex IS NOT NULL AND strpos(ws, 'B') > 0
    ) AS t ON t.lexeme = (u.v).lexeme
    GROUP BY u.id, u.speaker_id, u.fts_len, t.i
    UNION ALL
    SELECT h.id, h.speaker_id, h.fts_len, t.i, CASE WHEN h.fts @@ t.qa THEN ?::float8 ELSE 0 END
                      + CASE WHEN h.fts @@ t.qb THEN ?::float8 ELSE 0 END
    FROM hits h JOIN terms t ON t.lex IS NULL
)
SELECT tf.id AS id, tf.speaker_id AS speaker_id,
       -sum(t.idf * tf.f * ?::float8 / (tf.f + ?::float8
            * (?::float8 + ?::float8 * tf.fts_len / greatest(s.avglen, 1e-9)))) AS score
FROM tf JOIN terms t ON t.i = tf.i CROSS JOIN stats s
WHERE tf.f > 0
GROUP BY tf.id, tf.speaker_id"""


def idf(n: float, df: float) -> float:
    """FTS5's IDF as the statement computes it (floored at MIN_IDF)."""
    if n - df + 0.5 <= 0:
        return MIN_IDF
    return max(math.log((n - df + 0.5) / (df + 0.5)), MIN_IDF)


# Each item's document frequency over all live messages (items without lexemes: no row).
# A single word whose lexemes in the searched columns (the word in the text, `s:` + the
# word in the speaker name) ANALYZE lists among the most common lexemes of `messages.fts`
# with at least DF_ESTIMATE_ABOVE rows together (frequencies x live rows, summed: a row
# holding the word in both columns counts twice, a rare part not at all) takes that
# estimate; every other item is counted (a count reads each matching row's heap page:
# hundreds of milliseconds for a word in a tenth of a million rows; a rare word is cheap).
# Each item's query is MATERIALIZED first: the count's recheck of a phrase's rows then
# reads a value instead of parsing and rewriting the query again for each row (3x faster).
DF_SQL = f"""
WITH t1 AS MATERIALIZED (
    SELECT u.i, u.ws, phraseto_tsquery('{TS_CONFIG}', {fts_input("u.raw")}) AS tq
    FROM unnest(?::text[], ?::text[]) WITH ORDINALITY AS u(raw, ws, i)
), t0 AS MATERIALIZED (
    SELECT t1.i, t1.ws, {in_columns("t1.tq", "t1.ws", "t1.ws")} AS qw,
           CASE WHEN numnode(t1.tq) = 1 THEN btrim(t1.tq::text, '''') END AS lex
    FROM t1 WHERE numnode(t1.tq) > 0
)
SELECT t0.i, CASE WHEN e.df >= ?::float8 THEN e.df
    ELSE (SELECT count(*) FROM messages WHERE deleted_at IS NULL AND fts @@ t0.qw) END
FROM t0 LEFT JOIN LATERAL (
    SELECT round(sum(f.freq) * ?::float8) AS df
    FROM pg_stats s CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[],
                                              s.most_common_elem_freqs) AS f(lex, freq)
    WHERE s.schemaname = current_schema() AND s.tablename = 'messages' AND s.attname = 'fts'
      AND f.lex = ANY(ARRAY[CASE WHEN strpos(t0.ws, 'A') > 0 THEN t0.lex END,
                            CASE WHEN strpos(t0.ws, 'B') > 0
                                 THEN '{SPEAKER_PREFIX}' || t0.lex END])
) e ON true"""
