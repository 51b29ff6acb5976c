"""Route platform-neutral events to the memory engine; one error funnel for all of them.

Adapters ack first, then hand events here. A bad event is logged and skipped; it never
takes the bot down and never leaves a partial row (each store write is one transaction).

Policy (bots, the channel switch, opt-outs, tombstones) is not applied here: the memory
engine's admission gate decides for every entry path, and this module only counts what it
reports.

When the store cannot take a write (its disk is full, it stays locked, the connection is
lost: any `StoreError`, or an OS error), an event already acked upstream is kept in the
spill (`bot.spill`) and replayed, in order, once the store takes writes again: on start,
every `spill_retry_s` and on the next event. While the spill holds events, new ones queue
behind them. A full spill refuses the event with an error in the log and the
`spill_refused` error count; nothing is dropped silently. `handle` says whether an event
was accounted for (applied, turned away by the gate, or kept), so catch-up never moves its
cursor past one that was not. A forget removes the forgotten events from the spill.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from speakermem.bot.asks import ASKS_PER_MINUTE, EMPTY_QUESTION, NOTHING_READABLE, RATE_LIMITED
from speakermem.bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    Event,
    MessageEvent,
    RosterEvent,
)
from speakermem.bot.governance import CommandReply, PendingActions
from speakermem.bot.governance_commands import run_confirmed, run_memory_command
from speakermem.bot.rate_limit import PerMinuteLimiter
from speakermem.bot.spill import RETRY_S, Spill, SpillFull, StorableEvent
from speakermem.memory.engine import IngestOutcome, IngestStatus, MemoryEngine, StoreFull
from speakermem.memory.governance.policy import Forgotten
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope
from speakermem.memory.query.answer import RecallAnswer
from speakermem.memory.query.pipeline import AccessDenied, Recaller, RecallRequest

log = logging.getLogger(__name__)

_STORABLE = (MessageEvent, EditEvent, DeleteEvent, RosterEvent)
GROUP_MAX = 200
"""Most new messages written in one group-commit transaction (`Dispatcher.handle_grouped`)."""
REFUSED_AS = {"bot": "bot_message"}
"""Counter names of the gate's refusals where they differ from the reason."""

Notifier = Callable[[Scope, str], Awaitable[None]]
"""Posts a plain message in a channel (the one-time memory notice)."""

NOTICE_TEXT = (
    "Heads-up: I remember this channel's conversation so `/recall` can answer questions "
    "about it with cited messages. `/memory opt-out` stops storing your messages "
    "(`/memory opt-out forget` also removes what I have); `/memory mine` shows what I hold "
    "about you."
)


