"""The web console's read model: what its pages show, composed from the store's reads.

Access is decided by the caller (`integrations.web.access`): every method here takes the
channels the viewer may see, or a single channel the caller already allowed, and returns
nothing from outside them. Actions (forgetting, opt-out, channel switches) are not here:
they go through `memory.governance.service.Governance`, with its cascade, audit and receipts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from speakermem.memory.engine import MemoryEngine, SearchMode
from speakermem.memory.governance.policy import channel_enabled, effective_retention
from speakermem.memory.identity import identities
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import GROUP, DerivedRecord, Scope, SearchHit, StoredMessage
from speakermem.memory.query.links import LinkResolver, default_link
from speakermem.memory.store import Store
from speakermem.memory.store.console import PersonCounts, PersonRow
from speakermem.memory.store.diagnostics import last_writer_run, status_counts
from speakermem.memory.store.usage import writer_status

log = logging.getLogger(__name__)

COUNTS_TTL_S = 30.0
"""How old the channels' message, record and member counts may get before a recount."""
LLM_PROBE_TTL_S = 30.0
"""How long an LLM reachability answer is reused (the overview must not wait on the LLM)."""
LLM_PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ChannelSummary:
    scope: Scope
    name: str | None
    is_private: bool
    on: bool
    messages: int
    records: int
    members: int

    @property
    def label(self) -> str:
        return self.name or self.scope.channel


@dataclass(frozen=True)
class CatchupState:
    kind: str
    cursor_ts: float | None
    fetched: int
    finished: bool
    updated_at: float


@dataclass(frozen=True)
class ChannelDetail:
    summary: ChannelSummary
    explicit: bool
    """Whether an admin set memory on/off here (else the default for new channels applies)."""
    retention_days: int | None
    retention_from: Literal["channel", "workspace"] | None
    last_message_at: float | None
    catchup: list[CatchupState]


@dataclass(frozen=True)
class SourceMessage:
    """A message a record cites, as the console shows it (`present` False: gone)."""

    message_id: str
    present: bool
    speaker_id: str = ""
    speaker_name: str = ""
    text: str = ""
    ts: float | None = None
    link: str | None = None
    deleted: bool = False


@dataclass(frozen=True)
class RecordView:
    record: DerivedRecord
    sources: list[SourceMessage]
    chain: list[DerivedRecord]
    names: dict[str, str]
    """User id -> display name, for the owner and source of the record and its chain."""


@dataclass(frozen=True)
class PersonView:
    platform: str
    workspace: str
    user_id: str
    display_name: str | None
    aliases: list[str]
    opted_out: bool


@dataclass(frozen=True)
class Edge:
    speaker: str
    addressee: str
    messages: int


@dataclass(frozen=True)
class Graph:
    edges: list[Edge]
    names: dict[str, str]
    window: int
    """How many of the channel's latest messages the edges count."""


@dataclass(frozen=True)
class Health:
    writer_pending: int
    writer_deferred: int
    writer_oldest_age_s: float | None
    rederive: int
    embed_pending: int
    db_bytes: int | None
    """None for a workspace admin: the file holds every workspace's data."""
    driver: str
    llm_configured: bool
    llm_reachable: bool | None
    writer_last_run: float | None
    writer_last_outcome: str | None


@dataclass
class _ProbeCache:
    at: float = float("-inf")
    value: bool | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _CountSnapshot:
    """The channels' counts, recounted in the background once older than `COUNTS_TTL_S`: a
    page waits for a count only when there is none yet (or a channel is new to it)."""

    def __init__(self, count: Callable[[], Awaitable[dict[Scope, ChannelSummary]]]) -> None:
        self._count = count
        self._value: dict[Scope, ChannelSummary] | None = None
        self._at = float("-inf")
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None

    def drop(self) -> None:
        self._value = None

    async def get(self, wanted: set[Scope]) -> dict[Scope, ChannelSummary]:
        value = self._value
        if value is None or not wanted <= value.keys():
            return await self._recount(value)
        if time.monotonic() - self._at > COUNTS_TTL_S and (
            self._refresh is None or self._refresh.done()
        ):
            self._refresh = asyncio.create_task(self._background(), name="console-counts")
        return value

    async def _recount(
        self, seen: dict[Scope, ChannelSummary] | None
    ) -> dict[Scope, ChannelSummary]:
        async with self._lock:
            if self._value is not None and self._value is not seen:
                return self._value  # another request recounted meanwhile
            self._value = await self._count()
            self._at = time.monotonic()
            return self._value

    async def _background(self) -> None:
        try:
            await self._recount(self._value)
        except Exception:  # the old counts stay; the next page tries again
            log.warning("console: recounting the channels failed", exc_info=True)


