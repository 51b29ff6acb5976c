"""Every forget as a recorded job: a message, a person, a channel's whole memory.

A forget is several transactions: for a person the tombstone first (from then on nothing
of theirs is stored or committed), then copies outside the store (the forget hooks: the
bot's spill), then the cascade over their messages in batches, their records, the records
of others that name them, and their name rows. Each step is idempotent. The job is written
to `forget_jobs` before the first step and closed after the last, with its receipt in the
audit log; a failure leaves the job open, an audit entry marked incomplete (counting only
what committed) and a `ForgetIncomplete` for the caller, and `resume` runs it again (the
scheduler's housekeeping job) until it completes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from speakermem.memory.config import GovernanceConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.errors import ForgetIncomplete, GovernanceError
from speakermem.memory.governance.policy import Forgotten, Receipt
from speakermem.memory.models import Scope

log = logging.getLogger(__name__)

ForgetHook = Callable[[Forgotten], Awaitable[object]]
"""Removes a forget's words from a copy outside the store (the bot's spill); runs inside
the forget, so a hook that fails leaves the forget incomplete (and resumed)."""
Audit = Callable[[str, str, str, Receipt, dict[str, Any]], Awaitable[None]]
"""Writes an audit entry: (platform, workspace, actor, receipt, args)."""
Steps = Callable[[Receipt], Awaitable[None]]


@dataclass(frozen=True)
class ForgetSpec:
    """What one forget does, as its job records it (`forget_jobs`): a resumed job runs the
    same steps again."""

    platform: str
    workspace: str
    action: str
    target: str
    actor: str
    args: dict[str, Any]


class Forgetting:
    def __init__(self, engine: MemoryEngine, cfg: GovernanceConfig, audit: Audit) -> None:
        self.engine = engine
        self.repo = engine.store.governance
        self.cfg = cfg
        self.audit = audit
        self.hooks: list[ForgetHook] = []
        """Run by every forget (bot.dispatch registers the spill's)."""

    # ---- the forgets ----------------------------------------------------------------------

    async def message(self, scope: Scope, message_id: str, *, actor: str) -> Receipt:
        return await self._job(
            ForgetSpec(
                scope.platform,
                scope.workspace,
                "forget-message",
                f"{scope}/{message_id}",
                actor,
                {"channel": scope.channel, "message_id": message_id},
            )
        )

    async def person(
        self, platform: str, workspace: str, user_id: str, *, actor: str, action: str
    ) -> Receipt:
        return await self._job(ForgetSpec(platform, workspace, action, user_id, actor, {}))

    async def channel(self, scope: Scope, *, actor: str) -> Receipt:
        return await self._job(
            ForgetSpec(
                scope.platform,
                scope.workspace,
                "channel-off-purge",
                str(scope),
                actor,
                {"purge": True, "channel": scope.channel},
            )
        )

    async def lift(self, platform: str, workspace: str, user_id: str, *, actor: str) -> Receipt:
        """Let a forgotten person be remembered again from now on (what was forgotten stays
        forgotten). Audited; an admin's way besides the person opting in."""
        if not await self.engine.store.tombstones.lift(platform, workspace, user_id):
            raise GovernanceError(f"{user_id} is not forgotten in {platform}/{workspace}")
        receipt = Receipt(action="forget-lift", target=user_id)
        receipt.add("forgotten_people", 1)
        await self.audit(platform, workspace, actor, receipt, {})
        return receipt

    async def resume(self) -> list[Receipt]:
        """Run every forget a failure left incomplete again; raises ForgetIncomplete when
        one still fails."""
        jobs = self.engine.store.forget_jobs
        done: list[Receipt] = []
        for job in await jobs.open():
            await jobs.retried(job.id)
            spec = ForgetSpec(
                job.platform, job.workspace, job.action, job.target, job.actor, job.args
            )
            done.append(await self._run(job.id, spec, resumed=True))
        return done

    # ---- the steps ------------------------------------------------------------------------

    def _steps(self, spec: ForgetSpec) -> Steps:
        """The idempotent steps of a forget (run again, they finish what is left)."""
        platform, workspace, action, args = spec.platform, spec.workspace, spec.action, spec.args
        if action == "forget-message":
            scope = Scope(platform=platform, workspace=workspace, channel=args["channel"])
            return lambda r: self._message_steps(scope, args["message_id"], r)
        if action == "channel-off-purge":
            scope = Scope(platform=platform, workspace=workspace, channel=args["channel"])
            return lambda r: self._channel_steps(scope, spec.actor, r)
        return lambda r: self._person_steps(platform, workspace, spec.target, action, r)

    async def _message_steps(self, scope: Scope, message_id: str, receipt: Receipt) -> None:
        await self.run_hooks(
            Forgotten(
                scope.platform, scope.workspace, channel=scope.channel, message_ids=(message_id,)
            )
        )
        pks = await self.repo.message_pks(scope, [message_id])
        await self.repo.forget_messages(
            pks, receipt, reason="forget-message", batch=self.cfg.forget_batch
        )

    async def _person_steps(
        self, platform: str, workspace: str, user_id: str, action: str, receipt: Receipt
    ) -> None:
        tombstones = self.engine.store.tombstones
        # the tombstone first: from here on nothing of theirs is stored or committed
        names = await tombstones.names_of(platform, workspace, user_id)
        new = not await tombstones.is_forgotten(platform, workspace, user_id)
        named = await tombstones.bury(platform, workspace, user_id, names)
        receipt.add("forgotten_people", int(new))
        await self.run_hooks(Forgotten(platform, workspace, user_id=user_id))
        people = {user_id}
        pks = await self.repo.user_message_pks(platform, workspace, user_id)
        await self.repo.forget_messages(
            pks, receipt, reason=action, forgotten_people=people, batch=self.cfg.forget_batch
        )
        about = await self.repo.user_record_ids(platform, workspace, user_id)
        await self.repo.withdraw(about, receipt, reason=action, forgotten_people=people)
        # records of others (GROUP ones above all) that name them by a name or an alias
        naming = await tombstones.records_naming(platform, workspace, named)
        if naming:
            before = receipt.counts.get("records", 0)
            await self.repo.withdraw(naming, receipt, reason=action, forgotten_people=people)
            receipt.add("records_naming", receipt.counts.get("records", 0) - before)
        await self.repo.delete_user_rows(platform, workspace, user_id, receipt)

    async def _channel_steps(self, scope: Scope, actor: str, receipt: Receipt) -> None:
        await self.repo.set_channel_enabled(scope, False, actor)
        receipt.counts["channel_policy"] = 1
        await self.run_hooks(Forgotten(scope.platform, scope.workspace, channel=scope.channel))
        pks = await self.repo.channel_message_pks(scope)
        await self.repo.forget_messages(
            pks, receipt, reason="channel-purge", batch=self.cfg.forget_batch
        )
        # records of the channel with no cited message left (defensive: nothing may stay)
        left = await self.repo.channel_record_ids(scope)
        if left:
            await self.repo.withdraw(left, receipt, reason="channel-purge", requeue=False)

    async def run_hooks(self, forgotten: Forgotten) -> None:
        """Tell the copies outside the store (the bot's spill) what a forget covers."""
        for hook in self.hooks:
            await hook(forgotten)

    # ---- the job ----------------------------------------------------------------------------

    async def _job(self, spec: ForgetSpec) -> Receipt:
        job = await self.engine.store.forget_jobs.start(
            spec.platform, spec.workspace, spec.action, spec.target, spec.actor, spec.args
        )
        return await self._run(job, spec)

    async def _run(self, job: int, spec: ForgetSpec, *, resumed: bool = False) -> Receipt:
        receipt = Receipt(action=spec.action, target=spec.target)
        logged = {k: v for k, v in spec.args.items() if k not in ("channel", "message_id")}
        if resumed:
            logged["resumed"] = job
        try:
            await self._steps(spec)(receipt)
        except Exception as exc:
            receipt.complete = False
            receipt.notes.append("incomplete: retried automatically until done")
            try:
                await self.engine.store.forget_jobs.failed(job, f"{type(exc).__name__}: {exc}")
                await self.audit(
                    spec.platform,
                    spec.workspace,
                    spec.actor,
                    receipt,
                    {**logged, "complete": False},
                )
            except Exception:  # the store is failing: the open job still says so
                log.exception("could not record the incomplete %s of %s", spec.action, spec.target)
            raise ForgetIncomplete(receipt, exc) from exc
        await self.engine.store.forget_jobs.done(job)
        await self.audit(spec.platform, spec.workspace, spec.actor, receipt, logged)
        return receipt
