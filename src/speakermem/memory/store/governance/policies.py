"""Channel and workspace policy: memory switches, retention, the one-time notice."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speakermem.memory.models import Scope
from speakermem.memory.store.database import Database, Transaction


@dataclass(frozen=True)
class ChannelPolicy:
    scope: Scope
    enabled: bool | None
    """None = never set: the default applies."""
    retention_days: int | None
    notice_posted_at: float | None


class ChannelPolicies:
    """Part of `GovernanceRepo`: what is set per channel and per workspace."""

    db: Database

    async def channel_policy(self, scope: Scope) -> ChannelPolicy:
        rows = await self.db.read(
            "SELECT enabled, retention_days, notice_posted_at FROM channel_policy"
            " WHERE platform = ? AND workspace = ? AND channel = ?",
            scope.key(),
        )
        if not rows:
            return ChannelPolicy(scope, None, None, None)
        r = rows[0]
        return ChannelPolicy(scope, None if r[0] is None else bool(r[0]), r[1], r[2])

    async def channel_switches(
        self, platform: str, workspace: str, channels: Sequence[str]
    ) -> dict[str, bool]:
        """The explicit on/off switch of each channel that has one (one query for a burst)."""
        rows = await self.db.read_in(
            "SELECT channel, enabled FROM channel_policy WHERE platform = ? AND workspace = ?"
            " AND enabled IS NOT NULL AND channel IN ({marks})",
            list(dict.fromkeys(channels)),
            before=(platform, workspace),
        )
        return {r[0]: bool(r[1]) for r in rows}

    async def is_enabled(self, scope: Scope, *, default: bool) -> bool:
        """Whether memory is on in a channel (its explicit switch, else the default)."""
        policy = await self.channel_policy(scope)
        return default if policy.enabled is None else policy.enabled

    async def channel_policies(self) -> list[ChannelPolicy]:
        rows = await self.db.read(
            "SELECT platform, workspace, channel, enabled, retention_days, notice_posted_at"
            " FROM channel_policy ORDER BY platform, workspace, channel"
        )
        return [
            ChannelPolicy(
                Scope(platform=r[0], workspace=r[1], channel=r[2]),
                None if r[3] is None else bool(r[3]),
                r[4],
                r[5],
            )
            for r in rows
        ]

    async def _upsert_channel(
        self, tx: Transaction, scope: Scope, column: str, value: Any, actor: str
    ) -> None:
        await tx.execute(
            f"INSERT INTO channel_policy (platform, workspace, channel, {column}, updated_at,"
            f" updated_by) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (platform, workspace, channel)"
            f" DO UPDATE SET {column} = excluded.{column}, updated_at = excluded.updated_at,"
            " updated_by = excluded.updated_by",
            (*scope.key(), value, time.time(), actor),
        )

    async def set_channel_enabled(self, scope: Scope, enabled: bool, actor: str) -> bool | None:
        """Switch a channel; returns the explicit value it had before (None = default)."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)  # ingests in flight finish first
            row = await tx.fetchone(
                "SELECT enabled FROM channel_policy WHERE platform = ? AND workspace = ?"
                " AND channel = ?",
                scope.key(),
            )
            await self._upsert_channel(tx, scope, "enabled", int(enabled), actor)
            if not enabled:  # text of edits waiting for messages that will not be stored now
                await tx.execute(
                    "DELETE FROM early_changes WHERE platform = ? AND workspace = ?"
                    " AND channel = ? AND deleted_at IS NULL",
                    scope.key(),
                )
        return None if row is None or row[0] is None else bool(row[0])

    async def set_channel_retention(self, scope: Scope, days: int | None, actor: str) -> None:
        async with self.db.transaction() as tx:
            await self._upsert_channel(tx, scope, "retention_days", days, actor)

    async def set_workspace_retention(
        self, platform: str, workspace: str, days: int | None, actor: str
    ) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO workspace_policy (platform, workspace, retention_days, updated_at,"
                " updated_by) VALUES (?, ?, ?, ?, ?) ON CONFLICT (platform, workspace) DO UPDATE"
                " SET retention_days = excluded.retention_days,"
                " updated_at = excluded.updated_at, updated_by = excluded.updated_by",
                (platform, workspace, days, time.time(), actor),
            )

    async def workspace_retention(self) -> dict[tuple[str, str], int | None]:
        rows = await self.db.read(
            "SELECT platform, workspace, retention_days FROM workspace_policy"
        )
        return {(r[0], r[1]): r[2] for r in rows}

    async def claim_notice(self, scope: Scope) -> bool:
        """Mark the channel's notice as posted; True only for the first caller ever."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO channel_policy (platform, workspace, channel, updated_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (*scope.key(), time.time()),
            )
            cur = await tx.execute(
                "UPDATE channel_policy SET notice_posted_at = ? WHERE platform = ?"
                " AND workspace = ? AND channel = ? AND notice_posted_at IS NULL",
                (time.time(), *scope.key()),
            )
            return bool(cur.rowcount)

    async def release_notice(self, scope: Scope) -> None:
        """Undo a claim whose post failed, so the notice is tried again later."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE channel_policy SET notice_posted_at = NULL WHERE platform = ?"
                " AND workspace = ? AND channel = ?",
                scope.key(),
            )
