"""PostgreSQL DDL for System 2's search objects and the Writer workers' segment claims.

pg/schema.py creates the plain tables (records, record_sources, writer_runs, segments, ...);
this module adds, as later migrations, what SQLite builds from FTS5 and sqlite-vec:

- Full text: a stored generated `tsvector` column `records.fts` over `content` (labelled
  'A') and `event` ('B'), ranked alike as FTS5's two columns, in the same `speakermem` text
  search configuration as the messages (English Snowball stems, no stop-words dropped,
  punctuation split as unicode61 splits it), under a GIN index, and `records.fts_len`, the
  row's token count (BM25's document length). Generated columns follow every insert, update
  and delete of a record, as the records_fts triggers do in SQLite; a `records_fts` view
  lists the rows FTS5's table holds.
- Dense: `records_vec (rowid, channel_pk, embedding vector(N))`, the pgvector twin of the
  vec0 table (cosine distance `<=>`, searched exactly per channel, as sqlite-vec does). The
  column is named `rowid` so the forgetting cascade's SQL for vec0 runs unchanged; a record's
  vector also goes when the record row goes (ON DELETE CASCADE), whatever deletes it.
- Claims: `segments.claimed_by` / `lease_until` (SQLite's migration 7) and a partial index
  over pending segments by channel, which the claim's "oldest pending segment of its
  channel" test reads.
"""

from __future__ import annotations

from speakermem.memory.store.pg.messages_schema import TS_CONFIG, fts_input, text_search_config_sql
from speakermem.memory.store.schema import EMBED_DIM


def records_document(content: str = "content", event: str = "event") -> str:
    """The tsvector of a record row: content weight 'A', event 'B'. Both count alike in
    the ranking; the labels keep a phrase from matching across the two columns (FTS5
    matches a phrase inside one column)."""
    return (
        f"setweight(to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(content)}), 'A')"
        f" || setweight(to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(event)}), 'B')"
    )


def records_search_sql(dim: int = EMBED_DIM) -> str:
    """Full-text and vector objects of the records table (one migration)."""
    return (
        text_search_config_sql()
        + f"""
CREATE EXTENSION IF NOT EXISTS vector;

ALTER TABLE records ADD COLUMN fts tsvector
    GENERATED ALWAYS AS ({records_document()}) STORED;
-- BM25's document length: the row's tokens, as FTS5 counts them (speakermem_tokens is the
-- messages' search migration's).
ALTER TABLE records ADD COLUMN fts_len integer
    GENERATED ALWAYS AS (speakermem_tokens({records_document()})) STORED;
CREATE INDEX records_fts_gin ON records USING gin (fts);
-- The rows FTS5's records_fts holds, under its name, so counts read the same on both
-- backends (FTS5's MATCH syntax stays SQLite's).
CREATE VIEW records_fts AS SELECT id AS rowid, content, event, fts FROM records;

CREATE TABLE records_vec (
    rowid      BIGINT PRIMARY KEY REFERENCES records(id) ON DELETE CASCADE,
    channel_pk BIGINT NOT NULL,
    embedding  vector({dim}) NOT NULL
);
CREATE INDEX records_vec_channel ON records_vec (channel_pk);
"""
    )


def segment_claims_sql() -> str:
    """Lease columns of the segments (idempotent: the base schema may already have them)."""
    return """
ALTER TABLE segments ADD COLUMN IF NOT EXISTS claimed_by TEXT;
ALTER TABLE segments ADD COLUMN IF NOT EXISTS lease_until DOUBLE PRECISION;
CREATE INDEX IF NOT EXISTS segments_pending_channel ON segments (channel_pk, id)
    WHERE state = 'pending';
"""
