"""Operators' reads outside the live paths: the engine's door for the CLI, `doctor`, `status`
and the ops endpoint (`engine.admin`).

Names to channels and people, derived records by owner or chain, counts and the Writer's
usage, the audit log, and the store's own health. Forgetting, switches and opt-outs are
not here: they go through `memory.governance.service.Governance`, with its cascade, audit
and receipts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speakermem.memory.models import DerivedRecord, Scope
from speakermem.memory.store import Store
from speakermem.memory.store.diagnostics import StoreHealth, location, store_health
from speakermem.memory.store.usage import WriterUsage, writer_usage

if TYPE_CHECKING:
    from speakermem.memory.store.pg.diagnostics import PgHealth as PgHealth

__all__ = ["StoreAdmin", "StoreHealth", "WriterUsage"]


class StoreAdmin:
    def __init__(self, store: Store) -> None:
        self._store = store

    # ---- channels and people ------------------------------------------------------------

    async def channels(self) -> list[dict[str, Any]]:
        """Every channel with its name, privacy and counts (messages, members, sessions)."""
        return await self._store.channels.all()

    async def find_channel(self, channel: str, platform: str | None = None) -> list[Scope]:
        """The channels whose id or name is `channel` (several when it is ambiguous)."""
        return await self._store.channels.find(channel, platform)

    async def workspaces(self) -> list[tuple[str, str]]:
        """(platform, workspace) of every workspace the store knows."""
        return await self._store.channels.workspaces()

    async def user_candidates(
        self, platform: str, workspace: str, name_or_id: str
    ) -> list[tuple[str, str]]:
        """(user id, display name) of the members this id, display name or alias names."""
        return await self._store.governance.user_candidates(platform, workspace, name_or_id)

    async def has_spoken(self, platform: str, workspace: str, user_id: str) -> bool:
        """Whether any stored message (deleted ones too) carries this speaker id: a member
        whose name is gone can still be found by id."""
        return await self._store.governance.has_spoken(platform, workspace, user_id)

    async def holds_message(self, scope: Scope, message_id: str) -> bool:
        """Whether the channel holds this message (a forgotten one's tombstone included)."""
        return bool(await self._store.governance.message_pks(scope, [message_id]))

    # ---- derived records ----------------------------------------------------------------

    async def record_heads(self, channel_pks: Sequence[int]) -> list[DerivedRecord]:
        """The active records of these channels, newest first."""
        return await self._store.records.heads(channel_pks)

    async def record_chain(self, record_id: int) -> list[DerivedRecord]:
        """The whole update chain a record belongs to, oldest first."""
        return await self._store.records.chain(record_id)

    async def records_owned_by(self, name_or_id: str) -> list[DerivedRecord]:
        """Records whose owner is this user id or display name, in every channel."""
        return await self._store.records.by_owner_name(name_or_id)

    # ---- counts and usage ---------------------------------------------------------------

    async def message_counts(self) -> dict[str, int]:
        """Messages held, deleted (tombstones), not yet embedded, and channels with any."""
        return await self._store.messages.counts()

    async def record_counts(self) -> dict[str, int]:
        return await self._store.records.counts()

    async def writer_stats(self) -> dict[str, object]:
        """The Writer's totals over its run log: runs, proposed, accepted, tokens."""
        return await self._store.records.writer_stats()

    async def writer_usage(self) -> WriterUsage:
        """What the Writer's LLM calls cost, per run and per 1,000 messages written."""
        return await writer_usage(self._store)

    # ---- the audit log ------------------------------------------------------------------

    async def log(
        self,
        *,
        platform: str,
        workspace: str,
        actor: str,
        action: str,
        target: str = "",
        args: dict[str, Any] | None = None,
    ) -> int:
        """Write one audit entry (an action with no receipt of its own, e.g. an export)."""
        return await self._store.governance.log(
            platform=platform,
            workspace=workspace,
            actor=actor,
            action=action,
            target=target,
            args=args,
        )

    # ---- the store itself ---------------------------------------------------------------

    async def ping(self) -> None:
        """One round trip to the database; raises when it cannot serve a read."""
        await self._store.db.read("SELECT 1")

    async def health(self) -> StoreHealth | PgHealth:
        """Versions, extensions, schema and index health of the store's backend."""
        return await store_health(self._store)

    def location(self) -> str:
        """Where the open store is: the SQLite file, or PostgreSQL's database."""
        return location(self._store)
