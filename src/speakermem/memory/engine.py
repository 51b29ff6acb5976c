"""MemoryEngine: the one door adapters, the CLI and the bot use into memory.

It owns the store and the embedder port and exposes ingestion through the admission gate
(messages, edits, deletes, roster changes), embedding, System 1 search, and the stored
messages reconciliation compares with the platform. Beside it: `engine.cursors`
(memory.cursors), the history cursors of catch-up, backfill and reconciliation;
`engine.segments` (memory.segment_queue), the Writer's queue; `engine.admin` (memory.admin),
operators' reads. The Writer, the /recall pipeline and governance build on it
(memory.writer, memory.query, memory.governance). Callers outside memory never reach the
store: the result types and errors they handle are named here (`__all__`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np

from speakermem.memory.admin import StoreAdmin
from speakermem.memory.background import Foreground
from speakermem.memory.background_embedding import BACKGROUND_EMBED_BATCH, BackgroundEmbedding
from speakermem.memory.config import MemoryConfig
from speakermem.memory.cursors import HistoryCursors
from speakermem.memory.embed_order import SORT_WINDOW, falling_behind, length_sorted_batches
from speakermem.memory.governance.policy import Refusal, admission
from speakermem.memory.interaction_graph import InteractionGraph
from speakermem.memory.models import (
    DeleteEvent,
    EditEvent,
    MessageEvent,
    RosterEvent,
    RosterMember,
    Scope,
    SearchHit,
    StoredMessage,
)
from speakermem.memory.ports import Embedder, QueryEmbedder
from speakermem.memory.search.fts_query import build_match
from speakermem.memory.search.fusion import rrf
from speakermem.memory.segment_queue import SegmentQueue
from speakermem.memory.store import (
    ChangeStatus,
    DriverUnavailable,
    IngestOutcome,
    IngestStatus,
    Store,
    StoreError,
    make_store,
)
from speakermem.memory.store.database import StoreFull
from speakermem.memory.store.diagnostics import location, schema_version
from speakermem.memory.store.errors import EmbedderMismatch
from speakermem.memory.store.reconcile import StoredRow
from speakermem.memory.store.schema import MigrationProgress

__all__ = [
    "ChangeStatus",
    "DriverUnavailable",
    "IngestOutcome",
    "IngestStatus",
    "MemoryEngine",
    "RankedLists",
    "SearchMode",
    "StoreError",
    "StoreFull",
    "StoredRow",
    "UnknownChannel",
]

log = logging.getLogger(__name__)

SearchMode = Literal["hybrid", "lexical", "dense"]
Progress = Callable[[int], None]


BULK_SETTLE_ROWS = 5_000
"""A write of at least this many rows in one call (an import, a backlog of vectors, a graph
catch-up) is followed by `Store.settle`: on a fresh database the planner would otherwise
meet the new rows without statistics until autovacuum comes. Live traffic writes far less
per call and never pays for the check."""


class UnknownChannel(LookupError):
    """A channel the store has never seen."""


@dataclass(frozen=True)
class RankedLists:
    """The two raw rankings behind a hybrid search, kept for --explain and evaluation."""

    lexical: list[tuple[int, float]]
    dense: list[tuple[int, float]]


def _model(embedder_name: str) -> str:
    """The model an embedder's name names: int8 quantisation of the same weights
    (`SPEAKERMEM_EMBED_QUANTIZE`) gives vectors close enough to mix with the float ones."""
    return embedder_name.removesuffix(":int8")


class MemoryEngine:
    def __init__(self, config: MemoryConfig, store: Store, embedder: Embedder | None) -> None:
        self.config = config
        self.store = store
        self.embedder = embedder
        self.foreground = Foreground()
        """/recall marks itself here; the background workers give way to it."""
        self.background_embedding = BackgroundEmbedding(self)
        """Vectors for new messages soon after they arrive (memory.background_embedding)."""
        self.graph = InteractionGraph(store, self.members, self.foreground, BULK_SETTLE_ROWS)
        """Who spoke to whom, kept current in the background (memory.interaction_graph)."""
        self.cursors = HistoryCursors(store)
        """Catch-up, backfill and reconciliation cursors (memory.cursors)."""
        self.segments = SegmentQueue(store)
        """The Writer's queue of closed segments (memory.segment_queue)."""
        self.admin = StoreAdmin(store)
        """Operators' reads: names, records, counts, usage, audit, store health (memory.admin)."""

    @classmethod
    async def open(
        cls,
        config: MemoryConfig,
        embedder: Embedder | None = None,
        *,
        progress: MigrationProgress | None = None,
        check_embedder: bool = True,
    ) -> MemoryEngine:
        """The engine over an open store; `progress` hears of migrations' re-indexing.
        With an embedder, a store whose vectors another model wrote is refused
        (`check_embedder`; off only for `reembed`)."""
        store = make_store(
            config.store,
            gap_seconds=config.ingest.session_gap_minutes * 60.0,
            window=config.ingest.segment_window,
            progress=progress,
        )
        await store.open()
        engine = cls(config, store, embedder)
        if embedder is not None and check_embedder:
            try:
                await engine.check_embedder()
            except BaseException:
                await store.close()
                raise
        return engine

    async def check_embedder(self) -> None:
        """Refuse to mix vectors of two models: the store records which embedder wrote its
        vectors, and a process embedding with another one stops here (its question vectors
        would be compared with the other model's). A store without vectors takes this one's
        name; one from before the record existed is taken to be this model's."""
        if self.embedder is None:
            return
        name = self.embedder.name
        written = await self.store.messages.vectors_written_by()
        if written is not None and _model(written) == _model(name):
            return
        if written is not None and await self.store.messages.has_vectors():
            raise EmbedderMismatch(
                f"this store's vectors were written by {written!r}, but SPEAKERMEM_EMBEDDER now "
                f"embeds with {name!r}. Set SPEAKERMEM_EMBEDDER back, or embed everything again "
                "with the new model: speakermem reembed"
            )
        await self.store.messages.set_vectors_written_by(name)

    async def reembed(self, *, on_progress: Progress | None = None, batch_size: int = 256) -> int:
        """Embed every message and record again with this engine's embedder and record it
        as the store's: the way from one embedding model to another. Returns the vectors
        written."""
        if self.embedder is None:
            raise ValueError("re-embedding needs an embedder (SPEAKERMEM_EMBEDDER is none)")
        await self.store.messages.drop_vectors()
        await self.store.messages.set_vectors_written_by(self.embedder.name)
        done = await self.embed_pending(batch_size=batch_size, on_progress=on_progress)
        after = 0
        while rows := await self.store.records.vector_texts(after, batch_size):
            vectors = await self.embedder.embed([text for _, _, text in rows])
            await self.store.records.replace_vectors(rows, vectors)
            after = rows[-1][0]
            done += len(rows)
            if on_progress:
                on_progress(len(rows))
        return done

    async def close(self) -> None:
        await self.stop_background_embedding()
        await self.stop_background_interactions()
        await self.store.close()

    def retryable(self, exc: BaseException) -> bool:
        """Whether the same write can succeed later (the store is full, locked, or lost its
        connection): the caller keeps the event for then. Anything else is a bad write."""
        return self.store.retryable(exc)

    def job_lock(self, name: str) -> AbstractAsyncContextManager[bool]:
        """The cluster-wide lock of a periodic job: yields True when this process runs this
        run of `name`, False when another process sharing the store is running it."""
        return self.store.locks.try_job(name)

    # ---- ingestion ----------------------------------------------------------------------

    @property
    def channel_default(self) -> bool:
        """Memory in a channel nobody switched on or off (the admission gate's default)."""
        return self.config.governance.channel_default_enabled

    async def ingest(self, event: MessageEvent) -> IngestOutcome:
        """Store one message through the admission gate (the store's ingest transaction):
        the outcome says whether it was stored, known already, or turned away and why."""
        (outcome,) = await self.store.messages.ingest([event], channel_default=self.channel_default)
        if outcome.status is IngestStatus.STORED:
            self.background_embedding.wake()
            self.graph.changed([event.scope])
        return outcome

    async def ingest_many(
        self,
        events: Iterable[MessageEvent],
        *,
        batch_size: int = 2_000,
        on_progress: Progress | None = None,
    ) -> list[IngestOutcome]:
        """Ingest in batches of one transaction each (imports, backfills), through the same
        admission gate as `ingest`."""
        outcomes: list[IngestOutcome] = []
        batch: list[MessageEvent] = []
        scopes: set[Scope] = set()
        for event in events:
            batch.append(event)
            scopes.add(event.scope)
            if len(batch) >= batch_size:
                outcomes.extend(
                    await self.store.messages.ingest(batch, channel_default=self.channel_default)
                )
                if on_progress:
                    on_progress(len(batch))
                batch = []
        if batch:
            outcomes.extend(
                await self.store.messages.ingest(batch, channel_default=self.channel_default)
            )
            if on_progress:
                on_progress(len(batch))
        if len(outcomes) >= BULK_SETTLE_ROWS:
            await self.store.settle()
        self.background_embedding.wake()
        self.graph.changed(scopes)
        return outcomes

    async def edit(self, event: EditEvent) -> ChangeStatus:
        """Apply an edit through the admission gate (no text of opted-out or forgotten
        authors, nor of unknown messages in a channel whose memory is off)."""
        status = await self.store.messages.edit(event, channel_default=self.channel_default)
        if status is ChangeStatus.APPLIED:
            self.background_embedding.wake()
        return status

    async def refusal(self, event: MessageEvent | EditEvent) -> str | None:
        """Why a copy of this event (the bot's spill, while the store cannot take it) must
        not be kept, as the admission gate would decide now, read outside a write; None: it
        may wait. A message the store already holds (live, or a forgotten one's tombstone)
        is "duplicate": its words need no copy. An edit of a forgotten or deleted message is
        "deleted"; one by (or of a message by) an opted-out or forgotten author is refused."""
        scope = event.scope
        policy = self.store.channels.policy
        stored = await self.store.messages.get(scope, event.message_id)
        people = await policy.exclusions(scope.platform, scope.workspace)
        if isinstance(event, MessageEvent):
            if stored is not None:
                return IngestStatus.DUPLICATE.value
            if await policy.deleted_early(scope, event.message_id):
                return "deleted"  # its delete came first: it is stored forgotten, never read
            on = (await policy.channels_on([scope], self.channel_default))[scope]
            why = admission(
                is_bot=event.speaker_is_bot, channel_on=on, author=people.reason(event.speaker_id)
            )
            return None if why is None else why.value
        if stored is not None and stored.deleted:
            return "deleted"
        author = stored.speaker_id if stored is not None else event.author_id
        if author and (why := people.reason(author)) is not None:
            return why.value
        if stored is None and not (await policy.channels_on([scope], self.channel_default))[scope]:
            return Refusal.CHANNEL_OFF.value
        return None

    async def delete(self, event: DeleteEvent) -> ChangeStatus:
        return await self.store.messages.delete(event)

    async def roster(self, event: RosterEvent) -> None:
        await self.store.channels.apply(event)

    async def members(self, scope: Scope, *, include_left: bool = False) -> list[RosterMember]:
        return await self.store.channels.members(scope, include_left=include_left)

    async def set_channel_meta(
        self, scope: Scope, *, name: str | None, is_private: bool | None
    ) -> None:
        """A channel's name and privacy as the platform (or an export) reports them; None
        leaves that one as it is. A channel nobody described stays private (fail closed)."""
        await self.store.channels.set_meta(scope, name=name, is_private=is_private)

    async def readable_channels(self, platform: str, workspace: str, user_id: str) -> list[Scope]:
        """The channels whose current roster holds the user (the default read permission)."""
        return await self.store.channels.readable_channels(platform, workspace, user_id)

    async def messages_by_id(
        self, scope: Scope, message_ids: Sequence[str]
    ) -> dict[str, StoredMessage]:
        """The channel's stored messages with these platform ids, by id."""
        return await self.store.messages.by_ids(scope, message_ids)

    async def thread_messages(self, scope: Scope, thread_id: str) -> list[StoredMessage]:
        """A thread's stored messages: the one that started it (its id is the thread's) and
        its replies; deleted ones included (callers decide)."""
        replies = await self.store.reconcile.thread_messages(scope, thread_id)
        found = await self.store.messages.get_many([pk for pk, _ in replies])
        parent = await self.store.messages.by_ids(scope, [thread_id])
        return list({m.pk: m for m in (*parent.values(), *found.values())}.values())

    # ---- reconciliation after downtime ----------------------------------------------------

    async def stored_window(self, scope: Scope, low: float, high: float) -> list[StoredRow]:
        """The channel's live messages (its threads' too) with `low <= ts <= high`, newest
        first: what reconciliation compares with the platform."""
        return await self.store.reconcile.window(scope, low, high)

    async def count_stored(self, scope: Scope, low: float, high: float) -> int:
        """How many live messages the channel holds with `low <= ts <= high`."""
        return await self.store.reconcile.count(scope, low, high)

    # ---- embeddings ---------------------------------------------------------------------

    async def embed_pending(
        self,
        *,
        batch_size: int = 256,
        on_progress: Progress | None = None,
        before_batch: Callable[[], Awaitable[None]] | None = None,
        embed: Callable[[list[str]], Awaitable[np.ndarray]] | None = None,
        draft: Callable[[list[str]], Awaitable[np.ndarray]] | None = None,
    ) -> int:
        """Embed every message that has no vector yet; returns how many were stored.
        `before_batch` runs before each batch (the background worker gives way to /recall);
        `embed` replaces the embedder's `embed` (the worker's choice of priority); `draft`
        embeds quicker vectors, used while more than one batch waits (`falling_behind`) and
        written again later by `replace_drafts`."""
        if self.embedder is None:
            return 0
        embed = embed or self.embedder.embed
        done = 0
        window = max(batch_size, SORT_WINDOW)
        while True:
            items = await self.store.messages.pending_embeddings(window)
            if not items:
                break
            run = embed
            if draft is not None and falling_behind(len(items), batch_size):
                run = draft
            stored = 0
            for batch in length_sorted_batches(items, batch_size):
                if before_batch is not None:
                    await before_batch()
                vectors = await run([text for _, _, text in batch])
                stored += await self.store.messages.store_vectors(
                    batch, vectors, draft=run is draft
                )
                if on_progress:
                    on_progress(len(batch))
            done += stored
            if stored == 0 and len(items) < window:
                break
        if done >= BULK_SETTLE_ROWS:
            await self.store.settle()
        return done

    async def replace_drafts(
        self, *, batch_size: int, embed: Callable[[list[str]], Awaitable[np.ndarray]]
    ) -> int:
        """One batch of draft vectors written again by `embed` (full precision); returns
        how many were replaced (0: no draft left, or none unchanged since it was read)."""
        items = await self.store.messages.draft_vectors(batch_size)
        if not items:
            return 0
        vectors = await embed([text for _, _, text in items])
        return await self.store.messages.replace_drafts(items, vectors)

    async def count_draft_vectors(self) -> int:
        """Live messages whose vector is still a draft (`embed_pending`'s `draft`)."""
        return await self.store.messages.count_draft_vectors()

    async def embed_backlog(self) -> None:
        """The periodic safety net (`BackgroundEmbedding.backlog`)."""
        await self.background_embedding.backlog()

    def start_background_embedding(self, *, batch_size: int = BACKGROUND_EMBED_BATCH) -> None:
        """Embed new messages shortly after they arrive, without blocking ingestion."""
        self.background_embedding.start(batch_size=batch_size)

    async def stop_background_embedding(self) -> None:
        await self.background_embedding.stop()

    async def count_unembedded(self) -> int:
        """Live messages still without a vector (the embedding backlog)."""
        return await self.store.messages.count_pending_embeddings()

    # ---- interaction graph (memory.interaction_graph) ---------------------------------

    async def infer_interactions(
        self, scopes: Iterable[Scope] | None = None, *, batch: int = 500
    ) -> int:
        """Infer who spoke to whom and reply links for the new messages of `scopes` (all
        known channels if None); returns how many messages were read."""
        return await self.graph.infer(scopes, batch=batch)

    def start_background_interactions(self) -> None:
        self.graph.start()

    @property
    def graph_in_background(self) -> bool:
        return self.graph.running

    async def stop_background_interactions(self) -> None:
        await self.graph.stop()

    # ---- search -------------------------------------------------------------------------

    async def known_channels(self, scopes: Sequence[Scope]) -> list[tuple[Scope, int]]:
        """(scope, channel pk) of the scopes the store knows, in order."""
        known = []
        for scope in scopes:
            pk = await self.store.channels.lookup(scope)
            if pk is not None:
                known.append((scope, pk))
        return known

    async def channel_pks(self, scopes: Sequence[Scope]) -> list[int]:
        return [pk for _, pk in await self.known_channels(scopes)]

    async def embed_query(self, text: str) -> np.ndarray | None:
        if self.embedder is None:
            return None
        if isinstance(self.embedder, QueryEmbedder):
            return await self.embedder.embed_query(text)
        return (await self.embedder.embed([text]))[0]

    async def ranked(
        self,
        query: str,
        channel_pks: Sequence[int],
        *,
        pool: int,
        mode: SearchMode = "hybrid",
        query_vector: np.ndarray | None = None,
        extra_terms: list[str] | None = None,
    ) -> RankedLists:
        async def lexical() -> list[tuple[int, float]]:
            if mode not in ("hybrid", "lexical"):
                return []
            match = build_match(query, extra=extra_terms)
            return await self.store.messages.lexical(match, channel_pks, pool)

        async def dense() -> list[tuple[int, float]]:
            if mode not in ("hybrid", "dense"):
                return []
            vec = query_vector if query_vector is not None else await self.embed_query(query)
            if vec is None:
                return []
            return await self.store.messages.dense(
                vec,
                channel_pks,
                pool,
                self.config.store.dense_oversample,
                self.config.search.hybrid_oversample_fraction,
            )

        # the two passes run at once on two reader connections (each in its own SQLite
        # thread or PostgreSQL backend), so hybrid costs about the slower one, not the sum
        lex, den = await asyncio.gather(lexical(), dense())
        return RankedLists(lex, den)

    async def session_starts(self, scope: Scope, session_ids: Sequence[int]) -> dict[int, float]:
        """When each of the channel's sessions began (its first message's unix time)."""
        return await self.store.messages.session_started(scope, session_ids)

    async def search(
        self,
        query: str,
        scopes: Sequence[Scope],
        *,
        limit: int = 10,
        mode: SearchMode = "hybrid",
    ) -> list[SearchHit]:
        """Hybrid System 1 search restricted to `scopes` (the channels the asker may read)."""
        pks = await self.channel_pks(scopes)
        if not pks:
            return []
        cfg = self.config.search
        lists = await self.ranked(query, pks, pool=max(cfg.pool, limit), mode=mode)
        lex_ids = [pk for pk, _ in lists.lexical]
        dense_ids = [pk for pk, _ in lists.dense]
        fused = rrf(
            [lex_ids, dense_ids],
            k0=cfg.hybrid_rrf_k0,
            weights=[cfg.lexical_weight, cfg.dense_weight],
        )[:limit]
        messages = await self.store.messages.get_many([pk for pk, _ in fused])
        lex_rank = {pk: i + 1 for i, pk in enumerate(lex_ids)}
        dense_rank = {pk: i + 1 for i, pk in enumerate(dense_ids)}
        return [
            SearchHit(
                message=messages[pk],
                score=score,
                lexical_rank=lex_rank.get(pk),
                dense_rank=dense_rank.get(pk),
            )
            for pk, score in fused
            if pk in messages
        ]

    # ---- introspection ------------------------------------------------------------------

    async def stats(self) -> dict[str, object]:
        started = time.perf_counter()
        out: dict[str, object] = {
            "db_path": location(self.store),
            "driver": self.store.driver_name,
            "schema_version": await schema_version(self.store),
            "embedder": getattr(self.embedder, "name", None),
        }
        out.update(await self.store.messages.counts())
        out.update(await self.store.records.counts())
        out.update(await self.store.segments.counts())
        out["channels"] = len(await self.store.channels.all())
        out["writer"] = await self.store.records.writer_stats()
        out["db_bytes"] = await self.store.db_size_bytes()
        out["stats_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return out

    # ---- for the platform adapters ------------------------------------------------------
    # What integrations/{discord,slack,shell} need beyond ingestion and search: thin doors
    # onto the store, so an adapter never reaches `engine.store`. Catch-up and reconciliation
    # cursors are `engine.cursors`; a channel's metadata and stored messages by id are the
    # methods above (`set_channel_meta`, `messages_by_id`); a manual flush is
    # `engine.segments.close_channel`.

    async def channel_is_private(self, scope: Scope) -> bool:
        """Whether `scope` is private; a channel never recorded counts as private (fail
        closed)."""
        return await self.store.channels.is_private(scope)

    async def sync_members(
        self,
        scope: Scope,
        listed: list[tuple[str, str | None, bool]],
        at: datetime | None = None,
    ) -> tuple[int, int]:
        """Make `scope`'s roster exactly `listed` (user id, display name or None, is_bot) in
        one transaction, new members joined and absent ones left `at` (default now; an
        export's snapshot gives its own date). Returns (joined or renamed, left)."""
        when = None if at is None else at.timestamp()
        return await self.store.channels.sync_members(scope, listed, when)

    async def find_user(self, platform: str, workspace: str, name_or_id: str) -> list[str]:
        """User ids whose id, display name or alias equals `name_or_id` (case-insensitive)."""
        return await self.store.channels.find_user(platform, workspace, name_or_id)

    async def workspace_channels(self, platform: str, workspace: str) -> list[Scope]:
        """Every channel the store knows in one workspace."""
        return [
            scope
            for row in await self.store.channels.all()
            if (scope := row["scope"]).platform == platform and scope.workspace == workspace
        ]
