"""SQLite migration 12: Chinese, Japanese and Korean text indexed as character n-grams.

FTS5's unicode61 tokenizer keeps a run of CJK characters as one token, so no query word
found a word inside it. Three ways were measured (docs/concepts/multilingual.md): the
trigram tokenizer (finds no word of one or two characters, the most common in Chinese,
and triples the index of English text), a second FTS5 table for CJK (BM25 would then add
two indexes' scores with their own statistics), and pre-segmented text. The indexes take
the third: they index `speakermem_segment(text)` (memory/search/cjk.py's `index_text`,
registered on every connection by memory/store/sqlite/driver.py), which is the text itself
when it holds no CJK, so English rows keep their tokens, positions and BM25 lengths.

The content views pass each column through it, and the triggers delete and insert the same
segmented values FTS5 indexed. `records_fts` gets a content view too (it read `records`
directly), so it is created again and rebuilt. Messages are re-indexed in batches, only
those with CJK in their text or speaker name (the others index the same tokens), with a
progress report after each batch.
"""

from __future__ import annotations

import logging

from speakermem.memory.store.database import Transaction
from speakermem.memory.store.schema import MigrationProgress

log = logging.getLogger(__name__)

REINDEX_BATCH = 2_000
"""Messages re-indexed per statement pair (and per progress report)."""

CJK_INDEX = """
DROP TRIGGER messages_fts_ad;
DROP TRIGGER messages_fts_au;
DROP VIEW messages_fts_source;
CREATE VIEW messages_fts_source AS
    SELECT id, speakermem_segment(text) AS text, speakermem_segment(speaker_name) AS speaker_name,
           'c' || channel_pk AS channel_tag
    FROM messages WHERE deleted_at IS NULL;
CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages WHEN old.deleted_at IS NULL BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text, speaker_name, channel_tag)
    VALUES ('delete', old.id, speakermem_segment(old.text), speakermem_segment(old.speaker_name),
            'c' || old.channel_pk);
END;
CREATE TRIGGER messages_fts_au AFTER UPDATE OF text, speaker_name, deleted_at ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text, speaker_name, channel_tag)
    SELECT 'delete', old.id, speakermem_segment(old.text), speakermem_segment(old.speaker_name),
           'c' || old.channel_pk
    WHERE old.deleted_at IS NULL;
    INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)
    SELECT new.id, speakermem_segment(new.text), speakermem_segment(new.speaker_name),
           'c' || new.channel_pk
    WHERE new.deleted_at IS NULL;
END;

DROP TRIGGER records_fts_ai;
DROP TRIGGER records_fts_ad;
DROP TRIGGER records_fts_au;
DROP TABLE records_fts;
CREATE VIEW records_fts_source AS
    SELECT id, speakermem_segment(content) AS content, speakermem_segment(event) AS event
    FROM records;
CREATE VIRTUAL TABLE records_fts USING fts5(
    content, event,
    content = 'records_fts_source', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER records_fts_ai AFTER INSERT ON records BEGIN
    INSERT INTO records_fts (rowid, content, event)
    VALUES (new.id, speakermem_segment(new.content), speakermem_segment(new.event));
END;
CREATE TRIGGER records_fts_ad AFTER DELETE ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, event)
    VALUES ('delete', old.id, speakermem_segment(old.content), speakermem_segment(old.event));
END;
CREATE TRIGGER records_fts_au AFTER UPDATE OF content, event ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, event)
    VALUES ('delete', old.id, speakermem_segment(old.content), speakermem_segment(old.event));
    INSERT INTO records_fts (rowid, content, event)
    VALUES (new.id, speakermem_segment(new.content), speakermem_segment(new.event));
END;
"""


async def reindex_cjk(tx: Transaction, progress: MigrationProgress) -> None:
    """Index the live messages with CJK again as n-grams (their old tokens out, the
    segmented ones in), in batches; then rebuild the new records index."""
    rows = await tx.fetchall(
        "SELECT id FROM messages WHERE deleted_at IS NULL"
        " AND (speakermem_segment(text) IS NOT text"
        " OR speakermem_segment(speaker_name) IS NOT speaker_name) ORDER BY id"
    )
    ids = [int(r[0]) for r in rows]
    progress("messages", 0, len(ids))
    for start in range(0, len(ids), REINDEX_BATCH):
        batch = ids[start : start + REINDEX_BATCH]
        marks = ", ".join("?" * len(batch))
        # the old tokens are those of the raw columns (the view before this migration)
        await tx.execute(
            "INSERT INTO messages_fts (messages_fts, rowid, text, speaker_name, channel_tag)"
            " SELECT 'delete', id, text, speaker_name, 'c' || channel_pk FROM messages"
            f" WHERE id IN ({marks})",
            batch,
        )
        await tx.execute(
            "INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)"
            " SELECT id, text, speaker_name, channel_tag FROM messages_fts_source"
            f" WHERE id IN ({marks})",
            batch,
        )
        progress("messages", start + len(batch), len(ids))
    ((n_records,),) = await tx.fetchall("SELECT count(*) FROM records")
    progress("records", 0, int(n_records))
    await tx.execute("INSERT INTO records_fts (records_fts) VALUES ('rebuild')")
    progress("records", int(n_records), int(n_records))
    log.info("re-indexed %d messages and %d records with CJK n-grams", len(ids), n_records)