def _deleted(event: DeleteEvent) -> Forgotten:
    """What a platform delete forgets: that message."""
    scope = event.scope
    return Forgotten(
        scope.platform, scope.workspace, channel=scope.channel, message_ids=(event.message_id,)
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
        spill_retry_s: float = RETRY_S,
        ask_per_minute: int = ASKS_PER_MINUTE,
    ) -> None:
        """`on_recall(seconds, outcome)` observes each /recall (metrics); outcome is
        answered, refused or failed. `spill` keeps events the full store refused.
        `ask_per_minute`: questions per member by mention, reply, direct message or
        context menu in any 60 s (`bot.asks`)."""
        self.engine = engine
        self.pipeline = pipeline
        self.on_message_stored = on_message_stored
        self.kick_interval_s = kick_interval_s
        self.on_recall = on_recall
        self.governance = governance or Governance(engine)
        self.pending = PendingActions()
        self.asks = PerMinuteLimiter(ask_per_minute)
        """Questions per member by the ways in other than the slash command."""
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
        if spill is not None:
            self.governance.forget_hooks.append(self._forget_in_spill)

    def _transient(self, exc: BaseException) -> bool:
        """A store failure the same write survives later (full, locked, connection lost):
        the event is kept for then. Anything else is a bad event or a bug."""
        return self.engine.retryable(exc)

    async def handle(self, event: Event) -> bool:
        """Apply one event; errors are logged and counted, never raised (the funnel).

        Returns whether the event is accounted for: applied (stored, or turned away by the
        admission gate) or kept in the spill. False: it could be neither (logged as an
        error); a caller that tracks a position (catch-up) must not move past it."""
        kind = type(event).__name__
        try:
            if self.spill is not None and isinstance(event, _STORABLE) and self.spill.count:
                if time.monotonic() - self._last_replay >= self.spill_retry_s:
                    await self.replay_spill()
                if isinstance(event, DeleteEvent):
                    # a delete does not wait: it converges with its create in any order
                    # (an early tombstone), and its words leave the spill now
                    await self._forget_in_spill(_deleted(event))
                elif self.spill.count:  # earlier events still wait: this one goes behind
                    return await self._keep(event, "earlier events wait in the spill")
            await self._apply(event)
            return True
        except Exception as exc:
            if not self._transient(exc):
                self.stats.errors[kind] += 1
                log.exception(
                    "failed to apply %s in %s; skipped", kind, getattr(event, "scope", "?")
                )
                return False
            if self.spill is None or not isinstance(event, _STORABLE):
                self.stats.errors[kind] += 1
                log.error("failed to apply %s: %s", kind, exc)
                return False
            self.stats.errors["store_full" if isinstance(exc, StoreFull) else "store_error"] += 1
            self._last_replay = time.monotonic()  # a write just failed: retry after a pause
            return await self._keep(event, str(exc))

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
        transaction instead of one each: the same gate, outcomes and spill as `handle`
        one by one. Anything unusual (a spill waiting, a full store, an error) falls back to
        `handle` per message, whose writes are idempotent."""
        if len(events) < 2 or (self.spill is not None and self.spill.count):
            for event in events:
                await self.handle(event)
            return
        try:
            outcomes = await self.engine.ingest_many(events, batch_size=len(events))
        except Exception:  # the batch rolled back: one by one, through every fallback
            log.warning("a batch of %d messages failed; applying them one by one", len(events))
            for event in events:
                await self.handle(event)
            return
        for event, outcome in zip(events, outcomes, strict=True):
            self._ingested(event, outcome)

    def _ingested(self, event: MessageEvent, outcome: IngestOutcome) -> None:
        """Count what the engine's admission gate and the store reported."""
        if outcome.status.refused:
            self.stats.ignored[REFUSED_AS.get(outcome.status.value, outcome.status.value)] += 1
            return
        self.stats.handled[f"message_{outcome.status.value}"] += 1
        if outcome.status is IngestStatus.STORED:
            self._kick()
            self.maybe_notice(event.scope)

    # ---- the spill ----------------------------------------------------------------------

    async def _keep(self, event: StorableEvent, why: str) -> bool:
        """Put an event the store could not take in the spill, or refuse it loudly. A
        delete first removes the words of its message waiting there (a forget)."""
        assert self.spill is not None
        what = f"{type(event).__name__} {getattr(event, 'message_id', '')} in {event.scope}"
        if isinstance(event, MessageEvent | EditEvent):
            # a redelivered forgotten message, or a forgotten author's words, gets no copy
            # here either (the gate would refuse it at replay, but the spill is kept text)
            try:
                refused = await self.engine.refusal(event)
            except Exception:  # the store cannot even be read: keep it (forgets filter it)
                refused = None
            if refused is not None:
                self.stats.ignored[refused] += 1
                return True
        try:
            if isinstance(event, DeleteEvent):
                await self._forget_in_spill(_deleted(event))
            await asyncio.to_thread(self.spill.append, event)
        except (SpillFull, OSError) as exc:
            self.stats.errors["spill_refused"] += 1
            log.error("NOT STORED, refused: %s (%s; %s)", what, why, exc)
            return False
        self.stats.handled["spilled"] += 1
        log.warning(
            "kept %s in the spill %s (%d events, %d bytes): %s",
            what,
            self.spill.path,
            self.spill.count,
            self.spill.size_bytes,
            why,
        )
        return True

    async def _forget_in_spill(self, forgotten: Forgotten) -> int:
        """Remove a forget's events from the spill (a governance forget hook)."""
        if self.spill is None:
            return 0
        async with self._spill_lock:
            removed = await asyncio.to_thread(self.spill.forget, forgotten)
        if removed:
            self.stats.handled["spill_forgotten"] += removed
            log.info("removed %d forgotten event(s) from the spill", removed)
        return removed

    async def replay_spill(self) -> int:
        """Apply the spill's events to the store (through the same admission gate), oldest
        first, and drop them from it; stops at the first that the store still cannot take.
        Returns how many left the spill."""
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
                        except Exception as exc:
                            if self._transient(exc):  # kept: retried at the next replay
                                full = True
                                break
                            self.stats.errors[type(event).__name__] += 1
                            log.exception(
                                "failed to apply a spilled %s %s in %s; skipped",
                                type(event).__name__,
                                getattr(event, "message_id", ""),
                                event.scope,
                            )
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
            self._ingested(event, await self.engine.ingest(event))
        elif isinstance(event, EditEvent):
            status, _receipt = await self.governance.apply_edit(event)
            if status.refused:  # the gate kept no text of it
                self.stats.ignored[status.value] += 1
            else:
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

    @staticmethod
    def ask_key(inv: CommandInvocation) -> str:
        """Whose budget of questions an invocation draws on (`ask_per_minute`)."""
        return f"{inv.scope.platform}:{inv.user_id}"

    def ask_refusal(self, inv: CommandInvocation) -> RecallAnswer | None:
        """The rate limit's refusal, checked without counting: adapters ask before costly
        lookups (a direct message re-lists private rosters); `recall` counts."""
        if inv.via == "command" or self.asks.would_allow(self.ask_key(inv)):
            return None
        self.stats.handled["ask_rate_limited"] += 1
        return RecallAnswer(text=RATE_LIMITED, refused=True)

    async def _recall(self, inv: CommandInvocation) -> RecallAnswer:
        limit = self.engine.config.recall.max_question_chars
        question = (inv.options.get("question") or inv.text or "").strip()[:limit]
        if not question:
            text = (
                "Ask me something, e.g. `/recall what did we decide?`"
                if inv.via == "command"
                else EMPTY_QUESTION
            )
            return RecallAnswer(text=text, refused=True)
        if inv.via != "command" and not self.asks.allow(self.ask_key(inv)):
            self.stats.handled["ask_rate_limited"] += 1
            return RecallAnswer(text=RATE_LIMITED, refused=True)
        readable: list[Scope] | None = None
        if inv.readable_scopes is not None:
            readable = list(inv.readable_scopes)
        elif inv.readable_channels is not None:
            readable = [
                Scope(platform=inv.scope.platform, workspace=inv.scope.workspace, channel=c)
                for c in inv.readable_channels
            ]
        direct = inv.via == "dm"
        if direct and readable is not None and not readable:
            self.stats.handled["recall_refused"] += 1
            return RecallAnswer(text=NOTHING_READABLE, refused=True)
        if not direct and not await self.governance.channel_enabled(inv.scope):
            self.stats.handled["recall_refused"] += 1
            return RecallAnswer(
                text="Memory is off in this channel, so I have nothing to recall here.",
                refused=True,
            )
        request = RecallRequest(
            question,
            inv.scope,
            asker=inv.user_id,
            readable=readable,
            thread=inv.options.get("thread_id") or None,
            asked_in=inv.options.get("message_id") or None,
            direct=direct,
            locale=inv.locale,
        )
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