class ConsoleReads:
    """Read-only views over the engine's store for the console's pages."""

    def __init__(
        self,
        engine: MemoryEngine,
        *,
        link: LinkResolver = default_link,
        llm_probe: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.engine = engine
        self.link = link
        self.llm_probe = llm_probe
        self._probe = _ProbeCache()
        self._counts = _CountSnapshot(self._count_channels)

    @property
    def _store(self) -> Store:
        return self.engine.store

    # ---- who may read what ---------------------------------------------------------------

    async def workspaces(self) -> list[tuple[str, str]]:
        """Every (platform, workspace) the store knows."""
        return list(await self._store.channels.workspaces())

    async def roster_channels(self, platform: str, workspace: str, user_id: str) -> list[Scope]:
        """Channels whose current roster holds the user: `/recall`'s read permission when the
        platform does not say otherwise (memory.query.pipeline)."""
        return list(await self._store.channels.readable_channels(platform, workspace, user_id))

    async def all_channels(self) -> list[Scope]:
        """Every channel the store knows (no counting: cheap on every request)."""
        return [scope for _, scope in await self._store.governance.channels_with_pk()]

    async def _count_channels(self) -> dict[Scope, ChannelSummary]:
        """Each channel with its message, record and member counts (a few hundred ms on a
        channel of a million messages: what `_CountSnapshot` keeps off the page's path)."""
        records = await self._store.console.active_records_per_channel()
        return {
            c["scope"]: ChannelSummary(
                scope=c["scope"],
                name=c["name"],
                is_private=bool(c["is_private"]),
                on=True,
                messages=int(c["messages"]),
                records=records.get(int(c["pk"]), 0),
                members=int(c["members"]),
            )
            for c in await self._store.channels.all()
        }

    # ---- channels -----------------------------------------------------------------------

    async def channels(self, scopes: Iterable[Scope]) -> list[ChannelSummary]:
        """Summaries of the given channels the store knows, by workspace then name. The
        counts are the latest snapshot (at most `COUNTS_TTL_S` old); memory on/off is now."""
        wanted = set(scopes)
        if not wanted:
            return []
        snapshot = await self._counts.get(wanted)
        rows = [row for scope, row in snapshot.items() if scope in wanted]
        default_on = self.engine.config.governance.channel_default_enabled
        switches: dict[Scope, bool | None] = {}
        by_workspace: dict[tuple[str, str], list[Scope]] = {}
        for row in rows:
            by_workspace.setdefault((row.scope.platform, row.scope.workspace), []).append(row.scope)
        for (platform, workspace), group in by_workspace.items():
            found = await self._store.governance.channel_switches(
                platform, workspace, [s.channel for s in group]
            )
            switches.update({s: found.get(s.channel) for s in group})
        out = [
            replace(row, on=channel_enabled(switches.get(row.scope), default_on)) for row in rows
        ]
        out.sort(key=lambda c: (c.scope.platform, c.scope.workspace, c.label.lower()))
        return out

    def counts_changed(self) -> None:
        """Forget the count snapshot (after a forget or purge: the next page recounts)."""
        self._counts.drop()

    async def warm(self) -> None:
        """Take the first count snapshot (the console does this as it starts)."""
        await self._counts.get(set())

    async def channel(self, scope: Scope) -> ChannelDetail | None:
        """One channel's state: memory on/off, retention, last message, catch-up cursors."""
        summaries = await self.channels([scope])
        if not summaries:
            return None
        store = self._store
        policy = await store.governance.channel_policy(scope)
        workspace_days = (await store.governance.workspace_retention()).get(
            (scope.platform, scope.workspace)
        )
        days = effective_retention(policy.retention_days, workspace_days)
        source: Literal["channel", "workspace"] | None = None
        if policy.retention_days is not None:
            source = "channel"
        elif workspace_days is not None:
            source = "workspace"
        pks = await self.engine.channel_pks([scope])
        catchup = []
        for kind in ("catchup", "backfill"):
            for cur in await store.catchup.cursors(scope.platform, kind):
                if cur.scope == scope:
                    catchup.append(
                        CatchupState(
                            kind=kind,
                            cursor_ts=cur.cursor_ts,
                            fetched=cur.fetched,
                            finished=cur.finished,
                            updated_at=cur.updated_at,
                        )
                    )
        return ChannelDetail(
            summary=summaries[0],
            explicit=policy.enabled is not None,
            retention_days=days,
            retention_from=source,
            last_message_at=await store.messages.latest_ts(pks),
            catchup=catchup,
        )

    async def search(
        self, scope: Scope, query: str, *, limit: int = 20, mode: SearchMode = "hybrid"
    ) -> list[SearchHit]:
        """The channel's messages ranked for `query` (the CLI's `search`)."""
        if not query.strip():
            return []
        return await self.engine.search(query, [scope], limit=limit, mode=mode)

    # ---- records ------------------------------------------------------------------------

    async def record_people(self, scope: Scope) -> tuple[list[PersonCounts], dict[str, str]]:
        """Who the channel's active records are about or from, with display names."""
        pks = await self.engine.channel_pks([scope])
        if not pks:
            return [], {}
        counts = await self._store.console.record_people(pks[0])
        return counts, await self.names(scope)

    async def person_records(
        self, scopes: Sequence[Scope], person: str, *, limit: int = 50, offset: int = 0
    ) -> tuple[list[DerivedRecord], int]:
        """A page of the active records about or from `person` in these channels."""
        pks = await self.engine.channel_pks(scopes)
        return await self._store.console.person_records(pks, person, limit=limit, offset=offset)

    async def record(self, record_id: int) -> RecordView | None:
        """A record with its cited messages (and their permalinks) and its update chain."""
        rec = (await self._store.records.get_many([record_id])).get(record_id)
        if rec is None:
            return None
        store = self._store
        cited = await store.messages.by_ids(rec.scope, rec.from_ids)
        current = await self.names(rec.scope)
        who = identities(current, ((m.speaker_id, m.speaker_name) for m in cited.values()))
        sources = []
        for mid in rec.from_ids:
            m = cited.get(mid)
            if m is None:
                sources.append(SourceMessage(message_id=mid, present=False))
                continue
            sources.append(
                SourceMessage(
                    message_id=mid,
                    present=True,
                    speaker_id=m.speaker_id,
                    speaker_name=who.author(m.speaker_id, m.speaker_name),
                    text=m.text,
                    ts=m.ts.timestamp(),
                    link=self.link(rec.scope, mid, m.thread_id),
                    deleted=m.deleted,
                )
            )
        chain = await store.records.chain(record_id)
        names = {uid: who.person(uid) for uid in current}
        return RecordView(record=rec, sources=sources, chain=chain, names=names)

    async def names(self, scope: Scope) -> dict[str, str]:
        """User id -> display name of everyone on the channel's roster, past members too."""
        names = {GROUP: "the group"}
        for m in await self.engine.members(scope, include_left=True):
            names[m.user_id] = m.display_name
        return names

    # ---- the addressee graph ------------------------------------------------------------

    async def graph(self, scope: Scope, *, last_messages: int = 5_000, limit: int = 40) -> Graph:
        """Who talks to whom among the channel's latest messages (the busiest pairs)."""
        pks = await self.engine.channel_pks([scope])
        if not pks:
            return Graph(edges=[], names={}, window=last_messages)
        catchup = self.engine.config.recall.interaction_catchup
        if catchup > 0 and not self.engine.graph_in_background:
            # nothing keeps the graph current in this process: catch up a bounded step, as
            # /recall does (memory.query.pipeline)
            index = interaction_names(await self.engine.members(scope))
            await self._store.interactions.update(pks[0], index, limit=catchup, wait=False)
        rows = await self._store.console.addressee_edges(
            pks[0], last_messages=last_messages, limit=limit
        )
        return Graph(
            edges=[Edge(speaker=a, addressee=b, messages=n) for a, b, n in rows],
            names=await self.names(scope),
            window=last_messages,
        )

    # ---- people -------------------------------------------------------------------------

    async def people(
        self,
        platform: str,
        workspace: str,
        *,
        query: str = "",
        within: Sequence[Scope] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[PersonRow], int]:
        """A page of the workspace's people; with `within`, only members of those channels."""
        pks = None if within is None else await self.engine.channel_pks(within)
        return await self._store.console.people(
            platform, workspace, query=query, channel_pks=pks, limit=limit, offset=offset
        )

    async def person(self, platform: str, workspace: str, user_id: str) -> PersonView | None:
        """A person's names and opt-out; None when the store knows nothing of them."""
        repo = self._store.governance
        names = await repo.user_names(platform, workspace, user_id)
        opted_out = await repo.is_opted_out(platform, workspace, user_id)
        if names["display_name"] is None and not await repo.has_spoken(
            platform, workspace, user_id
        ):
            return None
        return PersonView(
            platform=platform,
            workspace=workspace,
            user_id=user_id,
            display_name=names["display_name"],
            aliases=list(names["aliases"]),
            opted_out=opted_out,
        )

    async def speaker_messages(
        self, scopes: Sequence[Scope], user_id: str, *, limit: int = 20
    ) -> tuple[list[StoredMessage], int]:
        """The person's latest messages in these channels (what the bot holds verbatim)."""
        pks = await self.engine.channel_pks(scopes)
        return await self._store.console.speaker_messages(pks, user_id, limit=limit)

    async def on_roster(self, scopes: Sequence[Scope], user_id: str) -> bool:
        """Whether the user is or was on the roster of one of these channels."""
        pks = await self.engine.channel_pks(scopes)
        return await self._store.console.on_roster(pks, user_id)

    async def messages(self, scope: Scope, message_ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Stored messages of a channel by platform id (forgotten ones are absent)."""
        found = await self._store.messages.by_ids(scope, message_ids)
        return {mid: m for mid, m in found.items() if not m.deleted}

    # ---- health -------------------------------------------------------------------------

    async def health(self, workspaces: Collection[tuple[str, str]] | None = None) -> Health:
        """The Writer's queue, the embedding backlog, the database and the LLM: of the whole
        store for the operator (None), else of `workspaces` alone (a workspace admin's), as
        `/memory status` scopes them; the database's size is then not theirs to see."""
        if workspaces is not None:
            return await self._scoped_health(workspaces)
        store = self._store
        backlog = await store.segments.backlog()
        last_run, outcome = await last_writer_run(store)
        oldest = backlog.oldest_opened_at
        return Health(
            writer_pending=backlog.pending,
            writer_deferred=backlog.deferred,
            writer_oldest_age_s=None if oldest is None else max(0.0, time.time() - oldest),
            rederive=await store.governance.rederive_depth(),
            embed_pending=await store.messages.count_pending_embeddings(),
            db_bytes=await store.db_size_bytes(),
            driver=store.driver_name,
            llm_configured=self.llm_probe is not None,
            llm_reachable=await self._llm_reachable(),
            writer_last_run=last_run,
            writer_last_outcome=outcome,
        )

    async def _scoped_health(self, workspaces: Collection[tuple[str, str]]) -> Health:
        store = self._store
        pending = deferred = rederive = unembedded = 0
        oldest_age: float | None = None
        last: tuple[float, str | None] | None = None
        for platform, workspace in sorted(set(workspaces)):
            counts = await status_counts(store, platform, workspace)
            queue = (await writer_status(store, self.engine.config.writer, platform, workspace))[
                "queue"
            ]
            pending += int(counts["pending_segments"])  # type: ignore[call-overload]
            unembedded += int(counts["unembedded"])  # type: ignore[call-overload]
            deferred += int(queue["deferred_segments"])
            rederive += await store.governance.rederive_depth(platform, workspace)
            age = queue["oldest_pending_age_s"]
            if age is not None:
                oldest_age = max(oldest_age or 0.0, float(age))
            run, outcome = counts["writer_last_run"], counts["writer_last_outcome"]
            if isinstance(run, int | float) and (last is None or run > last[0]):
                last = (float(run), None if outcome is None else str(outcome))
        return Health(
            writer_pending=pending,
            writer_deferred=deferred,
            writer_oldest_age_s=oldest_age,
            rederive=rederive,
            embed_pending=unembedded,
            db_bytes=None,
            driver=store.driver_name,
            llm_configured=self.llm_probe is not None,
            llm_reachable=await self._llm_reachable(),
            writer_last_run=None if last is None else last[0],
            writer_last_outcome=None if last is None else last[1],
        )

    async def _llm_reachable(self) -> bool | None:
        if self.llm_probe is None:
            return None
        cache = self._probe
        async with cache.lock:
            if time.monotonic() - cache.at < LLM_PROBE_TTL_S:
                return cache.value
            try:
                async with asyncio.timeout(LLM_PROBE_TIMEOUT_S):
                    cache.value = bool(await self.llm_probe())
            except Exception:  # a probe that fails or hangs means "not reachable"
                cache.value = False
            cache.at = time.monotonic()
            return cache.value


__all__ = [
    "CatchupState",
    "ChannelDetail",
    "ChannelSummary",
    "ConsoleReads",
    "Edge",
    "Graph",
    "Health",
    "PersonCounts",
    "PersonRow",
    "PersonView",
    "RecordView",
    "SourceMessage",
]
