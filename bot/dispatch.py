"""Route platform-neutral events to the memory engine; one error funnel for all of them.

Adapters ack first, then hand events here. A bad event is logged and skipped; it never
takes the bot down and never leaves a partial row (each store write is one transaction).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    Event,
    MessageEvent,
    RosterEvent,
)
from memory.engine import MemoryEngine
from memory.models import Scope
from memory.query.answer import RecallAnswer
from memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest
from memory.store import IngestStatus

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 4000


@dataclass
class DispatchStats:
    handled: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class Dispatcher:
    def __init__(
        self,
        engine: MemoryEngine,
        pipeline: RecallPipeline,
        *,
        on_message_stored: Callable[[], None] | None = None,
        kick_interval_s: float = 1.0,
        on_recall: Callable[[float, str], None] | None = None,
    ) -> None:
        """`on_recall(seconds, outcome)` observes each /recall (metrics); outcome is
        answered, refused or failed."""
        self.engine = engine
        self.pipeline = pipeline
        self.on_message_stored = on_message_stored
        self.kick_interval_s = kick_interval_s
        self.on_recall = on_recall
        self._last_kick = 0.0
        self.stats = DispatchStats()

    async def handle(self, event: Event) -> None:
        """Apply one event; errors are logged and counted, never raised (the funnel)."""
        kind = type(event).__name__
        try:
            await self._apply(event)
        except Exception:
            self.stats.errors[kind] += 1
            log.exception("failed to apply %s in %s; skipped", kind, getattr(event, "scope", "?"))

    async def _apply(self, event: Event) -> None:
        if isinstance(event, MessageEvent):
            if event.speaker_is_bot:
                self.stats.ignored["bot_message"] += 1
                return
            outcome = await self.engine.ingest(event)
            self.stats.handled[f"message_{outcome.status.value}"] += 1
            if outcome.status is IngestStatus.STORED:
                self._kick()
        elif isinstance(event, EditEvent):
            status = await self.engine.edit(event)
            self.stats.handled[f"edit_{status.value}"] += 1
        elif isinstance(event, DeleteEvent):
            status = await self.engine.delete(event)
            self.stats.handled[f"delete_{status.value}"] += 1
        elif isinstance(event, RosterEvent):
            await self.engine.roster(event)
            self.stats.handled[f"roster_{event.action.value}"] += 1
        elif isinstance(event, CommandInvocation):
            await self.recall(event)
        else:  # pragma: no cover - the Event union is closed
            self.stats.ignored[type(event).__name__] += 1

    def _kick(self) -> None:
        now = time.monotonic()
        if self.on_message_stored and now - self._last_kick >= self.kick_interval_s:
            self._last_kick = now
            self.on_message_stored()

    async def recall(self, inv: CommandInvocation) -> RecallAnswer:
        """Answer /recall for the invoker; refusals and failures come back as answers."""
        started = time.perf_counter()
        failures = self.stats.errors["recall"]
        answer = await self._recall(inv)
        if self.on_recall is not None:
            outcome = "refused" if answer.refused else "answered"
            if self.stats.errors["recall"] > failures:
                outcome = "failed"
            self.on_recall(time.perf_counter() - started, outcome)
        return answer

    async def _recall(self, inv: CommandInvocation) -> RecallAnswer:
        question = (inv.options.get("question") or inv.text or "").strip()[:MAX_QUESTION_CHARS]
        if not question:
            return RecallAnswer(
                text="Ask me something, e.g. `/recall what did we decide?`", refused=True
            )
        readable = (
            None
            if inv.readable_channels is None
            else [
                Scope(platform=inv.scope.platform, workspace=inv.scope.workspace, channel=c)
                for c in inv.readable_channels
            ]
        )
        request = RecallRequest(question, inv.scope, asker=inv.user_id, readable=readable)
        try:
            result = await self.pipeline.run(request)
        except AccessDenied as exc:
            self.stats.handled["recall_refused"] += 1
            return RecallAnswer(text=f"Sorry: {exc}.", refused=True)
        except Exception:
            self.stats.errors["recall"] += 1
            log.exception("recall failed in %s", inv.scope)
            return RecallAnswer(
                text="Sorry, something went wrong while recalling. Please try again.",
                refused=True,
            )
        self.stats.handled["recall"] += 1
        return result.answer
