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

from speakermem.memory.governance.policy import Forgotten, Receipt
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope

log = logging.getLogger(__name__)


class PlatformDeletions:
    """The forgetting cascade for what disappeared on the platform (see the module docstring).

    The `forget_*` methods add to a caller's receipt (a reconciliation run writes one audit
    entry for all it did); the `*_deleted` methods are whole actions with their own entry."""

    def __init__(self, governance: Governance) -> None:
        self.governance = governance
        self.repo = governance.repo
        self.rows = governance.engine.store.reconcile

    async def forget_messages(
        self, scope: Scope, message_ids: Sequence[str], receipt: Receipt, *, reason: str
    ) -> int:
        """Forget these messages of the channel; returns how many it held."""
        ids = tuple(dict.fromkeys(message_ids))
        pks = await self.repo.message_pks(scope, list(ids))
        await self._forget(scope, ids, pks, receipt, reason)
        return len(pks)

    async def forget_thread(
        self, scope: Scope, thread_id: str, receipt: Receipt, *, reason: str
    ) -> int:
        """Forget every stored reply of a thread of the channel."""
        found = await self.rows.thread_messages(scope, thread_id)
        await self._forget(
            scope, tuple(m for _pk, m in found), [pk for pk, _m in found], receipt, reason
        )
        return len(found)

    async def forget_channel(self, scope: Scope, receipt: Receipt, *, reason: str) -> int:
        """Forget everything the channel holds: its messages and, as a final sweep, any
        record left in it."""
        pks = await self.repo.channel_message_pks(scope)
        await self._forget(scope, None, pks, receipt, reason)
        left = await self.repo.channel_record_ids(scope)
        if left:
            await self.repo.withdraw(left, receipt, reason=reason, requeue=False)
        return len(pks)

    async def forget_deleted_channel(
        self, scope: Scope, receipt: Receipt, *, reason: str, actor: str
    ) -> int:
        """A channel that no longer exists: memory off (nothing more is stored or caught up
        there), then everything it held forgotten."""
        await self.repo.set_channel_enabled(scope, False, actor)
        receipt.add("channel_policy", 1)
        return await self.forget_channel(scope, receipt, reason=reason)

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
        await self.forget_deleted_channel(
            scope, receipt, reason="platform-channel-delete", actor=actor
        )
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
        await self.governance.audit_log.record(
            scope.platform, scope.workspace, actor, receipt, args
        )

    async def _forget(
        self,
        scope: Scope,
        message_ids: tuple[str, ...] | None,
        pks: Sequence[int],
        receipt: Receipt,
        reason: str,
    ) -> None:
        """The cascade over `pks`, the messages `message_ids` of the channel (None: all of
        it): every forget of this module goes through here."""
        what = "everything held" if message_ids is None else f"{len(message_ids)} message(s)"
        log.debug("%s: forgetting %s in %s", reason, what, scope)
        if message_ids is None or message_ids:  # copies outside the store (the spill) too
            await self.governance.forgetting.run_hooks(
                Forgotten(
                    scope.platform,
                    scope.workspace,
                    channel=scope.channel,
                    message_ids=message_ids or (),
                )
            )
        if pks:
            await self.repo.forget_messages(
                pks, receipt, reason=reason, batch=self.governance.cfg.forget_batch
            )
