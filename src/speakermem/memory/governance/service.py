"""The governance service: every admin and member action, each through the one cascade.

Platform-neutral: the bot layer resolves who asked and whether they are an admin; the CLI
calls the same methods with actor "cli". Each admin action is written to the audit log with
its receipt (counts per table, never the forgotten text; memory.governance.audit_log).
Forgetting runs as recorded jobs (memory.governance.forgetting), an edit re-checks the
records citing it (memory.governance.edit_recheck), and the read-only reports come from
memory.governance.reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from speakermem.memory.config import GovernanceConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.audit_log import AuditLog
from speakermem.memory.governance.edit_recheck import still_supported
from speakermem.memory.governance.errors import (
    AmbiguousUser,
    ForgetIncomplete,
    GovernanceError,
    UnknownMessage,
    UnknownUser,
)
from speakermem.memory.governance.forgetting import ForgetHook, Forgetting
from speakermem.memory.governance.policy import (
    Receipt,
    channel_enabled,
    effective_retention,
    retention_cutoff,
)
from speakermem.memory.governance.reports import GovernanceReports, LLMProbe
from speakermem.memory.models import EditEvent, Scope
from speakermem.memory.query.links import LinkResolver, default_link
from speakermem.memory.store import ChangeStatus
from speakermem.memory.writer.gate import EvidenceGate
from speakermem.memory.writer.runner import gate_from

log = logging.getLogger(__name__)


class Governance(GovernanceReports):
    """Every governance action; the reports come from `GovernanceReports`."""

    def __init__(
        self,
        engine: MemoryEngine,
        *,
        config: GovernanceConfig | None = None,
        llm_probe: LLMProbe | None = None,
        gate: EvidenceGate | None = None,
        link: LinkResolver = default_link,
    ) -> None:
        self.engine = engine
        self.repo = engine.store.governance
        self.cfg = config or engine.config.governance
        self.llm_probe = llm_probe
        self.gate = gate or gate_from(engine.config.writer)
        self.link = link
        self.audit_log = AuditLog(engine)
        self.forgetting = Forgetting(engine, self.cfg, self.audit_log.record)
        self.forget_hooks: list[ForgetHook] = self.forgetting.hooks
        """Run by every forget (bot.dispatch registers the spill's)."""

    # ---- channel switch -----------------------------------------------------------------

    async def channel_enabled(self, scope: Scope) -> bool:
        policy = await self.repo.channel_policy(scope)
        return channel_enabled(policy.enabled, self.cfg.channel_default_enabled)

    async def channels_enabled(self, scopes: Sequence[Scope]) -> dict[Scope, bool]:
        """`channel_enabled` for many channels, one query per workspace."""
        out: dict[Scope, bool] = {}
        for (platform, workspace), group in _grouped(scopes, _workspace_of_scope).items():
            switches = await self.repo.channel_switches(
                platform, workspace, [s.channel for s in group]
            )
            for s in group:
                out[s] = channel_enabled(switches.get(s.channel), self.cfg.channel_default_enabled)
        return out

    async def set_channel(self, scope: Scope, on: bool, *, actor: str) -> Receipt:
        before = await self.repo.set_channel_enabled(scope, on, actor)
        receipt = Receipt(action="channel-on" if on else "channel-off", target=str(scope))
        if before is None or before != on:
            receipt.add("channel_policy", 1)
        await self.audit_log.record(scope.platform, scope.workspace, actor, receipt, {"on": on})
        return receipt

    async def purge_channel(self, scope: Scope, *, actor: str) -> Receipt:
        """Memory off, then forget everything the channel holds (its messages and records)."""
        return await self.forgetting.channel(scope, actor=actor)

    # ---- retention ----------------------------------------------------------------------

    async def set_retention(
        self,
        platform: str,
        workspace: str,
        channel: str | None,
        days: int | None,
        *,
        actor: str,
    ) -> Receipt:
        if channel is None:
            await self.repo.set_workspace_retention(platform, workspace, days, actor)
            target = f"{platform}/{workspace}"
        else:
            scope = Scope(platform=platform, workspace=workspace, channel=channel)
            await self.repo.set_channel_retention(scope, days, actor)
            target = str(scope)
        receipt = Receipt(action="retention-set", target=target)
        receipt.add("retention_policy", 1)
        await self.audit_log.record(platform, workspace, actor, receipt, {"days": days})
        return receipt

    async def apply_retention(
        self, *, actor: str = "scheduler", now: float | None = None
    ) -> Receipt:
        """Forget every message older than its channel's (or workspace's) limit."""
        now = time.time() if now is None else now
        receipt = Receipt(action="retention-apply")
        per_workspace: dict[tuple[str, str], Receipt] = {}
        policies = {p.scope: p for p in await self.repo.channel_policies()}
        workspaces = await self.repo.workspace_retention()
        for channel_pk, scope in await self.repo.channels_with_pk():
            policy = policies.get(scope)
            days = effective_retention(
                policy.retention_days if policy else None,
                workspaces.get((scope.platform, scope.workspace)),
            )
            if days is None:
                continue
            pks = await self.repo.expired_message_pks(channel_pk, retention_cutoff(now, days))
            if pks:
                key = (scope.platform, scope.workspace)
                part = per_workspace.setdefault(key, Receipt(action="retention-apply"))
                await self.repo.forget_messages(
                    pks, part, reason="retention", batch=self.cfg.forget_batch
                )
        # each workspace's counts under its own name, so its admins read only theirs
        for (platform, workspace), part in sorted(per_workspace.items()):
            receipt.merge(part)
            await self.audit_log.record(platform, workspace, actor, part, {"now": now})
        if not per_workspace and actor != "scheduler":  # a run that changed nothing
            await self.audit_log.record("*", "*", actor, receipt, {"now": now})
        return receipt

    # ---- users and aliases --------------------------------------------------------------

    async def resolve_user(
        self, platform: str, workspace: str, text: str, *, is_id: bool = False
    ) -> str:
        """A user id from an id, display name or alias; unknown or ambiguous is an error.

        An id (from a mention) is accepted even if the store never saw it: forgetting or
        exporting nobody then simply finds nothing."""
        value = text.strip()
        if is_id:
            return value
        found = await self.repo.user_candidates(platform, workspace, value)
        if not found:
            raise UnknownUser(f"no member called {value!r} in this workspace")
        if len(found) > 1:
            raise AmbiguousUser(value, found)
        return found[0][0]

    async def alias(
        self, platform: str, workspace: str, user_id: str, alias: str, *, add: bool, actor: str
    ) -> Receipt:
        if not alias.strip():
            raise GovernanceError("the alias is empty")
        if add:
            clash = [
                uid
                for uid, _ in await self.repo.user_candidates(platform, workspace, alias)
                if uid != user_id
            ]
            if clash:
                raise GovernanceError(
                    f"{alias!r} already names {', '.join(clash)}; pick another alias"
                )
            changed = await self.repo.add_alias(platform, workspace, user_id, alias)
        else:
            changed = await self.repo.remove_alias(platform, workspace, user_id, alias)
        receipt = Receipt(action="alias-add" if add else "alias-remove", target=user_id)
        receipt.add("user_aliases", int(changed))
        await self.audit_log.record(platform, workspace, actor, receipt, {"alias": alias})
        return receipt

    # ---- forgetting ---------------------------------------------------------------------

    async def locate_message(
        self, platform: str, workspace: str, channel: str | None, message_id: str
    ) -> Scope:
        if channel is not None:
            scope = Scope(platform=platform, workspace=workspace, channel=channel)
            if await self.repo.message_pks(scope, [message_id]):
                return scope
        found = await self.repo.find_message(platform, workspace, message_id)
        if channel is not None:
            found = [s for s in found if s.channel == channel] or found
        if not found:
            raise UnknownMessage(f"I hold no message {message_id} in this workspace")
        if len(found) > 1:
            raise UnknownMessage(f"message id {message_id} is in several channels; use its link")
        return found[0]

    async def forget_message(self, scope: Scope, message_id: str, *, actor: str) -> Receipt:
        if not await self.repo.message_pks(scope, [message_id]):
            raise UnknownMessage(f"I hold no message {message_id} in {scope.channel}")
        return await self.forgetting.message(scope, message_id, actor=actor)

    async def forget_user(
        self,
        platform: str,
        workspace: str,
        user_id: str,
        *,
        actor: str,
        action: str = "forget-user",
    ) -> Receipt:
        """Their messages, every record built from them, about them or naming them, their
        name and aliases; a tombstone keeps them out until they opt in or an admin lifts it
        (memory.governance.forgetting)."""
        return await self.forgetting.person(
            platform, workspace, user_id, actor=actor, action=action
        )

    async def lift_forget(
        self, platform: str, workspace: str, user_id: str, *, actor: str
    ) -> Receipt:
        """Let a forgotten person be remembered again from now on (audited)."""
        return await self.forgetting.lift(platform, workspace, user_id, actor=actor)

    async def resume_forgets(self) -> list[Receipt]:
        """Run again every forget a failure left incomplete (the scheduler's job)."""
        return await self.forgetting.resume()

    # ---- members ------------------------------------------------------------------------

    async def is_opted_out(self, platform: str, workspace: str, user_id: str) -> bool:
        return await self.repo.is_opted_out(platform, workspace, user_id)

    async def opt_out(
        self, platform: str, workspace: str, user_id: str, *, forget: bool, actor: str
    ) -> Receipt:
        await self.repo.set_opted_out(platform, workspace, user_id, True)
        if forget:
            receipt = await self.forget_user(
                platform, workspace, user_id, actor=actor, action="opt-out-forget"
            )
        else:
            receipt = Receipt(action="opt-out", target=user_id)
            receipt.add("user_prefs", 1)
            await self.audit_log.record(platform, workspace, actor, receipt, {})
        return receipt

    async def opt_in(self, platform: str, workspace: str, user_id: str, *, actor: str) -> Receipt:
        """Store their messages again; a forgotten person's tombstone is lifted too."""
        await self.repo.set_opted_out(platform, workspace, user_id, False)
        receipt = Receipt(action="opt-in", target=user_id)
        receipt.add("user_prefs", 1)
        receipt.add(
            "forgotten_people",
            int(await self.engine.store.tombstones.lift(platform, workspace, user_id)),
        )
        await self.audit_log.record(platform, workspace, actor, receipt, {})
        return receipt

    # ---- edits --------------------------------------------------------------------------

    async def apply_edit(self, event: EditEvent) -> tuple[ChangeStatus, Receipt]:
        """Apply an edit, then re-check every record citing the message against the new text:
        those the evidence no longer supports are withdrawn and queued for re-derivation."""
        receipt = Receipt(action="edit-recheck", target=f"{event.scope}/{event.message_id}")
        status = await self.engine.edit(event)
        if status is not ChangeStatus.APPLIED:
            return status, receipt
        pks = await self.repo.message_pks(event.scope, [event.message_id])
        failing: list[int] = []
        for rid in await self.repo.records_citing(pks):
            if not await still_supported(self.engine, self.gate, rid):
                failing.append(rid)
        if failing:
            await self.repo.withdraw(failing, receipt, reason="edit")
        return status, receipt

    # ---- notices ------------------------------------------------------------------------

    async def claim_notice(self, scope: Scope) -> bool:
        if not self.cfg.channel_notice:
            return False
        return await self.repo.claim_notice(scope)

    async def release_notice(self, scope: Scope) -> None:
        await self.repo.release_notice(scope)

    # ---- reports (status, export_user, mine: memory.governance.reports) ----------------

    async def audit(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[dict[str, Any]]:
        """The audit log's latest entries (memory.governance.audit_log)."""
        return await self.audit_log.entries(limit, platform=platform, workspace=workspace)


__all__ = [
    "AmbiguousUser",
    "ForgetHook",
    "ForgetIncomplete",
    "Governance",
    "GovernanceError",
    "LLMProbe",
    "UnknownMessage",
    "UnknownUser",
]


_T = TypeVar("_T")


def _grouped(
    items: Sequence[_T], key: Callable[[_T], tuple[str, str]]
) -> dict[tuple[str, str], list[_T]]:
    """Distinct items by workspace, so a batch costs one query per workspace."""
    groups: dict[tuple[str, str], list[_T]] = {}
    for item in dict.fromkeys(items):
        groups.setdefault(key(item), []).append(item)
    return groups


def _workspace_of_scope(scope: Scope) -> tuple[str, str]:
    return (scope.platform, scope.workspace)
