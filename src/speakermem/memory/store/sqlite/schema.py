"""SQLite's ordered, recorded migrations. Each runs once, in its own transaction.

Never edit a released migration: append a new one. `schema_migrations` records
what ran and when, so a database opened by a newer build upgrades in place.
"""

from __future__ import annotations

from speakermem.memory.store.schema import (
    EMBED_DIM,
    PENDING_SEGMENT_INDEXES,
    RECONCILE_DETAIL,
    STORE_META,
    VECTOR_DRAFTS,
    Migration,
    tombstone_backfill,
)
from speakermem.memory.store.sqlite.cjk_index import CJK_INDEX, reindex_cjk


def _initial(chunk_size: int) -> str:
    return f"""
CREATE TABLE channels (
    id          INTEGER PRIMARY KEY,
    platform    TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    channel     TEXT NOT NULL,
    name        TEXT,
    is_private  INTEGER NOT NULL DEFAULT 0,
    enabled     INTEGER NOT NULL DEFAULT 1,
    created_at  REAL NOT NULL,
    last_ts     REAL,
    session_id  INTEGER NOT NULL DEFAULT 0,
    next_turn   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (platform, workspace, channel)
);

CREATE TABLE sessions (
    channel_pk  INTEGER NOT NULL REFERENCES channels(id),
    platform    TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    channel     TEXT NOT NULL,
    session_id  INTEGER NOT NULL,
    started_at  REAL NOT NULL,
    PRIMARY KEY (channel_pk, session_id)
) WITHOUT ROWID;

CREATE TABLE users (
    platform     TEXT NOT NULL,
    workspace    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    display_name TEXT NOT NULL,
    is_bot       INTEGER NOT NULL DEFAULT 0,
    updated_at   REAL NOT NULL,
    PRIMARY KEY (platform, workspace, user_id)
) WITHOUT ROWID;

CREATE TABLE user_aliases (
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    alias      TEXT NOT NULL,
    alias_norm TEXT NOT NULL,
    PRIMARY KEY (platform, workspace, user_id, alias_norm)
) WITHOUT ROWID;

CREATE TABLE roster (
    channel_pk INTEGER NOT NULL REFERENCES channels(id),
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    channel    TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    joined_at  REAL,
    left_at    REAL,
    PRIMARY KEY (channel_pk, user_id)
) WITHOUT ROWID;

CREATE TABLE messages (
    id           INTEGER PRIMARY KEY,
    channel_pk   INTEGER NOT NULL REFERENCES channels(id),
    platform     TEXT NOT NULL,
    workspace    TEXT NOT NULL,
    channel      TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    thread_id    TEXT,
    speaker_id   TEXT NOT NULL,
    speaker_name TEXT NOT NULL,
    text         TEXT NOT NULL,
    ts           REAL NOT NULL,
    session_id   INTEGER NOT NULL,
    turn_index   INTEGER NOT NULL,
    reply_to     TEXT,
    addressees   TEXT NOT NULL DEFAULT '[]',
    edited_at    REAL,
    deleted_at   REAL,
    segment_id   INTEGER,
    embedded     INTEGER NOT NULL DEFAULT 0,
    UNIQUE (channel_pk, message_id)
);
CREATE INDEX messages_channel_ts ON messages (channel_pk, ts);
CREATE INDEX messages_session ON messages (channel_pk, session_id, turn_index);
CREATE INDEX messages_speaker ON messages (channel_pk, speaker_id);
CREATE INDEX messages_segment ON messages (segment_id);
CREATE INDEX messages_unembedded ON messages (id) WHERE embedded = 0 AND deleted_at IS NULL;

-- Full-text index over live messages. Each row also carries a `c<channel pk>` token in
-- channel_tag so a search ANDs its channels into the MATCH: FTS5 then scores only the
-- channel's matches (bm25 over every match of a common word in all channels took hundreds
-- of ms at 1M messages). The content is a view, so deleted messages leave the index and
-- 'rebuild' / 'integrity-check' still work.
CREATE VIEW messages_fts_source AS
    SELECT id, text, speaker_name, 'c' || channel_pk AS channel_tag FROM messages
    WHERE deleted_at IS NULL;
CREATE VIRTUAL TABLE messages_fts USING fts5(
    text, speaker_name, channel_tag,
    content = 'messages_fts_source', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
-- No AFTER INSERT trigger: MessageRepo.ingest indexes each batch with one INSERT ... SELECT.
-- A per-row trigger makes FTS5 flush its pending terms on every row's statement savepoint
-- (a new index segment per message, then constant merging): ingest ran at ~4k msg/s with it.
CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages WHEN old.deleted_at IS NULL BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text, speaker_name, channel_tag)
    VALUES ('delete', old.id, old.text, old.speaker_name, 'c' || old.channel_pk);
END;
CREATE TRIGGER messages_fts_au AFTER UPDATE OF text, speaker_name, deleted_at ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text, speaker_name, channel_tag)
    SELECT 'delete', old.id, old.text, old.speaker_name, 'c' || old.channel_pk
    WHERE old.deleted_at IS NULL;
    INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)
    SELECT new.id, new.text, new.speaker_name, 'c' || new.channel_pk
    WHERE new.deleted_at IS NULL;
END;

-- Dense index: binary-quantised vectors partitioned by channel for a cheap coarse KNN,
-- float vectors kept beside them for exact re-scoring of the candidates.
CREATE VIRTUAL TABLE messages_vec USING vec0(
    channel_pk integer partition key,
    embedding bit[{EMBED_DIM}],
    chunk_size = {chunk_size}
);
CREATE TABLE message_vectors (
    id        INTEGER PRIMARY KEY REFERENCES messages(id),
    embedding BLOB NOT NULL
);

CREATE TABLE segments (
    id              INTEGER PRIMARY KEY,
    channel_pk      INTEGER NOT NULL REFERENCES channels(id),
    platform        TEXT NOT NULL,
    workspace       TEXT NOT NULL,
    channel         TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('open', 'pending', 'done')),
    n_messages      INTEGER NOT NULL DEFAULT 0,
    opened_at       REAL NOT NULL,
    last_message_at REAL NOT NULL,
    closed_at       REAL,
    done_at         REAL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_error      TEXT
);
CREATE UNIQUE INDEX segments_one_open ON segments (channel_pk) WHERE state = 'open';
CREATE INDEX segments_state ON segments (state, next_attempt_at);

CREATE TABLE records (
    id             INTEGER PRIMARY KEY,
    channel_pk     INTEGER NOT NULL REFERENCES channels(id),
    platform       TEXT NOT NULL,
    workspace      TEXT NOT NULL,
    channel        TEXT NOT NULL,
    layer          TEXT NOT NULL CHECK (layer IN ('core', 'profile', 'interaction', 'insight')),
    record_scope   TEXT NOT NULL CHECK (record_scope IN ('PERSON', 'GROUP')),
    content        TEXT NOT NULL CHECK (length(content) > 0),
    source         TEXT NOT NULL,
    owner          TEXT NOT NULL,
    event          TEXT NOT NULL DEFAULT '',
    time           REAL NOT NULL,
    session_id     INTEGER,
    state          TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'superseded')),
    from_ids       TEXT NOT NULL
                   CHECK (json_valid(from_ids) AND json_array_length(from_ids) > 0),
    supersedes     INTEGER REFERENCES records(id),
    superseded_by  INTEGER REFERENCES records(id),
    chain_root     INTEGER NOT NULL,
    writer_model   TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    segment_id     INTEGER REFERENCES segments(id),
    created_at     REAL NOT NULL
);
CREATE INDEX records_owner ON records (channel_pk, owner, state);
CREATE INDEX records_source ON records (channel_pk, source, state);
CREATE INDEX records_chain ON records (chain_root);
CREATE INDEX records_segment ON records (segment_id);

CREATE TABLE record_sources (
    record_id  INTEGER NOT NULL REFERENCES records(id),
    message_pk INTEGER NOT NULL REFERENCES messages(id),
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    channel    TEXT NOT NULL,
    PRIMARY KEY (record_id, message_pk)
) WITHOUT ROWID;
CREATE INDEX record_sources_message ON record_sources (message_pk);

CREATE VIRTUAL TABLE records_fts USING fts5(
    content, event,
    content = 'records', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER records_fts_ai AFTER INSERT ON records BEGIN
    INSERT INTO records_fts (rowid, content, event) VALUES (new.id, new.content, new.event);
END;
CREATE TRIGGER records_fts_ad AFTER DELETE ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, event)
    VALUES ('delete', old.id, old.content, old.event);
END;
CREATE TRIGGER records_fts_au AFTER UPDATE OF content, event ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, event)
    VALUES ('delete', old.id, old.content, old.event);
    INSERT INTO records_fts (rowid, content, event) VALUES (new.id, new.content, new.event);
END;

CREATE VIRTUAL TABLE records_vec USING vec0(
    channel_pk integer partition key,
    embedding float[{EMBED_DIM}] distance_metric=cosine,
    chunk_size = {chunk_size}
);

CREATE TABLE writer_runs (
    id                INTEGER PRIMARY KEY,
    segment_id        INTEGER NOT NULL REFERENCES segments(id),
    platform          TEXT NOT NULL,
    workspace         TEXT NOT NULL,
    channel           TEXT NOT NULL,
    started_at        REAL NOT NULL,
    latency_ms        REAL NOT NULL,
    model             TEXT NOT NULL,
    prompt_version    TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    proposed          INTEGER NOT NULL DEFAULT 0,
    accepted          INTEGER NOT NULL DEFAULT 0,
    noops             INTEGER NOT NULL DEFAULT 0,
    rejected          TEXT NOT NULL DEFAULT '{{}}',
    outcome           TEXT NOT NULL,
    error             TEXT
);
CREATE INDEX writer_runs_segment ON writer_runs (segment_id);
"""


