"""The governance service: every admin and member action, each through the one cascade.

Platform-neutral: the bot layer resolves who asked and whether they are an admin; the CLI
calls the same methods with actor "cli". Each admin action is written to the audit log with
its receipt (counts per table, never the forgotten text).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from memory.config import GovernanceConfig
from memory.engine import MemoryEngine
from memory.governance.errors import (
    AmbiguousUser,
    ForgetIncomplete,
    GovernanceError,
    UnknownMessage,
    UnknownUser,
)
from memory.governance.forgetting import ForgetHook, Forgetting
from memory.governance.policy import (
    Receipt,
    channel_enabled,
    effective_retention,
    retention_cutoff,
)
from memory.models import GROUP, EditEvent, Scope
from memory.query.links import LinkResolver, default_link
from memory.store import ChangeStatus
from memory.store.diagnostics import status_counts
from memory.store.usage import writer_status
from memory.writer.gate import EvidenceGate, date_terms
from memory.writer.runner import gate_from

log = logging.getLogger(__name__)

LLMProbe = Callable[[], Awaitable[bool]]
"""Answers whether the LLM endpoint is reachable (built in the composition root)."""


class Governance:
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
        self.forgetting = Forgetting(engine, self.cfg, self._audit)
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
        await self._audit(scope.platform, scope.workspace, actor, receipt, {"on": on})
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
        await self._audit(platform, workspace, actor, receipt, {"days": days})
        return receipt

    async def apply_retention(
        self, *, actor: str = "scheduler", now: float | None = None
    ) -> Receipt:
        """Forget every message older than its channel's (or workspace's) limit."""
        now = time.time() if now is None else now
        receipt = Receipt(action="retention-apply")
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
                await self.repo.forget_messages(
                    pks, receipt, reason="retention", batch=self.cfg.forget_batch
                )
        if receipt.counts or actor != "scheduler":
            await self._audit("*", "*", actor, receipt, {"now": now})
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
        await self._audit(platform, workspace, actor, receipt, {"alias": alias})
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
            await self._audit(platform, workspace, actor, receipt, {})
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
        await self._audit(platform, workspace, actor, receipt, {})
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
            if not await self._still_supported(rid):
                failing.append(rid)
        if failing:
            await self.repo.withdraw(failing, receipt, reason="edit")
        return status, receipt

    async def _still_supported(self, record_id: int) -> bool:
        got = await self.engine.store.records.get_many([record_id])
        rec = got.get(record_id)
        if rec is None:
            return True
        cited = list((await self.engine.store.messages.by_ids(rec.scope, rec.from_ids)).values())
        cited = [m for m in cited if not m.deleted]
        if not cited:
            return False
        names: dict[str, list[str]] = {}
        for member in await self.engine.members(rec.scope, include_left=True):
            names[member.user_id] = [member.display_name, *member.aliases]
        speakers: list[str] = []
        context: list[str] = []
        for m in cited:
            speakers.append(m.speaker_name)
            speakers.extend(names.get(m.speaker_id, []))
            for uid in m.addressees:
                context.extend(names.get(uid, [uid]))
            context.extend(date_terms(m.ts))
        for uid in (rec.owner, rec.source):
            if uid != GROUP:
                context.extend(names.get(uid, []))
        if rec.supersedes is not None:
            prev = (await self.engine.store.records.get_many([rec.supersedes])).get(rec.supersedes)
            if prev is not None:
                context.append(prev.content)
        score = self.gate.score(
            rec.content, [m.text for m in cited], speakers, context_terms=context
        )
        return score.passed

    # ---- notices ------------------------------------------------------------------------

    async def claim_notice(self, scope: Scope) -> bool:
        if not self.cfg.channel_notice:
            return False
        return await self.repo.claim_notice(scope)

    async def release_notice(self, scope: Scope) -> None:
        await self.repo.release_notice(scope)

    # ---- reports ------------------------------------------------------------------------

    async def status(
        self, platform: str | None = None, workspace: str | None = None
    ) -> dict[str, Any]:
        """Counts, queues and switches of one workspace (or platform) when given, else of
        the whole store; never another workspace's numbers."""
        store = self.engine.store
        counts = await status_counts(store, platform, workspace)
        writer = await writer_status(store, self.engine.config.writer, platform, workspace)
        reachable: bool | None = None
        if self.llm_probe is not None:
            try:
                reachable = bool(await self.llm_probe())
            except Exception:  # a probe that fails means "not reachable"
                reachable = False
        channels = []
        for c in await store.channels.all():
            scope: Scope = c["scope"]
            if platform is not None and scope.platform != platform:
                continue
            if workspace is not None and scope.workspace != workspace:
                continue
            policy = await self.repo.channel_policy(scope)
            channels.append(
                {
                    "channel": str(scope),
                    "name": c["name"],
                    "on": channel_enabled(policy.enabled, self.cfg.channel_default_enabled),
                    "explicit": policy.enabled is not None,
                    "retention_days": policy.retention_days,
                    "messages": c["messages"],
                }
            )
        retention = {
            f"{p}/{w}": d
            for (p, w), d in (await self.repo.workspace_retention()).items()
            if (platform is None or p == platform) and (workspace is None or w == workspace)
        }
        catchup = await self._catchup_status(platform, workspace, channels)
        incomplete = [
            {"id": j.id, "action": j.action, "started_at": j.started_at, "error": j.last_error}
            for j in await store.forget_jobs.open(platform, workspace)
        ]
        return {
            "messages": counts["messages"],
            "tombstones": counts["tombstones"],
            "unembedded": counts["unembedded"],
            "records_active": counts["records_active"],
            "records": counts["records"],
            "writer_queue": {
                "pending_segments": counts["pending_segments"],
                "open_segments": counts["open_segments"],
                "rederive": await self.repo.rederive_depth(platform, workspace),
                **writer["queue"],
            },
            "writer_usage": writer["usage"],
            "writer_last_run": counts["writer_last_run"],
            "writer_last_outcome": counts["writer_last_outcome"],
            "llm_reachable": reachable,
            "llm_configured": self.llm_probe is not None,
            "db_bytes": await store.db_size_bytes(),
            "channels": channels,
            "channels_on": sum(1 for c in channels if c["on"]),
            "channels_off": sum(1 for c in channels if not c["on"]),
            "default_channel_on": self.cfg.channel_default_enabled,
            "workspace_retention": retention,
            "opted_out_members": await self.repo.opted_out_count(platform, workspace),
            "forgotten_people": await store.tombstones.count(platform, workspace),
            "forgets_incomplete": incomplete,
            "catchup": catchup,
        }

    async def _catchup_status(
        self, platform: str | None, workspace: str | None, channels: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Saved catch-up/backfill cursors (bot.catchup): how far each channel's history
        fetch got, so `status` shows a run in progress, finished or interrupted; and each
        channel's reconciliation after downtime (bot.reconcile), with what it left unchecked
        in `detail`."""
        repo = self.engine.store.catchup
        names = {c["channel"]: c["name"] for c in channels}
        platforms = (
            [platform] if platform else sorted({c["channel"].split("/")[0] for c in channels})
        )
        out: list[dict[str, Any]] = []
        for plat in platforms:
            for kind in ("catchup", "backfill", "reconcile"):
                for cur in await repo.cursors(plat, kind):
                    if workspace is not None and cur.scope.workspace != workspace:
                        continue
                    out.append(
                        {
                            "channel": str(cur.scope),
                            "name": names.get(str(cur.scope)),
                            "kind": kind,
                            "cursor_ts": cur.cursor_ts,
                            "fetched": cur.fetched,
                            "finished": cur.finished,
                            "updated_at": cur.updated_at,
                            "detail": cur.detail,
                        }
                    )
        return out

    async def audit(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[dict[str, Any]]:
        entries = await self.repo.audit(limit, platform=platform, workspace=workspace)
        return [
            {
                "id": e.id,
                "at": e.at,
                "actor": e.actor,
                "action": e.action,
                "target": e.target,
                "args": e.args,
                "receipt": e.receipt,
                "workspace": f"{e.platform}/{e.workspace}",
            }
            for e in entries
        ]

    async def export_user(
        self,
        platform: str,
        workspace: str,
        user_id: str,
        *,
        readable: Sequence[Scope] | None = None,
    ) -> dict[str, Any]:
        """Their messages and every record they are source or owner of, with provenance.

        `readable`: the channels the requester may read (a chat-side admin); what lies in
        other channels is left out and only counted. None: everything (the CLI's operator)."""
        store = self.engine.store
        allowed = None if readable is None else {s.channel for s in readable}
        rows = await self.repo.user_messages(platform, workspace, user_id)
        recs = await self.repo.user_records(platform, workspace, user_id)
        shown_rows = [r for r in rows if allowed is None or r[0] in allowed]
        shown_recs = [r for r in recs if allowed is None or r.scope.channel in allowed]
        messages = [
            {
                "channel": r[0],
                "message_id": r[1],
                "thread_id": r[2],
                "ts": r[3],
                "text": r[4],
                "edited_at": r[5],
                "link": self.link(
                    Scope(platform=platform, workspace=workspace, channel=r[0]), r[1], r[2]
                ),
            }
            for r in shown_rows
        ]
        records = []
        for rec in shown_recs:
            chain = await store.records.chain(rec.id)
            records.append(
                {
                    "id": rec.id,
                    "channel": rec.scope.channel,
                    "layer": rec.layer.value,
                    "scope": rec.record_scope.value,
                    "content": rec.content,
                    "owner": rec.owner,
                    "source": rec.source,
                    "event": rec.event,
                    "time": rec.time.isoformat(),
                    "state": rec.state.value,
                    "from_ids": list(rec.from_ids),
                    "chain": [n.id for n in chain],
                    "supersedes": rec.supersedes,
                    "superseded_by": rec.superseded_by,
                    "writer_model": rec.writer_model,
                    "prompt_version": rec.prompt_version,
                }
            )
        names = await self.repo.user_names(platform, workspace, user_id)
        return {
            "platform": platform,
            "workspace": workspace,
            "user_id": user_id,
            "display_name": names["display_name"],
            "aliases": names["aliases"],
            "opted_out": await self.repo.is_opted_out(platform, workspace, user_id),
            "exported_at": time.time(),
            "messages": messages,
            "records": records,
            "withheld": {  # in channels the requester cannot read
                "messages": len(rows) - len(shown_rows),
                "records": len(recs) - len(shown_recs),
            },
        }

    async def mine(
        self,
        platform: str,
        workspace: str,
        user_id: str,
        *,
        readable: Sequence[Scope] | None = None,
        limit: int = 25,
    ) -> dict[str, Any]:
        """Active records where the member is source or owner, with links to what they cite.

        Only records from channels the member can read (their roster, or what the platform
        said): a record in a private channel they left does not come back through `mine`."""
        store = self.engine.store
        if readable is None:
            readable = await store.channels.readable_channels(platform, workspace, user_id)
        allowed = {s.channel for s in readable}
        recs = await self.repo.active_user_records(platform, workspace, user_id)
        out: list[dict[str, Any]] = []
        hidden = 0
        for rec in recs:
            if rec.scope.channel not in allowed:
                hidden += 1
                continue
            if len(out) >= limit:
                continue
            cited = await store.messages.by_ids(rec.scope, rec.from_ids)
            out.append(
                {
                    "id": rec.id,
                    "channel": rec.scope.channel,
                    "layer": rec.layer.value,
                    "content": rec.content,
                    "owner": rec.owner,
                    "source": rec.source,
                    "links": [
                        self.link(rec.scope, mid, cited[mid].thread_id if mid in cited else None)
                        for mid in rec.from_ids
                    ],
                }
            )
        return {
            "records": out,
            "total_records": len(recs) - hidden,
            "messages": await self.repo.live_message_count(platform, workspace, user_id),
            "opted_out": await self.repo.is_opted_out(platform, workspace, user_id),
        }

    async def _audit(
        self, platform: str, workspace: str, actor: str, receipt: Receipt, args: dict[str, Any]
    ) -> None:
        await self.repo.log(
            platform=platform,
            workspace=workspace,
            actor=actor,
            action=receipt.action,
            target=receipt.target,
            args=args,
            receipt=receipt,
        )
        log.info("%s by %s on %s: %s", receipt.action, actor, receipt.target, receipt.summary())


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
