"""Forget what the platform deleted: messages found missing when reconciling after downtime,
and whole threads, channels and workspaces (deleted, or the bot removed from them).

Every path runs the one forgetting cascade (`GovernanceRepo.forget_messages`, as `forget
message` and a live delete do): text, indexes, vectors and every record citing the messages
go, and the rows stay as content-free tombstones, so a replay cannot bring them back. Each
action is written to the audit log with its receipt (counts per table, never the text).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from memory.governance.policy import Receipt
from memory.governance.service import Governance
from memory.models import Scope
from memory.store.reconcile import ReconcileRepo

log = logging.getLogger(__name__)


class PlatformDeletions:
    """The forgetting cascade for what disappeared on the platform (see the module docstring).

    The `forget_*` methods add to a caller's receipt (a reconciliation run writes one audit
    entry for all it did); the `*_deleted` methods are whole actions with their own entry."""

    def __init__(self, governance: Governance) -> None:
        self.governance = governance
        self.repo = governance.repo
        self.rows = ReconcileRepo(governance.engine.store.db)

    async def forget_messages(
        self, scope: Scope, message_ids: Sequence[str], receipt: Receipt, *, reason: str
    ) -> int:
        """Forget these messages of the channel; returns how many it held."""
        pks = await self.repo.message_pks(scope, list(dict.fromkeys(message_ids)))
        await self._forget(pks, receipt, reason)
        return len(pks)

    async def forget_thread(
        self, scope: Scope, thread_id: str, receipt: Receipt, *, reason: str
    ) -> int:
        """Forget every stored reply of a thread of the channel."""
        pks = await self.rows.thread_message_pks(scope, thread_id)
        await self._forget(pks, receipt, reason)
        return len(pks)

    async def forget_channel(self, scope: Scope, receipt: Receipt, *, reason: str) -> int:
        """Forget everything the channel holds: its messages and, as a final sweep, any
        record left in it."""
        pks = await self.repo.channel_message_pks(scope)
        await self._forget(pks, receipt, reason)
        left = await self.repo.channel_record_ids(scope)
        if left:
            await self.repo.withdraw(left, receipt, reason=reason, requeue=False)
        return len(pks)

    async def thread_deleted(self, scope: Scope, thread_id: str, *, actor: str) -> Receipt:
        receipt = Receipt(action="platform-thread-delete", target=f"{scope}/{thread_id}")
        await self.forget_thread(scope, thread_id, receipt, reason="platform-thread-delete")
        # a thread whose parent was unknown when its messages came is stored as a channel
        thread_scope = scope.model_copy(update={"channel": thread_id})
        await self.forget_channel(thread_scope, receipt, reason="platform-thread-delete")
        await self.audit(scope, actor, receipt, {"thread": thread_id})
        return receipt

    async def channel_deleted(self, scope: Scope, *, actor: str) -> Receipt:
        receipt = Receipt(action="platform-channel-delete", target=str(scope))
        await self.forget_channel(scope, receipt, reason="platform-channel-delete")
        await self.audit(scope, actor, receipt, {})
        return receipt

    async def workspace_left(self, platform: str, workspace: str, *, actor: str) -> Receipt:
        """The workspace (a Discord guild) was deleted or the bot was removed from it:
        forget every channel of it."""
        receipt = Receipt(action="platform-workspace-delete", target=f"{platform}/{workspace}")
        channels = [
            scope
            for _pk, scope in await self.repo.channels_with_pk()
            if scope.platform == platform and scope.workspace == workspace
        ]
        for scope in channels:
            await self.forget_channel(scope, receipt, reason="platform-workspace-delete")
        await self.audit(
            Scope(platform=platform, workspace=workspace, channel="*"),
            actor,
            receipt,
            {"channels": len(channels)},
        )
        return receipt

    async def audit(self, scope: Scope, actor: str, receipt: Receipt, args: dict[str, Any]) -> None:
        await self.repo.log(
            platform=scope.platform,
            workspace=scope.workspace,
            actor=actor,
            action=receipt.action,
            target=receipt.target,
            args=args,
            receipt=receipt,
        )
        log.info("%s by %s on %s: %s", receipt.action, actor, receipt.target, receipt.summary())

    async def _forget(self, pks: Sequence[int], receipt: Receipt, reason: str) -> None:
        if pks:
            await self.repo.forget_messages(
                pks, receipt, reason=reason, batch=self.governance.cfg.forget_batch
            )