INTERACTIONS = """
-- Who each message speaks to, and how that was found (issue 11). The messages.addressees
-- column keeps the platform's own tags; these rows add the inferred ones beside them.
CREATE TABLE message_addressees (
    message_pk INTEGER NOT NULL,
    addressee  TEXT NOT NULL,
    how        TEXT NOT NULL
               CHECK (how IN ('platform', 'reply', 'vocative', 'name_start', 'adjacency')),
    PRIMARY KEY (message_pk, addressee)
) WITHOUT ROWID;
CREATE INDEX message_addressees_to ON message_addressees (addressee, message_pk);
-- The turn each message answers: the platform's reply/thread parent, or an inferred one.
CREATE TABLE message_links (
    message_pk INTEGER PRIMARY KEY,
    parent_pk  INTEGER NOT NULL,
    how        TEXT NOT NULL CHECK (how IN ('explicit', 'addressed', 'overlap', 'previous'))
);
CREATE INDEX message_links_parent ON message_links (parent_pk);
-- How far the inference pass has read each channel (message pks only grow).
CREATE TABLE interaction_cursor (
    channel_pk INTEGER PRIMARY KEY,
    last_pk    INTEGER NOT NULL
);
CREATE TRIGGER message_interactions_ad AFTER DELETE ON messages BEGIN
    DELETE FROM message_addressees WHERE message_pk = old.id;
    DELETE FROM message_links WHERE message_pk = old.id OR parent_pk = old.id;
END;
"""


