"""Forgets in progress: recorded before they start, closed when they are complete.

A forget runs as several transactions (a tombstone, batches of the cascade, the records
naming a person, copies outside the store). One that fails part-way stays open here with
its error, and the scheduler runs it again (each step is idempotent) until it completes;
`status` lists what is still open, so nothing claims a completeness that did not happen.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from speakermem.memory.store.database import Database


@dataclass(frozen=True)
class ForgetJob:
    id: int
    platform: str
    workspace: str
    action: str
    target: str
    actor: str
    args: dict[str, Any]
    started_at: float
    attempts: int
    last_error: str | None


class ForgetJobRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def start(
        self,
        platform: str,
        workspace: str,
        action: str,
        target: str,
        actor: str,
        args: dict[str, Any],
    ) -> int:
        async with self.db.transaction() as tx:
            return await tx.insert(
                "INSERT INTO forget_jobs (platform, workspace, action, target, actor, args,"
                " started_at, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                (
                    platform,
                    workspace,
                    action,
                    target,
                    actor,
                    json.dumps(args, sort_keys=True),
                    time.time(),
                ),
            )

    async def retried(self, job_id: int) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE forget_jobs SET attempts = attempts + 1 WHERE id = ?", (job_id,)
            )

    async def failed(self, job_id: int, error: str) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE forget_jobs SET last_error = ? WHERE id = ?", (error[:300], job_id)
            )

    async def done(self, job_id: int) -> None:
        """Close the job, and any earlier open one of the same forget (this run did their
        work too: the steps are the same and idempotent)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE forget_jobs SET done_at = ?, last_error = NULL WHERE done_at IS NULL"
                " AND (id = ? OR id IN (SELECT j.id FROM forget_jobs j, forget_jobs d"
                " WHERE d.id = ? AND j.platform = d.platform AND j.workspace = d.workspace"
                " AND j.target = d.target AND j.id < d.id))",
                (time.time(), job_id, job_id),
            )

    async def open(
        self, platform: str | None = None, workspace: str | None = None
    ) -> list[ForgetJob]:
        """Forgets not complete yet, oldest first."""
        rows = await self.db.read(
            "SELECT id, platform, workspace, action, target, actor, args, started_at, attempts,"
            " last_error FROM forget_jobs WHERE done_at IS NULL AND (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?) ORDER BY id",
            (platform, platform, workspace, workspace),
        )
        return [
            ForgetJob(
                int(r[0]), r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], int(r[8]), r[9]
            )
            for r in rows
        ]
