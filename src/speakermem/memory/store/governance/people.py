"""Members: opt-outs, aliases, who a name means, and what the store holds of a member (for
an export or a forget)."""

from __future__ import annotations

import time
from typing import Any

from speakermem.memory.models import DerivedRecord
from speakermem.memory.store.channels import normalise_alias
from speakermem.memory.store.database import Database
from speakermem.memory.store.rows import RECORD_COLUMNS, record_from_row


class People:
    """Part of `GovernanceRepo`: members' preferences, names and stored data."""

    db: Database

    async def set_opted_out(
        self, platform: str, workspace: str, user_id: str, opted_out: bool
    ) -> None:
        """Opting out also drops the text of early edits they wrote (stored nowhere else)."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)  # ingests and commits in flight finish first
            if opted_out:
                await tx.execute(
                    "DELETE FROM early_changes WHERE platform = ? AND workspace = ?"
                    " AND author_id = ? AND deleted_at IS NULL",
                    (platform, workspace, user_id),
                )
            await tx.execute(
                "INSERT INTO user_prefs (platform, workspace, user_id, opted_out, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (platform, workspace, user_id) DO UPDATE"
                " SET opted_out = excluded.opted_out, updated_at = excluded.updated_at",
                (platform, workspace, user_id, int(opted_out), time.time()),
            )

    async def is_opted_out(self, platform: str, workspace: str, user_id: str) -> bool:
        rows = await self.db.read(
            "SELECT opted_out FROM user_prefs WHERE platform = ? AND workspace = ? AND user_id = ?",
            (platform, workspace, user_id),
        )
        return bool(rows and rows[0][0])

    async def opted_out_count(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM user_prefs WHERE opted_out = 1 AND (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)",
            (platform, platform, workspace, workspace),
        )
        return int(rows[0][0])

    async def add_alias(self, platform: str, workspace: str, user_id: str, alias: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO user_aliases (platform, workspace, user_id, alias, alias_norm)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (platform, workspace, user_id, alias.strip(), normalise_alias(alias)),
            )
            return bool(cur.rowcount)

    async def remove_alias(self, platform: str, workspace: str, user_id: str, alias: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM user_aliases WHERE platform = ? AND workspace = ? AND user_id = ?"
                " AND alias_norm = ?",
                (platform, workspace, user_id, normalise_alias(alias)),
            )
            return bool(cur.rowcount)

    async def user_candidates(
        self, platform: str, workspace: str, name_or_id: str
    ) -> list[tuple[str, str]]:
        """(user id, display name) of users whose id, display name or alias is this text."""
        norm = normalise_alias(name_or_id)
        rows = await self.db.read(
            "SELECT u.user_id, u.display_name FROM users u WHERE u.platform = ?"
            " AND u.workspace = ? AND (u.user_id = ? OR lower(u.display_name) = ?"
            " OR u.user_id IN (SELECT a.user_id FROM user_aliases a WHERE a.platform = u.platform"
            " AND a.workspace = u.workspace AND a.alias_norm = ?))"
            " UNION SELECT a.user_id, a.user_id FROM user_aliases a WHERE a.platform = ?"
            " AND a.workspace = ? AND a.alias_norm = ? AND a.user_id NOT IN"
            " (SELECT user_id FROM users WHERE platform = ? AND workspace = ?)"
            " ORDER BY 1",
            (
                platform,
                workspace,
                name_or_id,
                norm,
                norm,
                platform,
                workspace,
                norm,
                platform,
                workspace,
            ),
        )
        return [(r[0], r[1]) for r in rows]

    async def user_names(self, platform: str, workspace: str, user_id: str) -> dict[str, Any]:
        rows = await self.db.read(
            "SELECT display_name, is_bot FROM users WHERE platform = ? AND workspace = ?"
            " AND user_id = ?",
            (platform, workspace, user_id),
        )
        aliases = await self.db.read(
            "SELECT alias FROM user_aliases WHERE platform = ? AND workspace = ? AND user_id = ?"
            " ORDER BY alias",
            (platform, workspace, user_id),
        )
        return {
            "display_name": rows[0][0] if rows else None,
            "is_bot": bool(rows and rows[0][1]),
            "aliases": [a[0] for a in aliases],
        }

    # ---- export -------------------------------------------------------------------------

    async def user_messages(self, platform: str, workspace: str, user_id: str) -> list[Any]:
        return await self.db.read(
            "SELECT channel, message_id, thread_id, ts, text, edited_at FROM messages"
            " WHERE platform = ? AND workspace = ? AND speaker_id = ? AND deleted_at IS NULL"
            " ORDER BY ts, id",
            (platform, workspace, user_id),
        )

    async def user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]:
        """Every record the member is owner or source of, in any state, chain by chain."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE platform = ? AND workspace = ?"
            " AND (owner = ? OR source = ?) ORDER BY chain_root, id",
            (platform, workspace, user_id, user_id),
        )
        return [record_from_row(r) for r in rows]

    async def active_user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]:
        """The member's active records (owner or source), newest first."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE platform = ? AND workspace = ?"
            " AND (owner = ? OR source = ?) AND state = 'active' ORDER BY time DESC, id DESC",
            (platform, workspace, user_id, user_id),
        )
        return [record_from_row(r) for r in rows]

    async def live_message_count(self, platform: str, workspace: str, user_id: str) -> int:
        """How many of the member's messages are stored and not deleted or forgotten."""
        rows = await self.db.read(
            "SELECT count(*) FROM messages WHERE platform = ? AND workspace = ?"
            " AND speaker_id = ? AND deleted_at IS NULL",
            (platform, workspace, user_id),
        )
        return int(rows[0][0])

    async def has_spoken(self, platform: str, workspace: str, user_id: str) -> bool:
        """Whether any stored message row carries this speaker id (deleted ones included), so a
        member whose name row is gone can still be found by id."""
        rows = await self.db.read(
            "SELECT 1 FROM messages WHERE platform = ? AND workspace = ? AND speaker_id = ?"
            " LIMIT 1",
            (platform, workspace, user_id),
        )
        return bool(rows)