GOVERNANCE = """
-- Per-channel policy, keyed by the channel's ids so a channel can be switched off before
-- its first message. enabled NULL = the default setting applies.
CREATE TABLE channel_policy (
    platform         TEXT NOT NULL,
    workspace        TEXT NOT NULL,
    channel          TEXT NOT NULL,
    enabled          INTEGER,
    retention_days   INTEGER CHECK (retention_days IS NULL OR retention_days > 0),
    notice_posted_at REAL,
    updated_at       REAL NOT NULL,
    updated_by       TEXT,
    PRIMARY KEY (platform, workspace, channel)
) WITHOUT ROWID;

CREATE TABLE workspace_policy (
    platform       TEXT NOT NULL,
    workspace      TEXT NOT NULL,
    retention_days INTEGER CHECK (retention_days IS NULL OR retention_days > 0),
    updated_at     REAL NOT NULL,
    updated_by     TEXT,
    PRIMARY KEY (platform, workspace)
) WITHOUT ROWID;

CREATE TABLE user_prefs (
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    opted_out  INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL,
    PRIMARY KEY (platform, workspace, user_id)
) WITHOUT ROWID;

-- Admin actions with their receipts (counts per table, never the forgotten text).
CREATE TABLE audit_log (
    id        INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
    platform  TEXT NOT NULL,
    workspace TEXT NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL DEFAULT '',
    args      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(args)),
    receipt   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(receipt))
);
CREATE INDEX audit_log_at ON audit_log (at);

-- Records withdrawn because a cited message was forgotten while other cited messages remain:
-- the Writer derives again from what is left. Only coordinates are kept, never the content.
CREATE TABLE rederive_queue (
    id              INTEGER PRIMARY KEY,
    channel_pk      INTEGER NOT NULL REFERENCES channels(id),
    platform        TEXT NOT NULL,
    workspace       TEXT NOT NULL,
    channel         TEXT NOT NULL,
    layer           TEXT NOT NULL,
    owner           TEXT NOT NULL,
    source          TEXT NOT NULL,
    from_ids        TEXT NOT NULL CHECK (json_valid(from_ids)),
    reason          TEXT NOT NULL,
    queued_at       REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_error      TEXT
);
CREATE INDEX rederive_queue_channel ON rederive_queue (channel_pk);
"""


