"""PostgreSQL DDL for System 1's search objects: the messages' full-text and dense indexes.

pg/schema.py creates the plain tables (messages, sessions, early_changes, ...); this module
adds, as later migrations, what SQLite builds from FTS5 and sqlite-vec:

- Full text: a stored generated `tsvector` column `messages.fts` (text weighted 'A', the
  speaker's name 'B', like FTS5's `text` and `speaker_name` columns weighted 1.0 and 0.5)
  under a partial GIN index over live messages, and `messages.fts_len`, the row's token
  count (BM25's document length). The text search configuration `speakermem` stems
  English words with Snowball but keeps every word (FTS5's porter tokenizer drops no
  stop-words either: quoted speaker names must keep "the" and "of"), and punctuation
  becomes a space before parsing, so "example.com", "3.5" and "well-known" split into
  words as unicode61 splits them (Postgres' parser would keep host names, numbers and
  compounds as single tokens). Generated columns follow every update of `text` and
  `speaker_name` (an edit, a forget) without triggers. A `messages_fts` view lists the
  rows FTS5's table would hold (live messages), so counts read the same on both backends.
- Dense: `message_vectors (id, embedding BYTEA)` (pg/schema.py) keeps the float32 payload
  exactly as SQLite does (the interaction graph and the evaluation read it with numpy);
  `messages_vec (rowid, channel_pk, embedding vector(N))` is the pgvector index, searched
  exactly per channel by inner product (the vectors are unit length: inner product =
  cosine). The column is named `rowid` so the cascades written for vec0
  (`DELETE FROM messages_vec WHERE rowid = ?`) run unchanged.
- Dense coarse pass (a later migration, `messages_bits_sql`): `messages_bits (rowid,
  channel_pk, bits bit(N))`, the sign bits of each vector (`binary_quantize`, what
  SQLite's vec0 index holds), so a search scans a narrow table (~100 bytes a row instead
  of messages_vec's ~1.6 kB) by Hamming distance and re-scores the closest exactly, as on
  SQLite. A trigger on messages_vec fills it for every writer; deletes cascade.
- Locality (a later migration, `messages_search_locality_sql`): `fts` also holds the
  row's channel tag `c:<channel pk>` (FTS5's `channel_tag` column), and the sign bits sit
  in a covering index per channel, so searching one channel of many reads index pages of
  that channel instead of heap pages shared with every other channel.
- Columns in the index (a later migration, `messages_speaker_lexemes_sql`): the speaker
  name's words are stored as lexemes of their own, `s:<word>` (SPEAKER_PREFIX), so the
  GIN index tells "this word in the text" from "this word in the name"; a weight label is
  checked on the heap only (a name searched in the text read 26k rows to keep 400).
"""

from __future__ import annotations

from speakermem.memory.store.schema import EMBED_DIM

TS_CONFIG = "speakermem"
SPEAKER_PREFIX = "s:"
"""What the speaker name's lexemes start with in `messages.fts` (FTS5's `speaker_name`
column). Text lexemes hold no punctuation (`fts_input`), so none starts with it."""


def fts_input(expr: str) -> str:
    """The SQL that turns a text expression into what the tsvector parses: punctuation
    runs become one space. Queries must normalise their words with the same expression."""
    return f"regexp_replace({expr}, '[[:punct:]]+', ' ', 'g')"


def fts_document(text: str = "text", speaker_name: str = "speaker_name") -> str:
    """The weighted tsvector of a message row: text 'A', speaker name 'B'."""
    return (
        f"setweight(to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(text)}), 'A')"
        f" || setweight(to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(speaker_name)}), 'B')"
    )


