"""The admin audit log and the re-derivation queue (records a forget withdrew while other
messages still support them, written again by the Writer)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import Scope
from speakermem.memory.store.database import Database, Transaction


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    platform: str
    workspace: str
    actor: str
    action: str
    target: str
    args: dict[str, Any]
    receipt: dict[str, Any]


@dataclass(frozen=True)
class RederiveItem:
    id: int
    scope: Scope
    layer: str
    owner: str
    source: str
    from_ids: tuple[str, ...]
    attempts: int


class AuditLog:
    """Part of `GovernanceRepo`: who did what, with its receipt."""

    db: Database

    async def log(
        self,
        *,
        platform: str,
        workspace: str,
        actor: str,
        action: str,
        target: str = "",
        args: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
    ) -> int:
        async with self.db.transaction() as tx:
            return await tx.insert(
                "INSERT INTO audit_log (at, platform, workspace, actor, action, target, args,"
                " receipt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    platform,
                    workspace,
                    actor,
                    action,
                    target,
                    json.dumps(args or {}, sort_keys=True),
                    json.dumps(receipt.counts if receipt else {}, sort_keys=True),
                ),
            )

    async def audit(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[AuditEntry]:
        rows = await self.db.read(
            "SELECT id, at, platform, workspace, actor, action, target, args, receipt"
            # one workspace's entries only: a ('*','*') entry (retention runs before each
            # workspace got its own receipt) carries counts from every workspace
            " FROM audit_log WHERE (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)"
            " ORDER BY id DESC LIMIT ?",
            (platform, platform, workspace, workspace, limit),
        )
        return [
            AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), json.loads(r[8]))
            for r in rows
        ]


class RederiveQueue:
    """Part of `GovernanceRepo`: the queue of records to write again."""

    db: Database

    async def rederive_depth(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM rederive_queue WHERE (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)",
            (platform, platform, workspace, workspace),
        )
        return int(rows[0][0])

    async def due_rederive(
        self, limit: int = 50, *, now: float | None = None
    ) -> list[RederiveItem]:
        now = time.time() if now is None else now
        rows = await self.db.read(
            "SELECT id, platform, workspace, channel, layer, owner, source, from_ids, attempts"
            " FROM rederive_queue WHERE next_attempt_at IS NULL OR next_attempt_at <= ?"
            " ORDER BY id LIMIT ?",
            (now, limit),
        )
        return [
            RederiveItem(
                r[0],
                Scope(platform=r[1], workspace=r[2], channel=r[3]),
                r[4],
                r[5],
                r[6],
                tuple(json.loads(r[7])),
                r[8],
            )
            for r in rows
        ]

    async def defer_rederive(self, item_id: int, error: str, delay_s: float) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rederive_queue SET attempts = attempts + 1, next_attempt_at = ?,"
                " last_error = ? WHERE id = ?",
                (time.time() + delay_s, error[:300], item_id),
            )

    async def finish_rederive(self, tx: Transaction, item_id: int) -> None:
        await tx.execute("DELETE FROM rederive_queue WHERE id = ?", (item_id,))

    async def drop_rederive(self, item_id: int) -> None:
        async with self.db.transaction() as tx:
            await self.finish_rederive(tx, item_id)