ROSTER_REVISIONS = """
-- Each channel's roster revision: bumped by any change to its roster rows, and to the
-- names, bot flags or aliases of its members. /recall caches a channel's roster (thousands
-- of members in a large community) and re-reads it only when this moved.
ALTER TABLE channels ADD COLUMN roster_rev INTEGER NOT NULL DEFAULT 0;
-- A user's channels (the access check of every /recall, and the triggers below) without
-- scanning every roster row of the workspace.
CREATE INDEX roster_user ON roster (platform, workspace, user_id);
CREATE TRIGGER roster_rev_ai AFTER INSERT ON roster BEGIN
    UPDATE channels SET roster_rev = roster_rev + 1 WHERE id = new.channel_pk;
END;
CREATE TRIGGER roster_rev_au AFTER UPDATE ON roster BEGIN
    UPDATE channels SET roster_rev = roster_rev + 1 WHERE id IN (old.channel_pk, new.channel_pk);
END;
CREATE TRIGGER roster_rev_ad AFTER DELETE ON roster BEGIN
    UPDATE channels SET roster_rev = roster_rev + 1 WHERE id = old.channel_pk;
END;
"""
_MEMBER_TRIGGERS = [
    ("users", "ai", "AFTER INSERT", "new"),
    ("users", "au", "AFTER UPDATE OF display_name, is_bot", "new"),
    ("users", "ad", "AFTER DELETE", "old"),
    ("user_aliases", "ai", "AFTER INSERT", "new"),
    ("user_aliases", "ad", "AFTER DELETE", "old"),
]
ROSTER_REVISIONS += "".join(
    f"CREATE TRIGGER roster_rev_{table}_{tag} {when} ON {table} BEGIN\n"
    "    UPDATE channels SET roster_rev = roster_rev + 1 WHERE id IN (SELECT channel_pk FROM"
    f" roster WHERE platform = {row}.platform AND workspace = {row}.workspace"
    f" AND user_id = {row}.user_id);\nEND;\n"
    for table, tag, when, row in _MEMBER_TRIGGERS
)


CATCHUP = """
CREATE TABLE catchup_cursors (
    platform TEXT NOT NULL,
    workspace TEXT NOT NULL,
    channel TEXT NOT NULL,
    kind TEXT NOT NULL,            -- 'catchup' (after downtime) or 'backfill' (admin)
    cursor_id TEXT,                -- newest message fetched so far (platform id)
    cursor_ts REAL,
    fetched INTEGER NOT NULL DEFAULT 0,
    finished INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL,
    PRIMARY KEY (platform, workspace, channel, kind)
);
"""


