"""The background embedding worker: vectors for new messages soon after they arrive.

It gives way to /recall. Any embedder but a `BackgroundEmbedder` waits before each small batch
while a /recall is in flight (the `memory.background.Foreground` gate, for at most its
`max_defer_s`). A `BackgroundEmbedder` with drafts (the bot's MiniLM) needs no gate:
- when more than one batch waits (`falling_behind`), it embeds them from its quicker int8
  graph at the process's priority: a message without any vector is found only by its words,
  and on a busy machine idle-priority work alone left the backlog growing;
- a batch or less waiting gets its final vectors at once, at the process's priority;
- a second worker writes full-precision vectors over the drafts in Linux's idle class, on
  cores nothing else wants. It runs beside the first and never in its way: on a busy machine
  an idle-class batch can wait seconds for a core, and new messages must not wait for it.
Without drafts, a `BackgroundEmbedder`'s batches all run in the idle class.
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
        self._replacer = WakeWorker("draft-replacer", self._replace_drafts)
        self._batch = BACKGROUND_EMBED_BATCH

    def wake(self) -> None:
        """New or changed messages: a pass soon (coalesced with one already due)."""
        self._worker.wake()

    def start(self, *, batch_size: int = BACKGROUND_EMBED_BATCH) -> None:
        if self.engine.embedder is None:
            return
        self._batch = batch_size
        self._worker.start()
        if self._drafting():
            self._replacer.start()

    async def stop(self) -> None:
        await self._worker.stop()
        await self._replacer.stop()

    async def backlog(self) -> None:
        """The periodic safety net: embed what the live path left without a vector, through
        the worker when it runs (batch by batch, giving way to /recall), else here in the
        same small batches. Never a long run of its own: under load a backlog of thousands
        would hold the cores and make shutdown wait for all of it."""
        if self._worker.running:
            self._worker.wake()
            return
        await self._pass()

    def _drafting(self) -> bool:
        embedder = self.engine.embedder
        return isinstance(embedder, BackgroundEmbedder) and embedder.drafts

    async def _pass(self) -> None:
        """One pass over everything pending, then a word to the replacer. Drafts only while
        the workers run: the safety net's own pass (no workers) writes final vectors."""
        embedder = self.engine.embedder
        if not isinstance(embedder, BackgroundEmbedder):
            await self.engine.embed_pending(
                batch_size=self._batch, before_batch=self.engine.foreground.yield_to
            )
            return
        if not self._drafting():
            await self.engine.embed_pending(batch_size=self._batch, embed=self._finals)
            return
        # A batch or less waiting gets its final vectors at once, at the process's priority
        # (`embed`): it is little work, and in the idle class it could keep the worker, and
        # the messages after it, waiting for a core.
        drafting = self._replacer.running
        await self.engine.embed_pending(
            batch_size=self._batch, embed=embedder.embed, draft=self._drafts if drafting else None
        )
        if drafting:
            self._replacer.wake()

    async def _replace_drafts(self) -> None:
        """Full-precision vectors over every draft, a batch at a time (until a batch replaces
        none: drafts that changed meanwhile wait for the next wake-up)."""
        while await self.engine.replace_drafts(batch_size=self._batch, embed=self._finals):
            pass

    async def _finals(self, texts: list[str]) -> np.ndarray:
        embedder = self.engine.embedder
        assert isinstance(embedder, BackgroundEmbedder)
        return await embedder.embed_background(texts, draft=False)

    async def _drafts(self, texts: list[str]) -> np.ndarray:
        embedder = self.engine.embedder
        assert isinstance(embedder, BackgroundEmbedder)
        return await embedder.embed_background(texts, draft=True)
