"""The Discord adapter: discord.py gateway client → pure translators → Dispatcher.

Gateway intents
---------------
The bot asks for five intents: ``guilds`` (channels, roles, threads), ``guild_messages``
(message create/edit/delete in servers), ``dm_messages`` (questions in a direct message),
``members`` and ``message_content``.
**Two of them are privileged and must be switched on for the application in the
Discord Developer Portal (Bot → Privileged Gateway Intents):**

- *Server Members Intent* (``members``): the member list and join/leave/role changes,
  from which the bot works out who can read each channel — that is what limits /recall
  to channels the asker can read;
- *Message Content Intent* (``message_content``): the text of messages; without it the
  gateway sends empty content and there is nothing to remember.

Without them Discord closes the connection (code 4014) and ``speakermem`` stops with
an error naming the missing switch. Bots in 100 or more servers need Discord's
approval for both.

How it is split (as discord.py splits gateway, state and app_commands)
----------------------------------------------------------------------
- `connection`: the client, its endpoints, and the intake queue that hands dispatches to
  one worker in arrival order (message creates in bursts of one transaction);
- `guild_state`: guild, channel, role and member dispatches → who can read which channel,
  as `GuildChange`s (roster events, channel metadata, deletions) that this module applies;
- `commands` and `interactions`: the command tree, its registration, and what ``/recall``,
  ``/memory`` and button clicks do;
- `history`: catch-up around gateway sessions, reconciliation after it.

This module owns the lifecycle and the message path: MESSAGE_* payloads go through the pure
functions in `integrations.discord.translate` (never discord.py's message cache, so edits
and deletes of messages the client never saw still reach the store). A malformed payload is
logged and skipped. Messages in private threads are not stored: who may read them is not
modelled. A message that mentions the bot, or a direct message to it (intent
``dm_messages``, not privileged), is also a question: `asks` answers it in a task of its
own; direct messages are never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import discord
from discord import app_commands

from speakermem.bot.commands import MEMORY, RECALL
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import MessageEvent, Scope
from speakermem.bot.reconcile import Reconciler
from speakermem.bot.settings import Settings
from speakermem.integrations.discord import translate as tr
from speakermem.integrations.discord.asks import DiscordAsks
from speakermem.integrations.discord.commands import build_tree, sync_commands
from speakermem.integrations.discord.connection import (
    IDENTIFY_SPACING_S,
    MESSAGE_EVENTS,
    Burst,
    DiscordStartError,
    Intake,
    build_intents,
    discord_endpoints,
    discord_token,
    guard_parsers,
    make_client,
)
from speakermem.integrations.discord.guild_state import (
    PRIVATE_THREAD,
    ChannelDeleted,
    ChannelMeta,
    GuildChange,
    GuildLeft,
    GuildRoster,
    GuildState,
    ThreadDeleted,
)
from speakermem.integrations.discord.history import DiscordCatchUp
from speakermem.integrations.discord.interactions import DiscordInteractions
from speakermem.integrations.discord.members import LazyMembers, member_from_message
from speakermem.integrations.discord.reconcile import DiscordHistoryCheck
from speakermem.integrations.payload import PayloadError, opt_str
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.deletions import PlatformDeletions

__all__ = [
    "DiscordAdapter",
    "DiscordStartError",
    "GuildState",
    "build_intents",
    "discord_endpoints",
    "sync_commands",
]

log = logging.getLogger(__name__)


class DiscordAdapter:
    """Runs the gateway client and feeds the dispatcher; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        *,
        guild_ready_timeout: float = 2.0,
        ready_timeout: float = 60.0,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.engine = engine
        self.guild_ready_timeout = guild_ready_timeout
        self.ready_timeout = ready_timeout
        self.stats: Counter[str] = Counter()
        self.roster = GuildRoster()
        """Guild states and the roster they imply (integrations/discord/guild_state.py)."""
        self.intake = Intake(self.stats)
        self.members = LazyMembers(lambda: self.client, self.stats)
        self.interactions = DiscordInteractions(
            settings, dispatcher, self.roster, self.intake, self.members, self.stats
        )
        self.client: discord.Client | None = None
        self.asks = DiscordAsks(settings, dispatcher, self.roster, lambda: self.client, self.stats)
        """Mentions, replies that mention the bot, direct messages (discord/asks.py)."""
        self.tree: app_commands.CommandTree[Any] | None = None
        self._ready = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._endpoints: contextlib.ExitStack | None = None
        self.catchup: DiscordCatchUp | None = None
        """History catch-up around gateway sessions (integrations/discord/history.py)."""
        self._deletions: PlatformDeletions | None = None
        self._stopping = False
        """Set by stop(): the disconnect our own close causes needs no catch-up snapshot (it
        would read a database that is about to close)."""
        self._snapshots: set[asyncio.Task[Any]] = set()
        """on_disconnect handlers taking a catch-up snapshot; stop() lets them finish."""

    @property
    def guilds(self) -> dict[str, GuildState]:
        return self.roster.guilds

    @property
    def processed(self) -> int:
        """Queued gateway events handled so far."""
        return self.intake.processed

    async def wait_processed(self, count: int, within: float = 5.0) -> None:
        """Wait until `count` queued events have been handled (tests, graceful shutdowns)."""
        await self.intake.wait_processed(count, within)

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Log in and connect in the background; return once ready, or raise why not."""
        token = discord_token(self.settings)
        self._stopping = False
        self._endpoints = contextlib.ExitStack()
        self._endpoints.enter_context(discord_endpoints(self.settings))
        client = self.client = make_client(
            self.settings, guild_ready_timeout=self.guild_ready_timeout
        )
        guard_parsers(client)
        handlers = self.interactions
        self.tree = build_tree(
            client,
            {RECALL.name: handlers.on_recall, MEMORY.name: handlers.on_memory},
            handlers.on_ask_about,
        )
        self.tree.error(handlers.on_tree_error)
        self.dispatcher.set_notifier(tr.PLATFORM, self.notify)
        catchup = self.catchup = self._catchup(client)
        await catchup.before_connect()
        self._listen(client, catchup)
        self._worker = asyncio.create_task(
            self.intake.work(self._handle_burst, self._handle), name="speakermem-discord-events"
        )
        self._runner = asyncio.create_task(client.start(token), name="speakermem-discord")
        self._runner.add_done_callback(self._runner_done)
        ready = asyncio.create_task(self._ready.wait())
        shards = self.settings.discord_shard_ids or range(self.settings.discord_shard_count or 1)
        within = self.ready_timeout + IDENTIFY_SPACING_S * (len(shards) - 1)
        try:
            done, _ = await asyncio.wait(
                {ready, self._runner},
                timeout=within,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if ready in done and self._ready.is_set():
            return
        error: BaseException | None = None
        if self._runner.done() and not self._runner.cancelled():
            error = self._runner.exception()
        await self.stop()
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise DiscordStartError(
                "Discord refused the privileged intents: enable 'Server Members Intent' and "
                "'Message Content Intent' under Bot in the Developer Portal"
            ) from error
        if isinstance(error, discord.LoginFailure):
            raise DiscordStartError(
                "Discord rejected the token (SPEAKERMEM_DISCORD_TOKEN)"
            ) from error
        if error is not None:
            raise DiscordStartError(f"Discord connection failed: {error}") from error
        raise DiscordStartError(f"Discord was not ready within {within:g} s")

    def _catchup(self, client: discord.Client) -> DiscordCatchUp:
        """Catch-up for this client's sessions, with reconciliation after each pass unless
        SPEAKERMEM_RECONCILE_LOOKBACK_S=0."""

        def parents(gid: str) -> dict[str, str]:
            return self.guilds[gid].parents() if gid in self.guilds else {}

        sharded = isinstance(client, discord.AutoShardedClient)
        reconcile = None
        if self.settings.reconcile_lookback_s > 0:
            reconcile = Reconciler(
                self.deletions,
                self.engine.cursors,
                DiscordHistoryCheck(client, parents=parents),
                lookback_s=self.settings.reconcile_lookback_s,
                budget_s=self.settings.reconcile_budget_s,
            )
        return DiscordCatchUp(
            self.dispatcher,
            self.engine,
            client,
            parents=parents,
            names=self.roster.channel_names,
            shard_of=self._own_shard if sharded else None,
            reconcile=reconcile,
        )

    def _listen(self, client: discord.Client, catchup: DiscordCatchUp) -> None:
        """Register the client's event handlers: raw frames to the intake, components to the
        interactions, session changes to catch-up."""

        async def on_interaction(interaction: discord.Interaction) -> None:
            if interaction.type is discord.InteractionType.component:
                await self.interactions.on_component(interaction)

        async def on_socket_raw_receive(msg: Any) -> None:
            self.intake.receive(msg)

        async def on_ready() -> None:
            log.info("discord: connected as %s to %d guild(s)", client.user, len(client.guilds))
            self._ready.set()
            catchup.on_ready()

        async def snapshot(shard: int | None) -> None:
            if self._stopping:
                return
            task = asyncio.current_task()
            if task is not None:
                self._snapshots.add(task)
            try:
                await catchup.on_disconnect(shard)
            finally:
                if task is not None:
                    self._snapshots.discard(task)

        async def on_disconnect() -> None:
            await snapshot(None)

        async def on_resumed() -> None:
            catchup.on_resumed()

        # A sharded client runs a session per shard: a shard drops, resumes or starts anew
        # alone (and discord.py fires on_ready again only once every shard of the process
        # has identified anew), so catch-up follows each shard's own events instead.
        async def on_shard_disconnect(shard_id: int) -> None:
            await snapshot(shard_id)

        async def on_shard_resumed(shard_id: int) -> None:
            catchup.on_resumed(shard_id)

        async def on_shard_ready(shard_id: int) -> None:
            if self._ready.is_set():  # a new session after start-up (start-up: on_ready)
                catchup.on_ready(shard_id)

        client.event(on_socket_raw_receive)
        client.event(on_ready)
        if isinstance(client, discord.AutoShardedClient):
            client.event(on_shard_disconnect)
            client.event(on_shard_resumed)
            client.event(on_shard_ready)
        else:
            client.event(on_disconnect)
            client.event(on_resumed)
        client.event(on_interaction)

    def _own_shard(self, guild_id: str) -> int | None:
        """The shard of `guild_id` (Discord's rule) when this process runs it, else None."""
        count = self.settings.discord_shard_count
        if not count or not guild_id.isdigit():
            return None
        shard = (int(guild_id) >> 22) % count
        ids = self.settings.discord_shard_ids
        return shard if ids is None or shard in ids else None

    @property
    def deletions(self) -> PlatformDeletions:
        """Forgets deleted threads, channels and guilds the bot left (memory/governance)."""
        if self._deletions is None:
            self._deletions = PlatformDeletions(self.dispatcher.governance)
        return self._deletions

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("discord: the client stopped: %r", task.exception())

    async def connected(self) -> bool:
        """For /healthz: a ready client whose gateway socket is open (False while resuming)."""
        client = self.client
        if client is None or client.is_closed() or not client.is_ready():
            return False
        if isinstance(client, discord.AutoShardedClient):
            # one socket per shard (client.ws stays None): connected while every one is open
            shards = client.shards
            return bool(shards) and not any(s.is_closed() for s in shards.values())
        socket = getattr(client.ws, "socket", None)
        return socket is not None and not socket.closed

    async def wait_closed(self) -> None:
        """Return when the client's connection ends for good (raises what ended it).

        discord.py reconnects by itself after network errors; this returns only after
        `stop()` or a fatal error (bad token, missing intents), so a `run` command can
        await it and exit non-zero on the error.
        """
        if self._runner is not None:
            await asyncio.shield(self._runner)

    async def stop(self, *, drain_timeout: float = 5.0, drain_limit: float = 30.0) -> None:
        """Close the connection, finish queued events, restore endpoints.

        The queue is drained for as long as it keeps moving (each `drain_timeout` window
        must apply something), up to `drain_limit` in all (inside a supervisor's usual
        30 s grace); what is left then is logged and fetched by the next start's catch-up."""
        self._stopping = True
        if self._snapshots:  # a disconnect (say a fatal close) is being snapshotted: finish it
            await asyncio.wait(set(self._snapshots), timeout=5.0)
        self.members.cancel()
        if self.catchup is not None:
            await self.catchup.stop()  # its cursors are saved per page: the next start resumes
        if self.client is not None and not self.client.is_closed():
            await self.client.close()
        if self._runner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 5.0)
            self._runner = None
        if self._worker is not None:
            await self.intake.drain(drain_timeout, drain_limit)
        await self.asks.drain(drain_timeout)  # answers being written, before the store closes
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        if self._endpoints is not None:
            self._endpoints.close()
            self._endpoints = None
        self._ready.clear()

    async def notify(self, scope: Scope, text: str) -> None:
        """Post a normal message in a channel (the one-time "I remember this channel" notice)."""
        if self.client is None:
            raise RuntimeError("the Discord client is not running")
        channel = self.client.get_partial_messageable(
            int(scope.channel), guild_id=int(scope.workspace)
        )
        await channel.send(text, allowed_mentions=discord.AllowedMentions.none())

    # ---- queued events ------------------------------------------------------------------

    async def _handle(self, event: str, d: Any) -> None:
        if not isinstance(d, dict):
            raise PayloadError(f"discord {event}: expected an object, got {type(d).__name__}")
        if event in MESSAGE_EVENTS:
            await self._on_message_event(event, d)
        elif event == "GUILD_CREATE":
            await self._on_guild_create(d)
        else:
            await self._apply(self.roster.parse(event, d))

    async def _apply(self, change: GuildChange) -> None:
        """Carry out what a guild dispatch changed: forget what was deleted, record channel
        names and privacy, then the roster events (through the dispatcher)."""
        for gone in change.deletions:
            match gone:
                case GuildLeft(guild_id=gid):
                    await self.deletions.workspace_left(tr.PLATFORM, gid, actor=tr.PLATFORM)
                case ChannelDeleted(scope=scope):
                    await self.deletions.channel_deleted(scope, actor=tr.PLATFORM)
                case ThreadDeleted(scope=scope, thread_id=tid):
                    await self.deletions.thread_deleted(scope, tid, actor=tr.PLATFORM)
        for meta in change.channels:
            await self._record(meta)
        for event in change.roster:
            await self.dispatcher.handle(event)

    async def _record(self, meta: ChannelMeta) -> None:
        await self.engine.set_channel_meta(meta.scope, name=meta.name, is_private=meta.is_private)

    async def _on_guild_create(self, d: dict[str, Any]) -> None:
        """Record every text channel, read who the store's roster holds in each, then send
        the JOINs (and, once every member is known, LEAVEs) that make it who can read."""
        state = self.roster.add_guild(d)
        if state is None:
            return
        held: dict[str, set[str]] = {}
        for cid in state.text_channels():
            for meta in self.roster.channel_meta(state, cid):
                await self._record(meta)
                held[cid] = {m.user_id for m in await self.engine.members(meta.scope)}
        await self._apply(GuildChange(roster=self.roster.seed(state, held)))
        log.info(
            "discord: guild %s: %d channels, %d/%d members",
            state.guild_id,
            len(state.text_channels()),
            len(state.members),
            state.member_count,
        )

    # ---- messages -----------------------------------------------------------------------

    def _channel_parent(self, guild_id: str | None, channel_id: Any) -> tuple[dict[str, str], bool]:
        """(thread → parent map for the translator, whether the channel is a private thread)."""
        state = self.guilds.get(guild_id or "")
        cid = str(channel_id)
        if state is not None and cid in state.threads:
            return state.parents(), state.threads[cid][1] == PRIVATE_THREAD
        # A thread we have not seen (e.g. unarchived): ask discord.py's channel cache.
        channel = self.client.get_channel(int(cid)) if self.client and cid.isdigit() else None
        if isinstance(channel, discord.Thread) and channel.parent_id:
            kind = channel.type.value
            if state is not None:
                state.threads[cid] = (str(channel.parent_id), kind)
            return {cid: str(channel.parent_id)}, kind == PRIVATE_THREAD
        return (state.parents() if state is not None else {}), False

    async def _learn_author(self, guild_id: str | None, d: Mapping[str, Any]) -> None:
        """A member not known yet (no start-up chunks): their message carries their roles."""
        member = member_from_message(d)
        events = self.roster.learn_author(guild_id, member) if member is not None else None
        if events is None:
            return
        self.stats["member_learned"] += 1
        await self._apply(GuildChange(roster=events))

    def _created(self, d: dict[str, Any], parents: dict[str, str]) -> MessageEvent | None:
        """A MESSAGE_CREATE as a message to store, or None (not a message, or a bot's)."""
        msg = tr.message_create(d, channel_parent=parents)
        if msg is None:
            return None
        me = self.client.user if self.client is not None else None
        if msg.speaker_is_bot or (me is not None and msg.speaker_id == str(me.id)):
            # any bot, and this bot's own posts (answers, notices) even unflagged
            self.stats["bot_message_skipped"] += 1
            return None
        return msg

    def _channel_of(
        self, event: str, d: dict[str, Any]
    ) -> tuple[str | None, dict[str, str]] | None:
        """(guild id, thread -> parent map) of a message event; None for a private thread
        (never stored)."""
        guild_id = opt_str(d, "guild_id", f"discord {event}")
        parents, private = self._channel_parent(guild_id, d.get("channel_id"))
        if private:
            self.stats["private_thread_skipped"] += 1
            return None
        return guild_id, parents

    async def _handle_burst(self, burst: Burst) -> None:
        """MESSAGE_CREATEs taken from the queue together: translated one by one (a malformed
        one is skipped alone), stored in one transaction, in order."""
        msgs: list[MessageEvent] = []
        authors: list[tuple[str | None, dict[str, Any]]] = []
        for event, d in burst:
            try:
                if not isinstance(d, dict):
                    raise PayloadError(
                        f"discord {event}: expected an object, got {type(d).__name__}"
                    )
                where = self._channel_of(event, d)
                if where is not None:
                    self.asks.on_message(d, where[1])  # a question? answered in a task
                msg = self._created(d, where[1]) if where is not None else None
                if where is not None and msg is not None:
                    msgs.append(msg)
                    authors.append((where[0], d))
            except PayloadError as exc:
                self.stats["malformed"] += 1
                log.warning("discord: skipped malformed %s: %s", event, exc)
        await self.dispatcher.handle_many(msgs)
        for guild_id, d in authors:
            await self._learn_author(guild_id, d)
        self.stats["MESSAGE_CREATE"] += len(burst)
        if len(burst) > 1:
            self.stats["message_bursts"] += 1

    async def _on_message_event(self, event: str, d: dict[str, Any]) -> None:
        """Edits and deletes (creates come in bursts, `_handle_burst`)."""
        where = self._channel_of(event, d)
        if where is None:
            return
        parents = where[1]
        if event == "MESSAGE_UPDATE":
            edit = tr.message_update(d, channel_parent=parents)
            if edit is not None:
                await self.dispatcher.handle(edit)
        elif event == "MESSAGE_DELETE":
            delete = tr.message_delete(d, channel_parent=parents)
            if delete is not None:
                await self.dispatcher.handle(delete)
        else:
            for delete in tr.message_delete_bulk(d, channel_parent=parents):
                await self.dispatcher.handle(delete)