def text_search_config_sql() -> str:
    """The `speakermem` text search configuration (English Snowball stems, no stop-words).

    Idempotent, so the records' migration can create it again if it runs alone."""
    return f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_dict WHERE dictname = '{TS_CONFIG}_stem') THEN
        CREATE TEXT SEARCH DICTIONARY {TS_CONFIG}_stem (TEMPLATE = snowball, Language = english);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = '{TS_CONFIG}') THEN
        CREATE TEXT SEARCH CONFIGURATION {TS_CONFIG} (COPY = english);
        ALTER TEXT SEARCH CONFIGURATION {TS_CONFIG}
            ALTER MAPPING FOR asciiword, word, numword, asciihword, hword, numhword,
                hword_asciipart, hword_part, hword_numpart
            WITH {TS_CONFIG}_stem;
    END IF;
END
$$;
"""


def messages_search_sql(dim: int = EMBED_DIM) -> str:
    """Full-text and vector objects of the messages table (one migration)."""
    return (
        text_search_config_sql()
        + f"""
CREATE EXTENSION IF NOT EXISTS vector;

-- BM25's document length: tokens (positions) of the row, plus the channel tag FTS5 counts.
CREATE FUNCTION speakermem_tokens(doc tsvector) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(sum(array_length(positions, 1)), 0) FROM unnest(doc));

ALTER TABLE messages ADD COLUMN fts tsvector
    GENERATED ALWAYS AS ({fts_document()}) STORED;
ALTER TABLE messages ADD COLUMN fts_len integer
    GENERATED ALWAYS AS (speakermem_tokens({fts_document()}) + 1) STORED;
-- Live messages only: every search filters on deleted_at IS NULL (tombstones keep no text).
CREATE INDEX messages_fts_gin ON messages USING gin (fts) WHERE deleted_at IS NULL;
-- The rows FTS5's messages_fts holds (live messages), under its name, so row counts and
-- diagnostics read the same on both backends (FTS5's MATCH syntax stays SQLite's).
CREATE VIEW messages_fts AS
    SELECT id AS rowid, text, speaker_name, 'c' || channel_pk AS channel_tag, fts
    FROM messages WHERE deleted_at IS NULL;

CREATE TABLE messages_vec (
    rowid      BIGINT PRIMARY KEY REFERENCES messages(id),
    channel_pk BIGINT NOT NULL,
    embedding  vector({dim}) NOT NULL
);
CREATE INDEX messages_vec_channel ON messages_vec (channel_pk);
"""
    )


def messages_bits_sql(dim: int = EMBED_DIM) -> str:
    """`messages_bits`: the sign bits of every message vector, for the coarse Hamming scan
    (one migration). A trigger on messages_vec keeps it in step with every writer (ingest,
    `speakermem migrate`); deleting a messages_vec row deletes its bits (cascade)."""
    return f"""
CREATE TABLE messages_bits (
    rowid      BIGINT PRIMARY KEY REFERENCES messages_vec(rowid) ON DELETE CASCADE,
    channel_pk BIGINT NOT NULL,
    bits       bit({dim}) NOT NULL
);
CREATE INDEX messages_bits_channel ON messages_bits (channel_pk);
CREATE FUNCTION messages_bits_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO messages_bits (rowid, channel_pk, bits)
    VALUES (NEW.rowid, NEW.channel_pk, binary_quantize(NEW.embedding)::bit({dim}))
    ON CONFLICT (rowid) DO UPDATE SET channel_pk = excluded.channel_pk, bits = excluded.bits;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_bits_sync AFTER INSERT OR UPDATE ON messages_vec
    FOR EACH ROW EXECUTE FUNCTION messages_bits_sync();
INSERT INTO messages_bits (rowid, channel_pk, bits)
    SELECT rowid, channel_pk, binary_quantize(embedding)::bit({dim}) FROM messages_vec;
