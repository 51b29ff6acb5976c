"""PostgreSQL migration 16: Chinese, Japanese and Korean text indexed as character n-grams.

PostgreSQL's parser keeps a run of CJK characters as one word, as FTS5's unicode61 does.
`pg_trgm` finds substrings but does not rank, so the tsvectors are built from the same
segmented text SQLite indexes: `speakermem_segment(text)`, the SQL copy of
memory/search/cjk.py's `index_text` (a parity test holds the two together). Text without CJK
is passed through unchanged, so English lexemes, positions and `fts_len` do not move.

The stored generated columns `fts` and `fts_len` of `messages` and of `records` get the new
expressions; SET EXPRESSION rewrites each table in one statement, so progress is reported
per table.
"""

from __future__ import annotations

from speakermem.memory.search.cjk import CJK_PUNCT_RANGES, CJK_RANGES
from speakermem.memory.store.database import Transaction
from speakermem.memory.store.pg.messages_schema import TS_CONFIG, channel_tag, fts_input
from speakermem.memory.store.schema import MigrationProgress

# PostgreSQL's copy of `index_text`: the text split into characters (with their position),
# each CJK character followed by another CJK character gives the pair, one alone gives itself,
# the last of a run nothing; CJK punctuation a space; the characters of runs longer than one
# follow at the end. The same tokens in the same order as `index_text` (spaces may differ,
# which no tokenizer sees).
SEGMENT_SQL_FUNCTION = f"""
CREATE OR REPLACE FUNCTION speakermem_segment(t text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN t IS NULL OR t !~ '[{CJK_RANGES}{CJK_PUNCT_RANGES}]' THEN t ELSE (
    SELECT coalesce(string_agg(
               CASE WHEN x.p THEN ' '
                    WHEN NOT x.k THEN x.c
                    WHEN x.nk THEN ' ' || x.c || x.n || ' '
                    WHEN NOT x.pk THEN ' ' || x.c || ' '
                    ELSE ' ' END, '' ORDER BY x.i), '')
           || coalesce(' ' || string_agg(x.c, ' ' ORDER BY x.i)
                                FILTER (WHERE x.k AND (x.nk OR x.pk)), '')
    FROM (SELECT s.i, s.c, s.c ~ '[{CJK_PUNCT_RANGES}]' AS p, s.c ~ '[{CJK_RANGES}]' AS k,
                 lead(s.c) OVER w AS n,
                 coalesce(lead(s.c) OVER w ~ '[{CJK_RANGES}]', false) AS nk,
                 coalesce(lag(s.c) OVER w ~ '[{CJK_RANGES}]', false) AS pk
          FROM regexp_split_to_table(t, '') WITH ORDINALITY AS s(c, i)
          WINDOW w AS (ORDER BY s.i)) x
) END;
"""


def _vector(expr: str, weight: str) -> str:
    return (
        f"setweight(to_tsvector('{TS_CONFIG}'::regconfig,"
        f" {fts_input(f'speakermem_segment({expr})')}), '{weight}')"
    )


def messages_document() -> str:
    """A message row's tsvector since this migration: `fts_document_v2`
    (messages_schema.py) over the segmented text and speaker name."""
    return (
        f"{_vector('text', 'A')} || setweight(speakermem_speaker_lexemes("
        f"to_tsvector('{TS_CONFIG}'::regconfig,"
        f" {fts_input('speakermem_segment(speaker_name)')})), 'B')"
    )


def records_document() -> str:
    """A record row's tsvector since this migration (records_schema.py's, segmented)."""
    return f"{_vector('content', 'A')} || {_vector('event', 'B')}"


CJK_INDEX = SEGMENT_SQL_FUNCTION

_STEPS = (
    (
        "messages",
        f"ALTER TABLE messages ALTER COLUMN fts SET EXPRESSION AS"
        f" ({messages_document()} || {channel_tag()}),"
        f" ALTER COLUMN fts_len SET EXPRESSION AS (speakermem_tokens({messages_document()}) + 1)",
    ),
    (
        "records",
        f"ALTER TABLE records ALTER COLUMN fts SET EXPRESSION AS ({records_document()}),"
        f" ALTER COLUMN fts_len SET EXPRESSION AS (speakermem_tokens({records_document()}))",
    ),
)


async def reindex_cjk(tx: Transaction, progress: MigrationProgress) -> None:
    """Rewrite each table's full-text columns with the segmented expressions."""
    for table, sql in _STEPS:
        ((rows,),) = await tx.fetchall(f"SELECT count(*) FROM {table}")
        progress(table, 0, int(rows))
        await tx.execute(sql)
        progress(table, int(rows), int(rows))
    await tx.execute("ANALYZE messages")
    await tx.execute("ANALYZE records")
