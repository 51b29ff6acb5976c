"""Governance reports: what the store holds and does (`status`), and what it holds of one
member (`export_user`, `mine`), each limited to what the asker may see.

`Governance` takes these from `GovernanceReports`; they read, never change anything.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from speakermem.memory.config import GovernanceConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import channel_enabled
from speakermem.memory.models import Scope
from speakermem.memory.query.links import LinkResolver
from speakermem.memory.store.diagnostics import status_counts
from speakermem.memory.store.protocol import Governance as GovernanceStore
from speakermem.memory.store.usage import writer_status

LLMProbe = Callable[[], Awaitable[bool]]
"""Answers whether the LLM endpoint is reachable (built in the composition root)."""


class GovernanceReports:
    """The read-only half of `Governance` (memory.governance.service)."""

    engine: MemoryEngine
    repo: GovernanceStore
    cfg: GovernanceConfig
    llm_probe: LLMProbe | None
    link: LinkResolver

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