"""


def message_vectors_cascade_sql() -> str:
    """The vectors of a message go with its row (one migration): `messages_vec` and
    `message_vectors` reference messages(id) ON DELETE CASCADE (and `messages_bits` follows
    messages_vec). SpeakerMem itself only tombstones messages (a forget deletes the vectors
    explicitly, retention likewise), but a row deleted by hand or by a later cleanup must not
    be refused for its index rows: SQLite's vec0 table and plain FTS5 never refuse it."""
    return """
ALTER TABLE messages_vec
    DROP CONSTRAINT messages_vec_rowid_fkey,
    ADD CONSTRAINT messages_vec_rowid_fkey
        FOREIGN KEY (rowid) REFERENCES messages(id) ON DELETE CASCADE;
ALTER TABLE message_vectors
    DROP CONSTRAINT message_vectors_id_fkey,
    ADD CONSTRAINT message_vectors_id_fkey
        FOREIGN KEY (id) REFERENCES messages(id) ON DELETE CASCADE;
"""


def messages_unembedded_sql() -> str:
    """The pending set of the embedder as its own table (one migration).

    `messages_unembedded (id)` lists the live messages that wait for a vector; storing a
    vector deletes its row there instead of updating `messages`. An update of `embedded`
    (which the partial index `messages_unembedded` filtered on) could never be HOT: every
    embedded message wrote a new version of its `messages` row and entries in each of the
    table's indexes (the full-text GIN index among them); `messages` rows now stay as the
    ingest wrote them. The index goes, the table takes its name.

    Triggers turn what the writers say in `messages.embedded` into rows of the set, so the
    SQL shared with SQLite (an edit sets `embedded = 0`, a forget's tombstone sets 1) and
    `speakermem migrate` (which copies the source's flag) need no change: a live row inserted
    with `embedded = 0` joins it; an update that changes a row's text, speaker name, flag or
    deletion puts it in when the row is live with `embedded = 0`, else takes it out (the
    writer stored or copied its vector, or forgot it); a deleted row leaves by the cascade
    (by a trigger since `messages_unembedded_nofk_sql`).
    On PostgreSQL `messages.embedded` is therefore what the row's last writer said, not
    whether a vector exists now (store_vectors no longer writes it); read the table."""
    return """
DROP INDEX messages_unembedded;
CREATE TABLE messages_unembedded (
    id BIGINT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE
);
INSERT INTO messages_unembedded (id)
    SELECT id FROM messages WHERE embedded = 0 AND deleted_at IS NULL;
CREATE FUNCTION messages_unembedded_ai() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO messages_unembedded (id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_unembedded_ai AFTER INSERT ON messages
    FOR EACH ROW WHEN (NEW.embedded = 0 AND NEW.deleted_at IS NULL)
    EXECUTE FUNCTION messages_unembedded_ai();
CREATE FUNCTION messages_unembedded_au() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.embedded = 0 AND NEW.deleted_at IS NULL THEN
        INSERT INTO messages_unembedded (id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM messages_unembedded WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_unembedded_au AFTER UPDATE OF text, speaker_name, embedded, deleted_at
    ON messages FOR EACH ROW
    WHEN (NEW.text IS DISTINCT FROM OLD.text OR NEW.speaker_name IS DISTINCT FROM OLD.speaker_name
          OR NEW.embedded IS DISTINCT FROM OLD.embedded
          OR NEW.deleted_at IS DISTINCT FROM OLD.deleted_at)
    EXECUTE FUNCTION messages_unembedded_au();
"""


def channel_tag(channel_pk: str = "channel_pk") -> str:
    """The SQL of a message row's channel tag: one positionless lexeme `c:<channel pk>`
    (FTS5's `channel_tag` column on SQLite). Query lexemes never hold punctuation (the
    text search input has none), so no query term can match a tag."""
    return f"array_to_tsvector(ARRAY['c:' || ({channel_pk})::text])"


