"""Discord channel history for catch-up and backfill (REST ``GET /channels/{id}/messages``).

`DiscordHistory` pages forward with ``after=`` (100 per request; Discord answers newest
first, so each page is reversed); discord.py's HTTP client already waits out 429s by their
``Retry-After`` and its per-route buckets. Payloads go through the same pure translator as
gateway MESSAGE_CREATEs.

`DiscordCatchUp` ties it to the gateway's life: a snapshot of where every channel stands
before connecting; catch-up once ready; on a disconnect, a new snapshot, dropped if the
session RESUMEs (Discord replays what was missed) and caught up from if a new session
starts (nothing is replayed then). A sharded process does this per shard, over the guilds
of that shard (each gateway connection is a session of its own), and never catches up
guilds on shards other processes run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import discord

from speakermem.bot.catchup import CatchUp, Start
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import MessageEvent, Scope
from speakermem.bot.reconcile import Reconciler
from speakermem.integrations.discord import translate as tr
from speakermem.integrations.payload import PayloadError
from speakermem.memory.engine import MemoryEngine

log = logging.getLogger(__name__)

PAGE = 100
DISCORD_EPOCH_MS = 1420070400000


def snowflake_at(ts: float) -> int:
    """The smallest snowflake of a moment (for ``after=`` a time)."""
    return max(0, (int(ts * 1000) - DISCORD_EPOCH_MS) << 22)


class ChannelReader:
    """Reads channel history over REST (``GET /channels/{id}/messages``), `page_size`
    messages a request, with thread → parent maps from `parents` for the translator."""

    platform = tr.PLATFORM

    def __init__(
        self,
        client: discord.Client,
        *,
        parents: Callable[[str], dict[str, str]] | None = None,
        page_size: int = PAGE,
    ) -> None:
        self.client = client
        self.parents = parents or (lambda guild_id: {})
        self.page_size = page_size
        self.skipped = 0
        """Messages the translator could not read (malformed payloads)."""


class DiscordHistory(ChannelReader):
    """Catch-up and backfill: a channel's messages after a point, oldest first."""

    async def pages(
        self, scope: Scope, *, after_id: str | None, after_ts: float | None
    ) -> AsyncIterator[list[MessageEvent]]:
        after = int(after_id) if after_id else snowflake_at(after_ts or 0.0)
        parents = self.parents(scope.workspace)
        while True:
            raw = await self.client.http.logs_from(int(scope.channel), self.page_size, after=after)
            if not raw:
                return
            page: list[MessageEvent] = []
            for d in reversed(raw):
                after = max(after, int(d["id"]))
                try:
                    event = tr.message_create(
                        {**d, "guild_id": scope.workspace}, channel_parent=parents
                    )
                except PayloadError as exc:
                    self.skipped += 1
                    log.warning("discord history: skipped a malformed message (%s)", exc)
                    continue
                if event is not None:
                    page.append(event)
            yield page
            if len(raw) < self.page_size:
                return


class DiscordCatchUp:
    """Catch-up around the gateway session: see the module docstring."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        client: discord.Client,
        *,
        parents: Callable[[str], dict[str, str]] | None = None,
        names: Callable[[], Mapping[Scope, str]] | None = None,
        shard_of: Callable[[str], int | None] | None = None,
        reconcile: Reconciler | None = None,
    ) -> None:
        """`shard_of` (a sharded client): a guild id's shard when this process runs it,
        else None; without it every stored Discord channel is this process's. `reconcile`:
        what was deleted or edited meanwhile is checked after each pass. The cursors are
        saved through `engine`."""
        self.catchup = CatchUp(
            dispatcher,
            engine.cursors,
            DiscordHistory(client, parents=parents),
            reconcile=reconcile,
        )
        self.names = names or dict
        self.shard_of = shard_of
        self._pending: dict[int | None, dict[Scope, Start]] = {}
        """Plans waiting for a session to be ready, by shard (None: the whole client)."""
        self._task: asyncio.Task[Any] | None = None
        self.runs = 0

    async def _plan(self, shard: int | None) -> dict[Scope, Start]:
        """Where this process's channels (those of `shard`, when given) stand now."""
        starts = await self.catchup.plan(await self.catchup.snapshot())
        if self.shard_of is None:
            return starts
        mine = self.shard_of
        return {
            scope: start
            for scope, start in starts.items()
            if (on := mine(scope.workspace)) is not None and (shard is None or on == shard)
        }

    async def before_connect(self) -> None:
        self._pending = {None: await self._plan(None)}

    async def on_disconnect(self, shard: int | None = None) -> None:
        if shard not in self._pending:  # the first disconnect of an outage marks the gap
            self._pending[shard] = await self._plan(shard)

    def on_resumed(self, shard: int | None = None) -> None:
        self._pending.pop(shard, None)  # a RESUME replays the missed events itself

    def on_ready(self, shard: int | None = None) -> None:
        """A new session (first connect or after one that could not resume): catch up."""
        starts = self._pending.pop(shard, None)
        if not starts:
            return
        if self._task is not None and not self._task.done():
            return  # the running pass resumes from its cursors; the next one starts after
        self.runs += 1
        self._task = asyncio.create_task(self._run(starts), name="speakermem-discord-catchup")

    async def _run(self, starts: dict[Scope, Start]) -> None:
        try:
            results = await self.catchup.run(starts, self.names())
        except Exception:
            log.exception("discord catch-up failed; the next start resumes it")
            return
        total = sum(p.fetched for p in results)
        log.info("discord catch-up done: %d channel(s), %d message(s)", len(results), total)

    async def wait(self) -> None:
        """Until the pass (of catch-up, then of the reconciliation after it) is done."""
        if self._task is not None:
            await asyncio.shield(self._task)
        if self.catchup.reconcile is not None:
            await self.catchup.reconcile.wait()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.catchup.reconcile is not None:
            await self.catchup.reconcile.stop()

    def lines(self) -> list[str]:
        return self.catchup.lines()
