"""InteractionRepo on PostgreSQL: the upserts of inferred addressees and links use
ON CONFLICT ... DO UPDATE for SQLite's INSERT OR REPLACE (same keys, last write wins), and
the channel's cursor only moves forward: passes in two processes may overlap, and the one
that read less must not move the cursor back over what the other already read."""

from __future__ import annotations

from memory.store.interactions import InteractionRepo


class PgInteractionRepo(InteractionRepo):
    _ADDRESSEE_UPSERT = (
        "INSERT INTO message_addressees (message_pk, addressee, how) VALUES (?, ?, ?)"
        " ON CONFLICT (message_pk, addressee) DO UPDATE SET how = excluded.how"
    )
    _LINK_UPSERT = (
        "INSERT INTO message_links (message_pk, parent_pk, how) VALUES (?, ?, ?)"
        " ON CONFLICT (message_pk) DO UPDATE SET parent_pk = excluded.parent_pk,"
        " how = excluded.how"
    )
    _CURSOR_UPSERT = (
        "INSERT INTO interaction_cursor (channel_pk, last_pk) VALUES (?, ?)"
        " ON CONFLICT (channel_pk) DO UPDATE"
        " SET last_pk = greatest(interaction_cursor.last_pk, excluded.last_pk)"
    )