def messages_search_locality_sql() -> str:
    """Search by channel without touching other channels' rows (one migration).

    - Full text: `messages.fts` also holds the row's channel tag (`channel_tag`), so a
      channel's matches come out of the GIN index alone (`fts @@ speakermem_channels(pks)`
      beside the terms: the index intersects the posting lists) instead of every
      channel's matches being read from the heap and filtered there. `fts_len` is
      unchanged (it already counts one token for the tag, as FTS5 does).
    - Dense: `messages_bits_channel` becomes a covering index `(channel_pk) INCLUDE
      (rowid, bits)`: the Hamming scan of a channel reads its contiguous leaf pages
      (index-only) instead of one heap page per row of a channel whose rows interleave
      with every other channel's.
    Existing rows get their tags by the rewrite that SET EXPRESSION does."""
    return f"""
CREATE FUNCTION speakermem_channels(pks bigint[]) RETURNS tsquery
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT string_agg(quote_literal('c:' || pk::text), ' | ') FROM unnest(pks) AS pk)::tsquery;
ALTER TABLE messages ALTER COLUMN fts SET EXPRESSION AS ({fts_document()} || {channel_tag()});
CREATE INDEX messages_bits_channel_cover ON messages_bits (channel_pk) INCLUDE (rowid, bits);
DROP INDEX messages_bits_channel;
ANALYZE messages;
ANALYZE messages_bits;
"""


def messages_unembedded_nofk_sql() -> str:
    """The pending set without its foreign key (one migration): checking the key of every
    ingested message (a key-share lock on the row the same transaction just inserted) made a
    batch of 20,000 messages ingest at a quarter of its pace without it. A statement-level
    trigger takes deleted messages out of the set instead (the cascade's part); the readers
    join `messages` anyway, so no row there can hand out a message that is gone."""
    return """
ALTER TABLE messages_unembedded DROP CONSTRAINT IF EXISTS messages_unembedded_id_fkey;
CREATE FUNCTION messages_unembedded_ad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM messages_unembedded WHERE id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_unembedded_ad AFTER DELETE ON messages
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION messages_unembedded_ad();
DELETE FROM messages_unembedded u WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = u.id);
"""


# A tsvector's lexemes can only be renamed through its text form, where each one is quoted
# and starts the text or follows a space ('alic':3 'ng':4): the prefix goes after each
# quote that follows a space. Lexemes hold no quote and no space (`fts_input` turns
# punctuation into spaces, the parser splits on them), so every such quote opens a lexeme.
# A plain replace adds 0.5 us to the document of each message ingested (a regular
# expression 3.5 us, rebuilding the tsvector lexeme by lexeme 7 us).
_SPEAKER_LEXEMES = """
CREATE FUNCTION speakermem_speaker_lexemes(doc tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ltrim(replace(' ' || doc::text, ' ''', ' ''{prefix}'))::tsvector;
"""


def fts_document_v2(text: str = "text", speaker_name: str = "speaker_name") -> str:
    """The tsvector of a message row since `messages_speaker_lexemes_sql`: the text's
    lexemes weighted 'A', the speaker name's as `s:` lexemes weighted 'B', at the positions
    `fts_document` gives them (so `fts_len`, which counts positions, is unchanged)."""
    return (
        f"setweight(to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(text)}), 'A')"
        " || setweight(speakermem_speaker_lexemes("
        f"to_tsvector('{TS_CONFIG}'::regconfig, {fts_input(speaker_name)})), 'B')"
    )


def messages_speaker_lexemes_sql() -> str:
    """The speaker name's words as lexemes of their own in `messages.fts` (one migration).

    The GIN index keeps lexemes, not weights: a query for a word in one column only (a
    roster name searched in the text, a name searched as the speaker) read every row
    holding the word in either column from the heap to check its weight there. Stored as
    `s:<word>`, the name's words no longer share a posting list with the text's. Existing
    rows are rewritten by SET EXPRESSION; ANALYZE reads the new lexemes' frequencies
    (document frequencies are estimated from them, memory/store/pg/bm25.py)."""
    return (
        _SPEAKER_LEXEMES.format(prefix=SPEAKER_PREFIX)
        + f"""
ALTER TABLE messages ALTER COLUMN fts SET EXPRESSION AS ({fts_document_v2()} || {channel_tag()});
ANALYZE messages;
"""
    )
