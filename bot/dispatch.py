"""Route platform-neutral events to the memory engine; one error funnel for all of them.

Adapters ack first, then hand events here. A bad event is logged and skipped; it never
takes the bot down and never leaves a partial row (each store write is one transaction).

When the database or its disk is full (`StoreFull`), an event already acked upstream is
kept in the spill (`bot.spill`) and replayed, in order, once space returns: on start,
every `spill_retry_s` and on the next event. While the spill holds events, new ones queue
behind them. A full spill refuses the event with an error in the log and the
`spill_refused` error count; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    Event,
    MessageEvent,
    RosterEvent,
)
from bot.governance import CommandReply, PendingActions
from bot.governance_commands import run_confirmed, run_memory_command
from bot.spill import Spill, SpillFull, StorableEvent
from memory.engine import MemoryEngine
from memory.governance.service import Governance
from memory.models import Scope
from memory.query.answer import RecallAnswer
from memory.query.pipeline import AccessDenied, Recaller, RecallRequest
from memory.store import IngestOutcome, IngestStatus
from memory.store.database import StoreFull

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 4000
_STORABLE = (MessageEvent, EditEvent, DeleteEvent, RosterEvent)
GROUP_MAX = 200
"""Most new messages written in one group-commit transaction (`Dispatcher.handle_grouped`)."""

Notifier = Callable[[Scope, str], Awaitable[None]]
"""Posts a plain message in a channel (the one-time memory notice)."""

NOTICE_TEXT = (
    "Heads-up: I remember this channel's conversation so `/recall` can answer questions "
    "about it with cited messages. `/memory opt-out` stops storing your messages "
    "(`/memory opt-out forget` also removes what I have); `/memory mine` shows what I hold "
    "about you."
)


@dataclass
class DispatchStats:
    handled: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class Dispatcher:
    def __init__(
        self,
        engine: MemoryEngine,
        pipeline: Recaller,
        *,
        on_message_stored: Callable[[], None] | None = None,
        kick_interval_s: float = 1.0,
        on_recall: Callable[[float, str], None] | None = None,
        governance: Governance | None = None,
        spill: Spill | None = None,
        spill_retry_s: float = 10.0,
    ) -> None:
        """`on_recall(seconds, outcome)` observes each /recall (metrics); outcome is
        answered, refused or failed. `spill` keeps events the full store refused."""
        self.engine = engine
        self.pipeline = pipeline
        self.on_message_stored = on_message_stored
        self.kick_interval_s = kick_interval_s
        self.on_recall = on_recall
        self.governance = governance or Governance(engine)
        self.pending = PendingActions()
        self._notifiers: dict[str, Notifier] = {}
        self._notice_tasks: set[asyncio.Task[None]] = set()
        # channels whose notice this process has claimed or found posted: a claim is a write
        # transaction, and every stored message would otherwise ask again (a posted notice
        # stays posted; only a failed post releases its claim)
        self._noticed: set[tuple[str, str, str]] = set()
        self._last_kick = 0.0
        self.stats = DispatchStats()
        self.spill = spill
        self.spill_retry_s = spill_retry_s
        self._spill_lock = asyncio.Lock()
        self._last_replay = float("-inf")
        self._group: list[tuple[MessageEvent, asyncio.Future[None]]] = []
        self._group_task: asyncio.Task[None] | None = None

    async def handle(self, event: Event) -> None:
        """Apply one event; errors are logged and counted, never raised (the funnel)."""
        kind = type(event).__name__
        try:
            if self.spill is not None and isinstance(event, _STORABLE) and self.spill.count:
                if time.monotonic() - self._last_replay >= self.spill_retry_s:
                    await self.replay_spill()
                if self.spill.count:  # earlier events still wait: this one goes behind them
                    await self._keep(event, "earlier events wait in the spill")
                    return
            await self._apply(event)
        except StoreFull as exc:
            if self.spill is None or not isinstance(event, _STORABLE):
                self.stats.errors[kind] += 1
                log.error("failed to apply %s: %s", kind, exc)
                return
            self.stats.errors["store_full"] += 1
            self._last_replay = time.monotonic()  # a write just failed: retry after a pause
            await self._keep(event, str(exc))
        except Exception:
            self.stats.errors[kind] += 1
            log.exception("failed to apply %s in %s; skipped", kind, getattr(event, "scope", "?"))

    async def handle_grouped(self, event: MessageEvent) -> None:
        """Apply a new message, sharing one store transaction with the messages that other
        handlers hand in meanwhile (group commit): while a batch is being written, new
        arrivals wait and go together in the next one. Returns once the message's batch is
        applied, with the same filters, outcomes and fallbacks as `handle_many`.

        The writing runs in its own task, so a caller that is cancelled (or times out)
        never strands the others' messages."""
        done = asyncio.get_running_loop().create_future()
        self._group.append((event, done))
        if self._group_task is None or self._group_task.done():
            self._group_task = asyncio.create_task(self._write_groups(), name="dispatch-group")
        await asyncio.shield(done)

    async def _write_groups(self) -> None:
        while self._group:
            batch = self._group[:GROUP_MAX]
            del self._group[:GROUP_MAX]
            try:
                await self.handle_many([event for event, _ in batch])
            finally:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def handle_many(self, events: Sequence[MessageEvent]) -> None:
        """Apply a burst of new messages (consecutive, from one adapter) in one store
        transaction instead of one each: the same filters, outcomes and spill as `handle`
        one by one. Anything unusual (a spill waiting, a full store, an error) falls back to
        `handle` per message, whose writes are idempotent."""
        if len(events) < 2 or (self.spill is not None and self.spill.count):
            for event in events:
                await self.handle(event)
            return
        enabled, opted_out = await self._burst_filters(events)
        kept = [e for e in events if await self._admitted(e, enabled, opted_out)]
        if not kept:
            return
        try:
            outcomes = await self.engine.ingest_many(kept, batch_size=len(kept))
        except Exception:  # the batch rolled back: one by one, through every fallback
            log.warning("a batch of %d messages failed; applying them one by one", len(kept))
            for event in kept:
                await self.handle(event)
            return
        for event, outcome in zip(kept, outcomes, strict=True):
            self._ingested(event, outcome)

    async def _burst_filters(
        self, events: Sequence[MessageEvent]
    ) -> tuple[dict[Scope, bool], dict[tuple[str, str, str], bool]]:
        """The channel switches and opt-outs a burst needs, read in one query each per
        workspace instead of one per channel and one per author."""
        enabled = await self.governance.channels_enabled([e.scope for e in events])
        opted_out = await self.governance.authors_opted_out(
            [(e.scope.platform, e.scope.workspace, e.speaker_id) for e in events]
        )
        return enabled, opted_out

    async def _admitted(
        self,
        event: MessageEvent,
        enabled: dict[Scope, bool],
        opted_out: dict[tuple[str, str, str], bool],
    ) -> bool:
        """Whether a new message is stored at all: not a bot's, memory on in its channel, its
        author not opted out. Counts what it turns away; `enabled` and `opted_out` remember
        the answers (across a burst)."""
        if event.speaker_is_bot:
            self.stats.ignored["bot_message"] += 1
            return False
        if event.scope not in enabled:
            enabled[event.scope] = await self.governance.channel_enabled(event.scope)
        if not enabled[event.scope]:
            self.stats.ignored["channel_off"] += 1
            return False
        who = (event.scope.platform, event.scope.workspace, event.speaker_id)
        if who not in opted_out:
            opted_out[who] = await self.governance.is_opted_out(*who)
        if opted_out[who]:
            self.stats.ignored["opted_out"] += 1
            return False
        return True

    def _ingested(self, event: MessageEvent, outcome: IngestOutcome) -> None:
        self.stats.handled[f"message_{outcome.status.value}"] += 1
        if outcome.status is IngestStatus.STORED:
            self._kick()
            self.maybe_notice(event.scope)

    # ---- the spill ----------------------------------------------------------------------

    async def _keep(self, event: StorableEvent, why: str) -> None:
        """Put an event the store could not take in the spill, or refuse it loudly."""
        assert self.spill is not None
        what = f"{type(event).__name__} {getattr(event, 'message_id', '')} in {event.scope}"
        try:
            await asyncio.to_thread(self.spill.append, event)
        except (SpillFull, OSError) as exc:
            self.stats.errors["spill_refused"] += 1
            log.error("NOT STORED, refused: %s (%s; %s)", what, why, exc)
            return
        self.stats.handled["spilled"] += 1
        log.warning(
            "kept %s in the spill %s (%d events, %d bytes): %s",
            what,
            self.spill.path,
            self.spill.count,
            self.spill.size_bytes,
            why,
        )

    async def replay_spill(self) -> int:
        """Apply the spill's events to the store, oldest first, and drop them from it; stops
        at the first that still finds the store full. Returns how many left the spill."""
        if self.spill is None or not self.spill.count:
            return 0
        async with self._spill_lock:
            self._last_replay = time.monotonic()
            total = 0
            full = False
            while self.spill.count and not full:
                done = 0
                for event in await asyncio.to_thread(self.spill.read):
                    if event is not None:
                        try:
                            await self._apply(event)
                        except StoreFull:
                            full = True
                            break
                        except Exception:
                            self.stats.errors[type(event).__name__] += 1
                            log.exception("failed to apply a spilled %s; skipped", event)
                    done += 1
                # Applied events leave the spill; a crash before this line replays them,
                # which the store's idempotent writes absorb.
                await asyncio.to_thread(self.spill.drop_first, done)
                total += done
                if not done:
                    break
            if total:
                self.stats.handled["spill_replayed"] += total
                log.info(
                    "replayed %d spilled event(s) into the store; %d left",
                    total,
                    self.spill.count,
                )
            return total

    async def replay_spill_every(self, interval_s: float) -> None:
        """Retry the spill periodically (a task the runtime starts and cancels)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.replay_spill()
            except Exception:
                log.exception("spill replay failed; it is retried in %.0f s", interval_s)

    async def _apply(self, event: Event) -> None:
        if isinstance(event, MessageEvent):
            if await self._admitted(event, {}, {}):
                self._ingested(event, await self.engine.ingest(event))
        elif isinstance(event, EditEvent):
            if (
                not await self.governance.channel_enabled(event.scope)
                and await self.engine.store.messages.get(event.scope, event.message_id) is None
            ):  # memory is off here: keep no text of a message it never stored
                self.stats.ignored["channel_off"] += 1
                return
            status, _receipt = await self.governance.apply_edit(event)
            self.stats.handled[f"edit_{status.value}"] += 1
        elif isinstance(event, DeleteEvent):
            status = await self.engine.delete(event)
            self.stats.handled[f"delete_{status.value}"] += 1
        elif isinstance(event, RosterEvent):
            await self.engine.roster(event)
            self.stats.handled[f"roster_{event.action.value}"] += 1
        elif isinstance(event, CommandInvocation):
            if event.command == "memory":
                await self.memory_command(event)
            else:
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
        if not await self.governance.channel_enabled(inv.scope):
            self.stats.handled["recall_refused"] += 1
            return RecallAnswer(
                text="Memory is off in this channel, so I have nothing to recall here.",
                refused=True,
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

    # ---- governance ---------------------------------------------------------------------

    def set_notifier(self, platform: str, notify: Notifier) -> None:
        """How to post the one-time notice on a platform (adapters register at start)."""
        self._notifiers[platform] = notify

    def maybe_notice(self, scope: Scope) -> None:
        """Post the memory notice the first time memory is on in a channel.

        Runs as its own task: posting goes out over the platform's API, and the event that
        triggered it must not wait for that (nor fail with it)."""
        notify = self._notifiers.get(scope.platform)
        if notify is None or scope.key() in self._noticed:
            return
        self._noticed.add(scope.key())
        task = asyncio.create_task(self._post_notice(scope, notify), name="speakermem-notice")
        self._notice_tasks.add(task)
        task.add_done_callback(self._notice_tasks.discard)

    async def drain_notices(self) -> None:
        """Wait for notices being posted (shutdown, tests)."""
        while self._notice_tasks:
            await asyncio.gather(*list(self._notice_tasks), return_exceptions=True)

    async def _post_notice(self, scope: Scope, notify: Notifier) -> None:
        try:
            if not await self.governance.claim_notice(scope):
                return
        except Exception:
            self._noticed.discard(scope.key())
            log.exception("could not record the notice for %s", scope)
            return
        try:
            await notify(scope, NOTICE_TEXT)
            self.stats.handled["notice"] += 1
        except Exception:
            self.stats.errors["notice"] += 1
            log.exception("posting the memory notice in %s failed; will retry later", scope)
            await self.governance.release_notice(scope)
            self._noticed.discard(scope.key())

    async def memory_command(self, inv: CommandInvocation) -> CommandReply:
        """Run `/memory <subcommand>` for the invoker; every failure is a reply, never raised."""
        try:
            return await run_memory_command(self, inv)
        except Exception:
            self.stats.errors["memory_command"] += 1
            log.exception("/memory failed in %s", inv.scope)
            return CommandReply(
                text="Sorry, something went wrong with that command. Nothing was changed "
                "unless a receipt says so; please try again.",
                refused=True,
            )

    async def confirm(
        self, token: str, *, user_id: str, is_admin: bool, accept: bool
    ) -> CommandReply:
        """Run (or cancel) a confirmed destructive action: single use, bound to its requester,
        expiring, and admin is checked again now (fail closed)."""
        try:
            return await run_confirmed(
                self, token, user_id=user_id, is_admin=is_admin, accept=accept
            )
        except Exception:
            self.stats.errors["memory_confirm"] += 1
            log.exception("/memory confirmation failed")
            return CommandReply(
                text="Sorry, that action failed; see `/memory audit` for what changed.",
                refused=True,
            )
