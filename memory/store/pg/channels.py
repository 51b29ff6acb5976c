"""ChannelRepo on PostgreSQL: only the members query differs (json_agg for SQLite's
json_group_array, and a boolean test for SQLite's integer-as-boolean)."""

from __future__ import annotations

from memory.store.channels import ChannelRepo


class PgChannelRepo(ChannelRepo):
    _MEMBERS_SQL = (
        "SELECT r.user_id, coalesce(u.display_name, r.user_id), coalesce(u.is_bot, 0),"
        " r.joined_at, r.left_at,"
        " (SELECT json_agg(a.alias ORDER BY a.alias_norm)::text FROM user_aliases a"
        "  WHERE a.platform = r.platform AND a.workspace = r.workspace"
        "  AND a.user_id = r.user_id)"
        " FROM roster r LEFT JOIN users u ON u.platform = r.platform"
        " AND u.workspace = r.workspace AND u.user_id = r.user_id"
        " WHERE r.channel_pk = ? AND (? <> 0 OR r.left_at IS NULL)"
        " ORDER BY r.joined_at, r.user_id"
    )
