"""History cursors: how far each channel's catch-up, backfill or reconciliation got.

The engine's door to them (`engine.cursors`): bot.catchup, bot.reconcile, the platforms'
history readers and `speakermem backfill` keep their place here and never hold a store
repository. A run saves its cursor after every page, so an interrupted one resumes where it
stopped; a cursor of kind "reconcile" keeps its own state as JSON in `detail`.
"""

from __future__ import annotations

from typing import Any

from speakermem.memory.models import Scope
from speakermem.memory.store import Store
from speakermem.memory.store.catchup import Cursor

__all__ = ["Cursor", "HistoryCursors"]


class HistoryCursors:
    """Saved positions in each channel's history, by kind ("catchup", "backfill",
    "reconcile"), and where each channel's stored history ends."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def newest(
        self, platform: str, workspace: str | None = None
    ) -> dict[Scope, tuple[str, float, str | None]]:
        """Each channel's newest stored message: (id, ts, channel name); deleted messages
        count too (their ids still mark how far the channel was seen)."""
        return await self._store.catchup.newest(platform, workspace)

    async def cursors(self, platform: str, kind: str = "catchup") -> list[Cursor]:
        """Every saved cursor of this kind on the platform."""
        return await self._store.catchup.cursors(platform, kind)

    async def cursor(self, scope: Scope, kind: str) -> Cursor | None:
        """The channel's cursor of this kind, None if no run saved one."""
        return await self._store.catchup.cursor(scope, kind)

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
        """Record where the channel's run of this kind stands (one transaction)."""
        await self._store.catchup.save(
            scope,
            kind,
            cursor_id=cursor_id,
            cursor_ts=cursor_ts,
            fetched=fetched,
            finished=finished,
            detail=detail,
        )
