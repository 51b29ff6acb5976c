"""The background embedding worker: vectors for new messages soon after they arrive.

It gives way to /recall. A `BackgroundEmbedder` (the bot's MiniLM) gives way at the CPU, so
it needs no gate: its final vectors run only on cores that nothing else wants (Linux's idle
class), using every idle moment, also while a /recall is in flight. Any other embedder waits
before each small batch while a /recall is in flight (the `memory.background.Foreground` gate,
for at most its `max_defer_s`).

When more than one batch waits (`falling_behind`), a `BackgroundEmbedder` with drafts embeds
them from its quicker graph, at the process's priority: a message without any vector is found
only by its words, and on a busy machine the idle class alone left the backlog growing. Once
nothing waits for a first vector the worker writes the drafts again at full precision, one
batch at a time, looking for new messages between batches (a message without any vector always
comes first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from speakermem.memory.background import WakeWorker
from speakermem.memory.ports import BackgroundEmbedder

if TYPE_CHECKING:
    from speakermem.memory.engine import MemoryEngine

BACKGROUND_EMBED_BATCH = 16
"""Messages per background embedding batch: small, so a /recall arriving mid-batch waits
at most one short batch for the embedder's thread and the cores."""


class BackgroundEmbedding:
    """One engine's background embedding (started by the bot, not by one-shot commands)."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine
        self._worker = WakeWorker("embedder", self._pass)
        self._batch = BACKGROUND_EMBED_BATCH

    def wake(self) -> None:
        """New or changed messages: a pass soon (coalesced with one already due)."""
        self._worker.wake()

    def start(self, *, batch_size: int = BACKGROUND_EMBED_BATCH) -> None:
        if self.engine.embedder is None:
            return
        self._batch = batch_size
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()

    async def backlog(self) -> None:
        """The periodic safety net: embed what the live path left without a vector, through
        the worker when it runs (batch by batch, giving way to /recall), else here in the
        same small batches. Never a long run of its own: under load a backlog of thousands
        would hold the cores and make shutdown wait for all of it."""
        if self._worker.running:
            self._worker.wake()
            return
        await self._pass()

    async def _pass(self) -> None:
        """One pass: everything pending, then the drafts batch by batch for as long as no
        new message waits (each batch of drafts is followed by a look at what is pending)."""
        embedder = self.engine.embedder
        if not isinstance(embedder, BackgroundEmbedder):
            await self.engine.embed_pending(
                batch_size=self._batch, before_batch=self.engine.foreground.yield_to
            )
            return
        draft = self._drafts if embedder.drafts else None
        while True:
            await self.engine.embed_pending(batch_size=self._batch, embed=self._finals, draft=draft)
            if draft is None or not await self.engine.replace_drafts(
                batch_size=self._batch, embed=self._finals
            ):
                return

    async def _finals(self, texts: list[str]) -> np.ndarray:
        embedder = self.engine.embedder
        assert isinstance(embedder, BackgroundEmbedder)
        return await embedder.embed_background(texts, draft=False)

    async def _drafts(self, texts: list[str]) -> np.ndarray:
        embedder = self.engine.embedder
        assert isinstance(embedder, BackgroundEmbedder)
        return await embedder.embed_background(texts, draft=True)
