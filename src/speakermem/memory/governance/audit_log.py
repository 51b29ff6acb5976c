"""The governance audit log: every admin action with its receipt (counts per table, never
the forgotten text), written by each action and read back by `/memory audit`."""

from __future__ import annotations

import logging
from typing import Any

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import Receipt

log = logging.getLogger(__name__)


class AuditLog:
    def __init__(self, engine: MemoryEngine) -> None:
        self.repo = engine.store.governance

    async def record(
        self, platform: str, workspace: str, actor: str, receipt: Receipt, args: dict[str, Any]
    ) -> None:
        """One entry for an action on a workspace ("*" for all), and an info line."""
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

    async def entries(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[dict[str, Any]]:
        """The latest `limit` entries, of one workspace (or platform) when given."""
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