EARLY_CHANGES = """
-- Edits and deletes that arrived before their message (platforms, retries and catch-up
-- deliver out of order). A delete is kept as a tombstone, so the create that follows is
-- stored already forgotten; an edit keeps only the newest text (by edited_at), applied
-- when the create arrives. Rows leave when their message is stored.
CREATE TABLE early_changes (
    platform    TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    channel     TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    deleted_at  REAL,
    text        TEXT,
    edited_at   REAL,
    received_at REAL NOT NULL,
    PRIMARY KEY (platform, workspace, channel, message_id)
) WITHOUT ROWID;
"""


SEGMENT_CLAIMS = """
-- Writer workers lease segments: who holds one and until when. A lease that runs out (the
-- worker died) makes the segment claimable again.
ALTER TABLE segments ADD COLUMN claimed_by TEXT;
ALTER TABLE segments ADD COLUMN lease_until REAL;
"""


FORGETTING = """
-- One switch per channel: channels.enabled (kept in step with channel_policy until now)
-- folds into channel_policy, where a channel switched off only there stays off.
INSERT INTO channel_policy (platform, workspace, channel, enabled, updated_at, updated_by)
    SELECT platform, workspace, channel, 0, (julianday('now') - 2440587.5) * 86400.0,
        'migration' FROM channels WHERE enabled = 0
    ON CONFLICT (platform, workspace, channel) DO UPDATE SET enabled = 0
    WHERE channel_policy.enabled IS NULL;
ALTER TABLE channels DROP COLUMN enabled;

-- The key of the keyed hashes below (speakermem.memory.governance.tombstones), one per database.
CREATE TABLE store_secrets (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO store_secrets (name, value) VALUES ('tombstone_key', lower(hex(randomblob(32))));

-- Forgotten people stay out until they opt in or an admin lifts it: a keyed hash of the
-- person and of each of their names, never the id or the name itself.
CREATE TABLE forgotten_people (
    platform     TEXT NOT NULL,
    workspace    TEXT NOT NULL,
    person_key   TEXT NOT NULL,
    forgotten_at REAL NOT NULL,
    PRIMARY KEY (platform, workspace, person_key)
) WITHOUT ROWID;
CREATE TABLE forgotten_names (
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    name_key   TEXT NOT NULL,
    person_key TEXT NOT NULL,
    PRIMARY KEY (platform, workspace, name_key, person_key)
) WITHOUT ROWID;

-- Who wrote an early edit (when the platform says), so an opt-out or a forget drops its text.
ALTER TABLE early_changes ADD COLUMN author_id TEXT;

-- Forgets in progress: a forget that fails part-way stays open and is resumed until done.
CREATE TABLE forget_jobs (
    id         INTEGER PRIMARY KEY,
    platform   TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    args       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(args)),
    started_at REAL NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    done_at    REAL
);
CREATE INDEX forget_jobs_open ON forget_jobs (id) WHERE done_at IS NULL;
"""


def migrations(chunk_size: int) -> list[Migration]:
    """All migrations in order. The vec0 chunk size is fixed when the table is created."""
    return [
        Migration(1, "initial dual-track schema", _initial(chunk_size)),
        Migration(2, "governance: channel and workspace policy, preferences, audit", GOVERNANCE),
        Migration(3, "reliability: catch-up cursors", CATCHUP),
        Migration(4, "interaction graph: inferred addressees and reply links", INTERACTIONS),
        Migration(5, "scale: per-channel roster revisions for the roster cache", ROSTER_REVISIONS),
        Migration(
            6, "reliability: edits and deletes that arrive before their message", EARLY_CHANGES
        ),
        Migration(7, "workers: segment claims with a lease", SEGMENT_CLAIMS),
        Migration(
            8, "writer: pending segments indexed in order and by channel", PENDING_SEGMENT_INDEXES
        ),
        Migration(9, "governance: one channel switch, tombstones, resumable forgets", FORGETTING),
        Migration(10, "reconciliation: a detail column on catch-up cursors", RECONCILE_DETAIL),
        tombstone_backfill(11),
        Migration(12, "search: CJK text indexed as character n-grams", CJK_INDEX, reindex_cjk),
        Migration(13, "embeddings: the model that wrote the store's vectors", STORE_META),
        Migration(14, "embeddings: draft vectors to write again at full precision", VECTOR_DRAFTS),
    ]
