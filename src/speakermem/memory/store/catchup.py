"""Catch-up cursors: where each channel's history fetch stands, so an interrupted run resumes.

A run records, per channel, the newest message it has fetched (`cursor_id`, `cursor_ts`)
after every page, and `finished` once it reached the present. The next run starts from an
unfinished cursor, else from the newest message stored before live events resumed.

Reconciliation after downtime (bot/reconcile.py) keeps a cursor of kind "reconcile" whose
`detail` holds its own state (the windows still to check and what it found) as JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from speakermem.memory.models import Scope
from speakermem.memory.store.database import Database


@dataclass(frozen=True)
class Cursor:
    scope: Scope
    kind: str
    cursor_id: str | None
    cursor_ts: float | None
    fetched: int
    finished: bool
    updated_at: float
    detail: dict[str, Any] = field(default_factory=dict)


class CatchupRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def newest(
        self, platform: str, workspace: str | None = None
    ) -> dict[Scope, tuple[str, float, str | None]]:
        """Each channel's newest stored message: (id, ts, channel name). Deleted messages
        count too: their ids still mark how far the channel was seen. Whether memory is on
        is the governance policy's to say (bot.catchup asks it)."""
        sql = (
            "SELECT c.platform, c.workspace, c.channel, m.message_id, m.ts, c.name FROM channels c"
            " JOIN messages m ON m.id = (SELECT m2.id FROM messages m2 WHERE m2.channel_pk = c.id"
            " ORDER BY m2.ts DESC, m2.id DESC LIMIT 1) WHERE c.platform = ?"
        )
        params: list[object] = [platform]
        if workspace is not None:
            sql += " AND c.workspace = ?"
            params.append(workspace)
        rows = await self.db.read(sql, params)
        return {
            Scope(platform=r[0], workspace=r[1], channel=r[2]): (str(r[3]), float(r[4]), r[5])
            for r in rows
        }

    async def cursors(self, platform: str, kind: str = "catchup") -> list[Cursor]:
        rows = await self.db.read(
            "SELECT platform, workspace, channel, kind, cursor_id, cursor_ts, fetched, finished,"
            " updated_at, detail FROM catchup_cursors WHERE platform = ? AND kind = ?",
            (platform, kind),
        )
        return [_cursor(r) for r in rows]

    async def cursor(self, scope: Scope, kind: str) -> Cursor | None:
        rows = await self.db.read(
            "SELECT platform, workspace, channel, kind, cursor_id, cursor_ts, fetched, finished,"
            " updated_at, detail FROM catchup_cursors WHERE platform = ? AND workspace = ?"
            " AND channel = ? AND kind = ?",
            (*scope.key(), kind),
        )
        return _cursor(rows[0]) if rows else None

    async def save(
        self,
        scope: Scope,
        kind: str,
        *,
        cursor_id: str | None,
        cursor_ts: float | None,
        fetched: int,
        finished: bool,
        detail: dict[str, Any] | None = None,
    ) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO catchup_cursors (platform, workspace, channel, kind, cursor_id,"
                " cursor_ts, fetched, finished, updated_at, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (platform, workspace, channel, kind) DO UPDATE SET"
                " cursor_id = excluded.cursor_id, cursor_ts = excluded.cursor_ts,"
                " fetched = excluded.fetched, finished = excluded.finished,"
                " updated_at = excluded.updated_at, detail = excluded.detail",
                (
                    *scope.key(),
                    kind,
                    cursor_id,
                    cursor_ts,
                    fetched,
                    int(finished),
                    time.time(),
                    json.dumps(detail, sort_keys=True) if detail else None,
                ),
            )


def _cursor(r: Any) -> Cursor:
    detail = json.loads(r[9]) if r[9] else {}
    return Cursor(
        scope=Scope(platform=r[0], workspace=r[1], channel=r[2]),
        kind=r[3],
        cursor_id=r[4],
        cursor_ts=r[5],
        fetched=int(r[6]),
        finished=bool(r[7]),
        updated_at=float(r[8]),
        detail=detail if isinstance(detail, dict) else {},
    )
