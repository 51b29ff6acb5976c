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

from memory.search.cjk import SEGMENT_SQL_FUNCTION
from memory.store.database import Transaction
from memory.store.pg.messages_schema import TS_CONFIG, channel_tag, fts_input
from memory.store.schema import MigrationProgress


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
