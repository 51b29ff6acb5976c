"""ChannelRepo on PostgreSQL.

- The members query uses json_agg for SQLite's json_group_array, and a boolean test for
  SQLite's integer-as-boolean.
- Roster and user writes go in user-id order. SQLite has one writer at a time; PostgreSQL
  locks row by row, so two processes syncing one channel's members in different orders
  (two Slack workers, a re-sync racing a join) took each other's rows crosswise and one
  failed with a deadlock. In one order, the second waits for the first and then goes on.
"""

from __future__ import annotations

from memory.models import Scope
from memory.store.channels import ChannelRepo
from memory.store.database import Transaction


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

    async def upsert_users(
        self, tx: Transaction, scope: Scope, users: list[tuple[str, str, bool]]
    ) -> None:
        await super().upsert_users(tx, scope, sorted(users, key=lambda u: u[0]))

    @staticmethod
    async def add_member_rows(tx: Transaction, rows: list[tuple[object, ...]]) -> None:
        ordered = sorted(rows, key=lambda r: (str(r[0]), str(r[4])))
        await ChannelRepo.add_member_rows(tx, ordered)

    async def sync_members(
        self, scope: Scope, listed: list[tuple[str, str | None, bool]], at: float | None = None
    ) -> tuple[int, int]:
        return await super().sync_members(scope, sorted(listed, key=lambda u: u[0]), at)
