"""The interaction graph's upkeep: who spoke to whom and reply links, inferred from new
messages, inline or by a background worker that gives way to /recall.

The engine owns one (`engine.graph`) and tells it which channels received messages; the
inference itself is the store's (`store.interactions`), with names from each roster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from speakermem.memory.background import Foreground, WakeWorker
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import RosterMember, Scope
from speakermem.memory.store import Store

Members = Callable[[Scope], Awaitable[list[RosterMember]]]


class InteractionGraph:
    """Keeps `store.interactions` current for the channels it hears about."""

    def __init__(
        self, store: Store, members: Members, foreground: Foreground, settle_rows: int
    ) -> None:
        self.store = store
        self.members = members
        self.foreground = foreground
        self.settle_rows = settle_rows
        """A catch-up reading this many messages settles the store (fresh statistics)."""
        self._worker = WakeWorker("interactions", self._infer_dirty)
        self._dirty: set[Scope] | None = None
        """Channels with new messages for the worker (None: all, on its first pass)."""

    async def infer(self, scopes: Iterable[Scope] | None = None, *, batch: int = 500) -> int:
        """Infer the new messages of `scopes` (all known channels if None); returns how many
        messages were read."""
        if scopes is None:
            targets = await self.store.interactions.behind()
        else:
            targets = [
                (pk, scope)
                for scope in scopes
                if (pk := await self.store.channels.lookup(scope)) is not None
            ]
        total = 0
        for pk, scope in targets:
            names = interaction_names(await self.members(scope))
            while n := await self.store.interactions.update(pk, names, limit=batch):
                total += n
        if total >= self.settle_rows:
            await self.store.settle()
        return total

    def changed(self, scopes: Iterable[Scope]) -> None:
        """New messages arrived in `scopes`: the worker, if running, reads them soon."""
        if self._worker.running:
            if self._dirty is not None:
                self._dirty.update(scopes)
            self._worker.wake()

    async def _infer_dirty(self) -> None:
        scopes, self._dirty = self._dirty, set()
        try:
            await self.foreground.yield_to()
            await self.infer(scopes)
        except Exception:  # the cursors have not moved: read these channels again
            self._dirty = None if scopes is None else self._dirty | scopes
            raise

    def start(self) -> None:
        """Keep the graph current as messages arrive, off the /recall path (/recall then
        finds nothing left to infer). Starts with every channel's backlog."""
        if not self._worker.running:
            self._dirty = None
            self._worker.start()

    @property
    def running(self) -> bool:
        """Whether the background worker keeps the graph current (then /recall leaves it
        alone: its inline catch-up would wait on the write lock under load)."""
        return self._worker.running

    async def stop(self) -> None:
        await self._worker.stop()
