"""The background embedding worker: vectors for new messages soon after they arrive.

It gives way to /recall (`memory.background.Foreground`): before each small batch it waits
while a /recall is in flight (for at most the gate's `max_defer_s`), and a batch let through
while one waits runs on the embedder's nicer threads.
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
        """One pass over what is pending: the worker's work."""
        await self.engine.embed_pending(
            batch_size=self._batch,
            before_batch=self.engine.foreground.yield_to,
            embed=self._vectors,
        )

    async def _vectors(self, texts: list[str]) -> np.ndarray:
        """One batch: at the process's own priority while no /recall is in flight, so the
        backlog drains whenever /recall is idle (at a lower one it got only what ingestion
        and the Writer left, and under steady traffic grew without end); below it while a
        /recall waits (the gate let the batch through after `max_defer_s`)."""
        embedder = self.engine.embedder
        assert embedder is not None
        if isinstance(embedder, BackgroundEmbedder):
            yield_cpu = self.engine.foreground.active > 0
            return await embedder.embed_background(texts, yield_cpu=yield_cpu)
        return await embedder.embed(texts)
