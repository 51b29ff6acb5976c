"""The Discord adapter: discord.py gateway client → pure translators → Dispatcher.

Gateway intents
---------------
The bot asks for four intents: ``guilds`` (channels, roles, threads), ``guild_messages``
(message create/edit/delete in servers), ``members`` and ``message_content``.
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

How events flow
---------------
Every gateway dispatch reaches ``on_socket_raw_receive`` (``enable_debug_events``) as
the raw JSON; the ones we use are queued and handled **in order** by one worker, so an
edit never overtakes the message it edits. Handling uses the raw payloads and the pure
functions in `integrations.discord.translate`, never discord.py's message cache, so
edits and deletes of messages the client never saw (older than this process, or
imported) still reach the store. A malformed payload is logged and skipped.

The roster of each text channel is the set of guild members who can view it, computed
from roles, channel overwrites and member roles (`translate.can_read_channel`). It is
reconciled with the store on GUILD_CREATE and kept live from member add/remove/update
(role changes), channel create/update/delete (overwrites) and role changes. Messages in
private threads are not stored: who may read them is not modelled.

/recall is an application command built from `bot.commands.RECALL`; the response is
deferred at once, then answered with an embed (`integrations.discord.render`). Command
registration (tree sync) happens only in `sync_commands` (``speakermem discord-sync``),
never on start: Discord rate-limits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import discord
import yarl
from discord import app_commands

from bot.commands import COMMANDS, MEMORY, RECALL, CommandSpec
from bot.dispatch import GROUP_MAX, Dispatcher
from bot.events import MessageEvent, RosterAction, RosterEvent, Scope
from bot.governance import CommandReply, ConfirmPrompt
from bot.reconcile import Reconciler
from bot.settings import Settings
from integrations.discord import translate as tr
from integrations.discord.commands import (
    build_memory_groups,
    confirm_custom_id,
    memory_line,
    parse_confirm_custom_id,
    reply_parts,
)
from integrations.discord.history import DiscordCatchUp
from integrations.discord.members import PermissionCache, member_from_message
from integrations.discord.reconcile import DiscordHistoryCheck
from integrations.discord.render import render_embed
from integrations.payload import PayloadError, opt_str, req_dict, req_str
from memory.engine import MemoryEngine
from memory.governance.deletions import PlatformDeletions
from memory.query.answer import RecallAnswer

__all__ = [
    "DiscordAdapter",
    "DiscordStartError",
    "GuildState",
    "build_intents",
    "discord_endpoints",
    "sync_commands",
]

log = logging.getLogger(__name__)

BURST_MAX = GROUP_MAX
"""Most MESSAGE_CREATEs stored in one transaction when they wait in the queue together."""

CHUNK_TIMEOUT_S = 120.0
"""How long a lazy member request may take (a 100,000-member guild is 100 chunks)."""

MANAGE_GUILD = 1 << 5

_MESSAGE_EVENTS = frozenset(
    {"MESSAGE_CREATE", "MESSAGE_UPDATE", "MESSAGE_DELETE", "MESSAGE_DELETE_BULK"}
)
_GUILD_EVENTS = frozenset(
    {
        "GUILD_CREATE",
        "GUILD_UPDATE",
        "GUILD_DELETE",
        "GUILD_ROLE_CREATE",
        "GUILD_ROLE_UPDATE",
        "GUILD_ROLE_DELETE",
        "CHANNEL_CREATE",
        "CHANNEL_UPDATE",
        "CHANNEL_DELETE",
        "THREAD_CREATE",
        "THREAD_UPDATE",
        "THREAD_DELETE",
        "THREAD_LIST_SYNC",
        "GUILD_MEMBER_ADD",
        "GUILD_MEMBER_REMOVE",
        "GUILD_MEMBER_UPDATE",
        "GUILD_MEMBERS_CHUNK",
    }
)
HANDLED_EVENTS = _MESSAGE_EVENTS | _GUILD_EVENTS
IDENTIFY_SPACING_S = 5.0
"""What discord.py's default ``before_identify_hook`` waits before each IDENTIFY after a
client's first (Discord's identify rate limit): a process running N shards is ready that
much later per extra shard, so `start` waits that much longer than ``ready_timeout``."""
_PRIVATE_THREAD = 12
_CATEGORY = 4
_STASHED_INTERACTIONS = 256


class DiscordStartError(RuntimeError):
    """The client could not log in or connect (bad token, missing intents, unreachable)."""


def build_intents() -> discord.Intents:
    """Exactly what the bot needs; members and message_content are privileged."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.members = True
    intents.message_content = True
    return intents


@contextlib.contextmanager
def discord_endpoints(settings: Settings) -> Iterator[None]:
    """Point discord.py at `settings`' REST and gateway URLs (a stand-in, a proxy) and back.

    discord.py keeps both as class attributes, so this is process-wide while active.
    """
    import discord.gateway
    import discord.http

    old_base = discord.http.Route.BASE
    old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    # only what differs from discord.py's own endpoints is patched
    api = settings.discord_api_url.rstrip("/")
    if api != old_base.rstrip("/"):
        discord.http.Route.BASE = api  # type: ignore[misc]
    if settings.discord_gateway_url.rstrip("/") != str(old_gateway).rstrip("/"):
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.discord_gateway_url)
    try:
        yield
    finally:
        discord.http.Route.BASE = old_base  # type: ignore[misc]
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old_gateway


def _token(settings: Settings) -> str:
    token = settings.discord_token.get_secret_value().strip() if settings.discord_token else ""
    if not token:
        raise ValueError(
            "SPEAKERMEM_DISCORD_TOKEN is not set (the bot token from the Developer "
            "Portal, Bot → Reset Token)"
        )
    return token


def guard_parsers(client: discord.Client) -> bool:
    """Make discord.py skip, not die on, a dispatch its own parser cannot handle.

    discord.py parses each dispatch into its cache before anything of ours runs, and an
    exception there (a payload with a missing or mistyped field) propagates out of
    ``Client.start`` and ends the connection. This wraps the parser table of the
    client's connection state (``client._connection.parsers``, private but stable
    through discord.py 2.x) so such a payload is logged and skipped instead. Our own
    handling of the same payload is independent: it already has the raw JSON.
    """
    parsers = getattr(getattr(client, "_connection", None), "parsers", None)
    if not isinstance(parsers, dict):
        log.warning("discord.py has no parser table here; malformed payloads may disconnect")
        return False

    def guarded(event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        def run(data: Any) -> None:
            try:
                parse(data)
            except Exception:
                log.warning("discord.py could not parse %s; skipped", event, exc_info=True)

        return run

    for event, parse in list(parsers.items()):
        parsers[event] = guarded(event, parse)
    return True


# --- commands ---------------------------------------------------------------------------------

CommandHandler = Callable[[discord.Interaction, dict[str, Any]], Awaitable[None]]


def build_command(
    spec: CommandSpec, handler: CommandHandler
) -> app_commands.Command[Any, Any, Any]:
    """An app command from a platform-neutral spec: string options, described and bounded."""

    async def callback(interaction: discord.Interaction, **options: Any) -> None:
        await handler(interaction, options)

    params = [
        inspect.Parameter(
            "interaction", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=discord.Interaction
        )
    ]
    for opt in sorted(spec.options, key=lambda o: not o.required):
        annotation: Any = app_commands.Range[str, 1, opt.max_length]
        params.append(
            inspect.Parameter(
                opt.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=annotation if opt.required else annotation | None,
                default=inspect.Parameter.empty if opt.required else None,
            )
        )
    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__name__ = callback.__qualname__ = spec.name.replace("-", "_")
    callback.__discord_app_commands_param_description__ = {  # type: ignore[attr-defined]
        o.name: o.description[:100] for o in spec.options
    }
    command: app_commands.Command[Any, Any, Any] = app_commands.Command(
        name=spec.name, description=spec.description, callback=callback
    )
    command.guild_only = True
    if spec.admin_only:
        command.default_permissions = discord.Permissions(MANAGE_GUILD)
    return command


def build_tree(
    client: discord.Client, handlers: Mapping[str, CommandHandler]
) -> app_commands.CommandTree[Any]:
    tree: app_commands.CommandTree[Any] = app_commands.CommandTree(client)
    for spec in COMMANDS:
        handler = handlers.get(spec.name)
        if handler is None:
            continue
        if spec.name == MEMORY.name:
            # subcommands with typed options, in two groups (see integrations.discord.commands)
            for group in build_memory_groups(_without_options(handler)):
                tree.add_command(group)
            continue
        tree.add_command(build_command(spec, handler))
    return tree


def _without_options(handler: CommandHandler) -> Callable[[discord.Interaction], Awaitable[None]]:
    async def forward(interaction: discord.Interaction) -> None:
        await handler(interaction, {})

    return forward


async def sync_commands(settings: Settings, guild_id: str | None) -> list[str]:
    """Register the commands with Discord (global, or one guild for instant availability).

    Only REST is used: log in, PUT the command list, log out. Run it once after
    installing or upgrading, not on every start (Discord rate-limits command syncs).
    """
    token = _token(settings)

    async def unused(interaction: discord.Interaction, options: dict[str, Any]) -> None:
        raise RuntimeError("sync-only tree")  # pragma: no cover

    with discord_endpoints(settings):
        client = discord.Client(intents=discord.Intents.none())
        tree = build_tree(client, {spec.name: unused for spec in COMMANDS})
        async with client:
            await client.login(token)
            if guild_id:
                guild = discord.Object(int(guild_id))
                tree.copy_global_to(guild=guild)
                synced = await tree.sync(guild=guild)
            else:
                synced = await tree.sync()
    names = [c.name for c in synced]
    log.info("synced commands %s to %s", names, f"guild {guild_id}" if guild_id else "all guilds")
    return names


# --- guild state (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class MemberInfo:
    roles: frozenset[str]
    name: str | None
    is_bot: bool


@dataclass
class GuildState:
    """What the permission computation needs, kept from raw gateway payloads."""

    perms: tr.GuildPerms
    channels: dict[str, tr.ChannelPerms] = field(default_factory=dict)
    """Text-ish channels and categories (no threads)."""
    names: dict[str, str] = field(default_factory=dict)
    threads: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    """thread id → (parent channel id, thread type)."""
    members: dict[str, MemberInfo] = field(default_factory=dict)
    member_count: int = 0

    @classmethod
    def from_guild_create(cls, d: Mapping[str, Any]) -> GuildState:
        perms, channels = tr.perms_from_guild_create(d)
        state = cls(perms=perms)
        for ch in [*(d.get("channels") or []), *(d.get("threads") or [])]:
            state.put_channel(ch, channels)
        for m in d.get("members") or []:
            state.put_member(m)
        count = d.get("member_count")
        state.member_count = count if isinstance(count, int) else len(state.members)
        return state

    @property
    def guild_id(self) -> str:
        return self.perms.guild_id

    @property
    def complete(self) -> bool:
        """Whether every member is known (large guilds arrive in chunks)."""
        return len(self.members) >= self.member_count

    def parse_channel(self, ch: Mapping[str, Any]) -> tr.ChannelPerms:
        fake = {"id": self.guild_id, "owner_id": self.perms.owner_id, "channels": [ch]}
        _perms, parsed = tr.perms_from_guild_create(fake)
        return parsed[req_str(ch, "id", "discord channel")]

    def put_channel(
        self, ch: Mapping[str, Any], parsed: Mapping[str, tr.ChannelPerms] | None = None
    ) -> str:
        if not isinstance(ch, Mapping):
            raise PayloadError("discord channel: expected an object")
        cid = req_str(ch, "id", "discord channel")
        kind = ch.get("type")
        if kind in tr.THREAD_TYPES:
            parent = req_str(ch, "parent_id", "discord thread")
            self.threads[cid] = (parent, kind if isinstance(kind, int) else None)
            return cid
        self.channels[cid] = parsed[cid] if parsed and cid in parsed else self.parse_channel(ch)
        name = ch.get("name")
        if isinstance(name, str) and name:
            self.names[cid] = name
        return cid

    def put_member(self, m: Mapping[str, Any]) -> str:
        if not isinstance(m, Mapping):
            raise PayloadError("discord member: expected an object")
        user = req_dict(m, "user", "discord member")
        uid = req_str(user, "id", "discord member")
        self.members[uid] = MemberInfo(
            roles=frozenset(tr.member_roles(m)),
            name=tr.display_name(user, m),
            is_bot=bool(user.get("bot")),
        )
        return uid

    def text_channels(self) -> list[str]:
        return [cid for cid, ch in self.channels.items() if ch.type != _CATEGORY]

    def can_read(self, uid: str, channel_id: str, roles: Iterable[str] | None = None) -> bool:
        ch = self.channels.get(channel_id)
        if ch is None:
            return False
        if roles is None:
            info = self.members.get(uid)
            if info is None:
                return False
            roles = info.roles
        return tr.can_read_channel(set(roles), uid, self.perms, ch)

    def readable(self, uid: str, roles: Iterable[str] | None = None) -> tuple[str, ...]:
        r = set(roles) if roles is not None else None
        return tuple(c for c in self.text_channels() if self.can_read(uid, c, r))

    def is_private(self, channel_id: str) -> bool:
        """Private = @everyone cannot view it."""
        ch = self.channels.get(channel_id)
        return ch is not None and not tr.can_read_channel(set(), "", self.perms, ch)

    def parents(self) -> dict[str, str]:
        return {tid: parent for tid, (parent, _kind) in self.threads.items()}


# --- the adapter ------------------------------------------------------------------------------


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
        self.guilds: dict[str, GuildState] = {}
        self.granted: dict[str, dict[str, set[str]]] = {}
        self.permissions = PermissionCache()
        """Readable channels per (member, roles), dropped on permission changes."""
        """guild → channel → user ids the store's roster holds (as far as we wrote it)."""
        self.stats: Counter[str] = Counter()
        self.processed = 0
        self.client: discord.Client | None = None
        self.tree: app_commands.CommandTree[Any] | None = None
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._progress = asyncio.Condition()
        self._interactions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._ready = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._endpoints: contextlib.ExitStack | None = None
        self.catchup: DiscordCatchUp | None = None
        self._deletions: PlatformDeletions | None = None
        self._stopping = False
        """Set by stop(): the disconnect our own close causes needs no catch-up snapshot (it
        would read a database that is about to close)."""
        self._snapshots: set[asyncio.Task[Any]] = set()
        """on_disconnect handlers taking a catch-up snapshot; stop() lets them finish."""
        """History catch-up around gateway sessions (integrations/discord/history.py)."""
        self._chunked: set[str] = set()
        """Guilds whose full member list was requested (lazily, see `_want_members`)."""
        self._chunk_lock = asyncio.Lock()
        self._chunk_tasks: set[asyncio.Task[None]] = set()

    # ---- lifecycle ----------------------------------------------------------------------

    def _make_client(self) -> discord.Client:
        options: dict[str, Any] = {
            "intents": build_intents(),
            "enable_debug_events": True,  # raw payloads via on_socket_raw_receive
            "guild_ready_timeout": self.guild_ready_timeout,
            "max_messages": None,  # we never read discord.py's message cache
            # members are learned lazily (messages, interactions, member events), not as
            # 100 chunk pages per 100,000-member guild before ready (integrations.discord.members)
            "chunk_guilds_at_startup": False,
        }
        shards = self.settings.discord_shard_count
        if shards:
            # SPEAKERMEM_DISCORD_SHARD_IDS: this process runs only its range of the shards
            # (validated within the count by Settings); None = every shard here.
            ids = self.settings.discord_shard_ids
            if ids is not None:
                options["shard_ids"] = list(ids)
            return discord.AutoShardedClient(shard_count=shards, **options)
        return discord.Client(**options)

    async def start(self) -> None:
        """Log in and connect in the background; return once ready, or raise why not."""
        token = _token(self.settings)
        self._stopping = False
        self._endpoints = contextlib.ExitStack()
        self._endpoints.enter_context(discord_endpoints(self.settings))
        client = self.client = self._make_client()
        guard_parsers(client)
        self.tree = build_tree(client, {RECALL.name: self._on_recall, MEMORY.name: self._on_memory})
        self.tree.error(self._on_tree_error)
        self.dispatcher.set_notifier(tr.PLATFORM, self.notify)

        async def on_interaction(interaction: discord.Interaction) -> None:
            if interaction.type is discord.InteractionType.component:
                await self._on_component(interaction)

        async def on_socket_raw_receive(msg: Any) -> None:
            self._receive(msg)

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

        sharded = isinstance(client, discord.AutoShardedClient)

        def parents(gid: str) -> dict[str, str]:
            return self.guilds[gid].parents() if gid in self.guilds else {}

        reconcile = None
        if self.settings.reconcile_lookback_s > 0:
            reconcile = Reconciler(
                self.deletions,
                self.engine.cursors,
                DiscordHistoryCheck(client, parents=parents),
                lookback_s=self.settings.reconcile_lookback_s,
                budget_s=self.settings.reconcile_budget_s,
            )
        catchup = self.catchup = DiscordCatchUp(
            self.dispatcher,
            self.engine.cursors,
            client,
            parents=parents,
            names=self._channel_names,
            shard_of=self._own_shard if sharded else None,
            reconcile=reconcile,
        )
        await catchup.before_connect()
        client.event(on_socket_raw_receive)
        client.event(on_ready)
        if sharded:
            client.event(on_shard_disconnect)
            client.event(on_shard_resumed)
            client.event(on_shard_ready)
        else:
            client.event(on_disconnect)
            client.event(on_resumed)
        client.event(on_interaction)
        self._worker = asyncio.create_task(self._work(), name="speakermem-discord-events")
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

    def _channel_names(self) -> dict[Scope, str]:
        return {
            Scope(platform=tr.PLATFORM, workspace=gid, channel=cid): name
            for gid, state in self.guilds.items()
            for cid, name in state.names.items()
        }

    async def stop(self, *, drain_timeout: float = 5.0, drain_limit: float = 30.0) -> None:
        """Close the connection, finish queued events, restore endpoints.

        The queue is drained for as long as it keeps moving (each `drain_timeout` window
        must apply something), up to `drain_limit` in all (inside a supervisor's usual
        30 s grace); what is left then is logged and fetched by the next start's catch-up."""
        self._stopping = True
        if self._snapshots:  # a disconnect (say a fatal close) is being snapshotted: finish it
            await asyncio.wait(set(self._snapshots), timeout=5.0)
        for task in list(self._chunk_tasks):
            task.cancel()
        if self.catchup is not None:
            await self.catchup.stop()  # its cursors are saved per page: the next start resumes
        if self.client is not None and not self.client.is_closed():
            await self.client.close()
        if self._runner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 5.0)
            self._runner = None
        if self._worker is not None:
            await self._drain(drain_timeout, drain_limit)
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        if self._endpoints is not None:
            self._endpoints.close()
            self._endpoints = None
        self._ready.clear()

    async def _drain(self, window: float, limit: float) -> None:
        deadline = time.monotonic() + limit
        while True:
            before = self.processed
            try:
                await asyncio.wait_for(
                    self._queue.join(), max(0.0, min(window, deadline - time.monotonic()))
                )
                return
            except TimeoutError:
                if self.processed == before or time.monotonic() >= deadline:
                    log.warning(
                        "discord: %d queued event(s) left unapplied on stop; the next start's "
                        "catch-up fetches their messages from channel history",
                        self._queue.qsize(),
                    )
                    return
                log.info("discord: draining, %d event(s) still queued", self._queue.qsize())

    async def wait_processed(self, count: int, within: float = 5.0) -> None:
        """Wait until `count` queued events have been handled (tests, graceful shutdowns)."""
        async with asyncio.timeout(within), self._progress:
            await self._progress.wait_for(lambda: self.processed >= count)

    # ---- raw intake ---------------------------------------------------------------------

    def _receive(self, msg: Any) -> None:
        """Runs for every gateway frame, in order: queue what we handle, nothing else."""
        try:
            if isinstance(msg, bytes | bytearray):
                msg = msg.decode("utf-8")
            payload = json.loads(msg) if isinstance(msg, str) else msg
        except (ValueError, UnicodeDecodeError):
            self.stats["unparsable_frame"] += 1
            return
        if not isinstance(payload, dict) or payload.get("op") != 0:
            return
        event = payload.get("t")
        data = payload.get("d")
        if event == "INTERACTION_CREATE" and isinstance(data, dict) and data.get("id"):
            # the tree's callback reads it back by id to run the pure translator
            self._interactions[str(data["id"])] = data
            while len(self._interactions) > _STASHED_INTERACTIONS:
                self._interactions.popitem(last=False)
        elif event in HANDLED_EVENTS:
            self._queue.put_nowait((event, data))

    async def _work(self) -> None:
        """Events in arrival order; a run of MESSAGE_CREATEs already waiting in the queue is
        stored as one burst (one transaction), so a busy guild does not pay a transaction
        per message. Order holds: a burst never jumps over an edit or a delete."""
        carry: tuple[str, Any] | None = None
        while True:
            item = carry if carry is not None else await self._queue.get()
            carry = None
            burst = [item]
            if item[0] == "MESSAGE_CREATE":
                while len(burst) < BURST_MAX and not self._queue.empty():
                    nxt = self._queue.get_nowait()
                    if nxt[0] != "MESSAGE_CREATE":
                        carry = nxt
                        break
                    burst.append(nxt)
            try:
                if item[0] == "MESSAGE_CREATE":
                    await self._handle_burst(burst)
                else:
                    await self._handle(*item)
                    self.stats[item[0]] += 1
            except PayloadError as exc:
                self.stats["malformed"] += 1
                log.warning("discord: skipped malformed %s: %s", item[0], exc)
            except Exception:
                self.stats["errors"] += 1
                log.exception("discord: failed to handle %s; skipped", item[0])
            finally:
                for _ in burst:
                    self._queue.task_done()
                async with self._progress:
                    self.processed += len(burst)
                    self._progress.notify_all()

    async def _handle(self, event: str, d: Any) -> None:
        if not isinstance(d, dict):
            raise PayloadError(f"discord {event}: expected an object, got {type(d).__name__}")
        if event in _MESSAGE_EVENTS:
            await self._on_message_event(event, d)
            return
        handler = getattr(self, "_on_" + event.lower())
        await handler(d)

    # ---- messages -----------------------------------------------------------------------

    def _channel_parent(self, guild_id: str | None, channel_id: Any) -> tuple[dict[str, str], bool]:
        """(thread → parent map for the translator, whether the channel is a private thread)."""
        state = self.guilds.get(guild_id or "")
        cid = str(channel_id)
        if state is not None and cid in state.threads:
            return state.parents(), state.threads[cid][1] == _PRIVATE_THREAD
        # A thread we have not seen (e.g. unarchived): ask discord.py's channel cache.
        channel = self.client.get_channel(int(cid)) if self.client and cid.isdigit() else None
        if isinstance(channel, discord.Thread) and channel.parent_id:
            kind = channel.type.value
            if state is not None:
                state.threads[cid] = (str(channel.parent_id), kind)
            return {cid: str(channel.parent_id)}, kind == _PRIVATE_THREAD
        return (state.parents() if state is not None else {}), False

    async def _learn_author(self, guild_id: str | None, d: Mapping[str, Any]) -> None:
        """A member not known yet (no start-up chunks): their message carries their roles."""
        state = self.guilds.get(guild_id or "")
        member = member_from_message(d)
        if state is None or member is None or member["user"]["id"] in state.members:
            return
        uid = state.put_member(member)
        self.stats["member_learned"] += 1
        await self._reconcile(state, users=[uid])

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

    async def _handle_burst(self, burst: list[tuple[str, Any]]) -> None:
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

    # ---- roster -------------------------------------------------------------------------

    def _scope(self, guild_id: str, channel: str) -> Scope:
        return Scope(platform=tr.PLATFORM, workspace=guild_id, channel=channel)

    async def _record_channel(self, state: GuildState, cid: str) -> None:
        if cid in state.channels and state.channels[cid].type != _CATEGORY:
            await self.engine.store.channels.set_meta(
                self._scope(state.guild_id, cid),
                name=state.names.get(cid),
                is_private=state.is_private(cid),
            )

    async def _reconcile(
        self,
        state: GuildState,
        *,
        channels: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
        leaves: bool = True,
    ) -> None:
        """Bring the store's roster of `channels` × `users` (default all) to who can read."""
        if users is None:  # a role, overwrite or guild change: any cached answer may be stale
            self.permissions.invalidate_guild(state.guild_id)
        else:
            for uid in users:
                self.permissions.invalidate_member(state.guild_id, uid)
            users = list(users)
        granted = self.granted.setdefault(state.guild_id, {})
        targets = list(channels) if channels is not None else state.text_channels()
        only = set(users) if users is not None else None
        for cid in targets:
            have = granted.setdefault(cid, set())
            pool = only if only is not None else set(state.members) | have
            want = {u for u in pool if u in state.members and state.can_read(u, cid)}
            current = have & pool
            scope = self._scope(state.guild_id, cid)
            for uid in sorted(want - current):
                info = state.members[uid]
                await self.dispatcher.handle(
                    RosterEvent(
                        scope=scope,
                        action=RosterAction.JOIN,
                        user_id=uid,
                        name=info.name,
                        is_bot=info.is_bot,
                    )
                )
                have.add(uid)
            if leaves:
                for uid in sorted(current - want):
                    await self.dispatcher.handle(
                        RosterEvent(scope=scope, action=RosterAction.LEAVE, user_id=uid)
                    )
                    have.discard(uid)

    async def _on_guild_create(self, d: dict[str, Any]) -> None:
        if d.get("unavailable"):
            return
        state = GuildState.from_guild_create(d)
        self.guilds[state.guild_id] = state
        granted: dict[str, set[str]] = {}
        for cid in state.text_channels():
            await self._record_channel(state, cid)
            members = await self.engine.members(self._scope(state.guild_id, cid))
            granted[cid] = {m.user_id for m in members}
        self.granted[state.guild_id] = granted
        await self._reconcile(state, leaves=state.complete)
        log.info(
            "discord: guild %s: %d channels, %d/%d members",
            state.guild_id,
            len(state.text_channels()),
            len(state.members),
            state.member_count,
        )

    def _state(self, d: Mapping[str, Any], where: str) -> GuildState | None:
        gid = opt_str(d, "guild_id", where)
        state = self.guilds.get(gid) if gid else None
        if state is None:
            log.debug("%s for unknown guild %s; ignored", where, gid)
        return state

    async def _on_guild_update(self, d: dict[str, Any]) -> None:
        state = self.guilds.get(req_str(d, "id", "discord GUILD_UPDATE"))
        if state is None:
            return
        perms, _ = tr.perms_from_guild_create({**d, "channels": [], "threads": []})
        if not d.get("roles"):
            perms = perms.model_copy(update={"roles": state.perms.roles})
        state.perms = perms
        await self._reconcile(state, leaves=state.complete)

    async def _on_guild_delete(self, d: dict[str, Any]) -> None:
        """Removed from the guild (kicked, or it was deleted): what it held is forgotten.
        ``unavailable: true`` is an outage of the guild, not a deletion: nothing changes."""
        if not d.get("unavailable"):
            gid = req_str(d, "id", "discord GUILD_DELETE")
            self.guilds.pop(gid, None)
            self.granted.pop(gid, None)
            log.info("discord: removed from guild %s", gid)
            await self.deletions.workspace_left(tr.PLATFORM, gid, actor=tr.PLATFORM)

    async def _on_guild_role_create(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord GUILD_ROLE")
        if state is None:
            return
        role = req_dict(d, "role", "discord GUILD_ROLE")
        rid = req_str(role, "id", "discord GUILD_ROLE")
        try:
            bits = int(role.get("permissions", 0))
        except (TypeError, ValueError) as exc:
            raise PayloadError("discord GUILD_ROLE: bad permissions") from exc
        state.perms = state.perms.model_copy(update={"roles": {**state.perms.roles, rid: bits}})
        await self._reconcile(state, leaves=state.complete)

    _on_guild_role_update = _on_guild_role_create

    async def _on_guild_role_delete(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord GUILD_ROLE_DELETE")
        if state is None:
            return
        rid = req_str(d, "role_id", "discord GUILD_ROLE_DELETE")
        roles = {k: v for k, v in state.perms.roles.items() if k != rid}
        state.perms = state.perms.model_copy(update={"roles": roles})
        await self._reconcile(state, leaves=state.complete)

    async def _on_channel_create(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord CHANNEL")
        if state is None:
            return
        cid = state.put_channel(d)
        if cid in state.threads:
            return
        await self._record_channel(state, cid)
        # a category's overwrites do not reach its channels until they are synced (their
        # own CHANNEL_UPDATE arrives then), so only this channel needs recomputing
        if state.channels[cid].type != _CATEGORY:
            await self._reconcile(state, channels=[cid], leaves=state.complete)

    _on_channel_update = _on_channel_create

    async def _on_channel_delete(self, d: dict[str, Any]) -> None:
        """A deleted channel: everything it held is forgotten (its threads' replies are
        stored in it), then it leaves the roster."""
        cid = req_str(d, "id", "discord CHANNEL_DELETE")
        gid = opt_str(d, "guild_id", "discord CHANNEL_DELETE")
        if gid:
            await self.deletions.channel_deleted(self._scope(gid, cid), actor=tr.PLATFORM)
        state = self._state(d, "discord CHANNEL_DELETE")
        if state is None:
            return
        self.permissions.invalidate_guild(state.guild_id)
        state.threads.pop(cid, None)
        if state.channels.pop(cid, None) is None:
            return
        scope = self._scope(state.guild_id, cid)
        for uid in sorted(self.granted.get(state.guild_id, {}).pop(cid, set())):
            await self.dispatcher.handle(
                RosterEvent(scope=scope, action=RosterAction.LEAVE, user_id=uid)
            )

    async def _on_thread_create(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord THREAD")
        if state is not None:
            state.put_channel(d)

    _on_thread_update = _on_thread_create

    async def _on_thread_delete(self, d: dict[str, Any]) -> None:
        """A deleted thread: its replies (stored in its parent channel) are forgotten."""
        where = "discord THREAD_DELETE"
        tid = req_str(d, "id", where)
        gid = opt_str(d, "guild_id", where)
        parent = opt_str(d, "parent_id", where)
        state = self._state(d, where)
        if state is not None:
            known = state.threads.pop(tid, None)
            parent = parent or (known[0] if known else None)
        if gid:
            # without a parent: a thread whose messages were stored as a channel of its own
            scope = self._scope(gid, parent or tid)
            await self.deletions.thread_deleted(scope, tid, actor=tr.PLATFORM)

    async def _on_thread_list_sync(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord THREAD_LIST_SYNC")
        if state is None:
            return
        for th in d.get("threads") or []:
            try:
                state.put_channel(th)
            except PayloadError as exc:
                log.warning("discord: skipped thread in THREAD_LIST_SYNC: %s", exc)

    async def _on_guild_member_add(self, d: dict[str, Any]) -> None:
        event = tr.member_add(d)
        await self.dispatcher.handle(event)  # the user's name, guild-wide
        state = self.guilds.get(event.scope.workspace)
        if state is None:
            return
        if event.user_id not in state.members:
            state.member_count += 1
        state.put_member(d)
        await self._reconcile(state, users=[event.user_id])

    async def _on_guild_member_remove(self, d: dict[str, Any]) -> None:
        event = tr.member_remove(d)
        await self.dispatcher.handle(event)  # leaves every channel of the guild
        state = self.guilds.get(event.scope.workspace)
        if state is None:
            return
        self.permissions.invalidate_member(state.guild_id, event.user_id)
        if state.members.pop(event.user_id, None) is not None:
            state.member_count = max(0, state.member_count - 1)
        for have in self.granted.get(state.guild_id, {}).values():
            have.discard(event.user_id)

    async def _on_guild_member_update(self, d: dict[str, Any]) -> None:
        event = tr.member_update(d)
        state = self.guilds.get(event.scope.workspace)
        before = state.members.get(event.user_id) if state is not None else None
        if event.name and (before is None or before.name != event.name):
            await self.dispatcher.handle(event)  # guild-wide rename (channel "*")
        if state is None:
            return
        if before is None:
            state.member_count += 1
        state.put_member(d)
        await self._reconcile(state, users=[event.user_id])

    async def _on_guild_members_chunk(self, d: dict[str, Any]) -> None:
        state = self._state(d, "discord GUILD_MEMBERS_CHUNK")
        if state is None:
            return
        users: list[str] = []
        for m in d.get("members") or []:
            try:
                users.append(state.put_member(m))
            except PayloadError as exc:
                log.warning("discord: skipped member in chunk: %s", exc)
        await self._reconcile(state, users=users)
        last = d.get("chunk_index") == (d.get("chunk_count") or 1) - 1
        if last and state.complete:
            await self._reconcile(state)  # now leaves are known too

    # ---- lazy member chunks ------------------------------------------------------------

    def _want_members(self, state: GuildState | None) -> None:
        """The first time the bot is used in a guild whose member list is incomplete (no
        start-up chunks), ask the gateway for the rest in the background, so rosters and
        names fill in without making this answer wait. Guilds nobody asks in are never
        chunked, which keeps memory bounded for a bot in thousands of guilds."""
        if state is None or state.complete or state.guild_id in self._chunked:
            return
        if self.client is None or not self.client.intents.members:
            return
        self._chunked.add(state.guild_id)
        task = asyncio.create_task(
            self._request_members(state.guild_id), name=f"speakermem-chunk-{state.guild_id}"
        )
        self._chunk_tasks.add(task)
        task.add_done_callback(self._chunk_tasks.discard)

    async def _request_members(self, guild_id: str) -> None:
        # one guild at a time: the gateway allows a limited number of commands per minute
        async with self._chunk_lock:
            guild = self.client.get_guild(int(guild_id)) if self.client is not None else None
            if guild is None:
                self._chunked.discard(guild_id)
                return
            try:
                # the chunks arrive as GUILD_MEMBERS_CHUNK events (`_on_guild_members_chunk`);
                # discord.py's own member cache is not filled
                await asyncio.wait_for(guild.chunk(cache=False), CHUNK_TIMEOUT_S)
                self.stats["member_chunks_requested"] += 1
            except (TimeoutError, discord.DiscordException) as exc:
                self._chunked.discard(guild_id)  # asked again the next time
                log.warning("discord: member chunks for guild %s failed: %s", guild_id, exc)

    # ---- /recall ------------------------------------------------------------------------

    def _interaction_payload(self, interaction: discord.Interaction) -> dict[str, Any]:
        """The raw INTERACTION_CREATE; rebuilt from the object if it was not stashed."""
        raw = self._interactions.pop(str(interaction.id), None)
        if raw is not None:
            return raw
        self.stats["interaction_rebuilt"] += 1
        user = interaction.user
        channel = interaction.channel
        chan: dict[str, Any] = {"id": str(interaction.channel_id)}
        if channel is not None:
            chan["type"] = channel.type.value
            parent = getattr(channel, "parent_id", None)
            if parent:
                chan["parent_id"] = str(parent)
        member: dict[str, Any] = {
            "user": {"id": str(user.id), "username": user.name, "global_name": user.global_name},
            "nick": getattr(user, "nick", None),
            "roles": [str(r.id) for r in getattr(user, "roles", []) if not r.is_default()],
        }
        return {
            "id": str(interaction.id),
            "type": 2,
            "application_id": str(interaction.application_id),
            "guild_id": str(interaction.guild_id) if interaction.guild_id else None,
            "channel_id": str(interaction.channel_id),
            "channel": chan,
            "member": member,
            "data": interaction.data or {},
        }

    async def _on_recall(self, interaction: discord.Interaction, options: dict[str, Any]) -> None:
        payload = self._interaction_payload(interaction)
        inv = None
        readable: tuple[str, ...] | None = None
        state: GuildState | None = None
        try:
            guild_id = payload.get("guild_id")
            state = self.guilds.get(str(guild_id)) if guild_id else None
            inv = tr.interaction_recall(
                payload, channel_parent=state.parents() if state is not None else None
            )
            if inv is not None:
                readable = self._readable_now(payload, inv.user_id, inv.scope.channel, state)
        except PayloadError as exc:
            log.warning("discord: malformed /recall interaction: %s", exc)
            inv = None  # permissions that cannot be read are no permission (fail closed)
        self._want_members(state)
        # The answer is private when the asker cannot read here (nothing to leak, but
        # nothing to show the channel either) or when the operator wants it so.
        refused = inv is None or (readable is not None and inv.scope.channel not in readable)
        ephemeral = self.settings.recall_ephemeral or refused
        await interaction.response.defer(ephemeral=ephemeral, thinking=True)
        if inv is None:
            answer = RecallAnswer(text="Sorry, I could not read that command.", refused=True)
        else:
            if readable is not None:
                inv = inv.model_copy(update={"readable_channels": readable})
            answer = await self.dispatcher.recall(inv)
        question = inv.text if inv is not None else None
        embed = render_embed(
            answer, question=question, channel_names=state.names if state is not None else None
        )
        await interaction.followup.send(embed=discord.Embed.from_dict(embed), ephemeral=ephemeral)
        self.stats["recall_answered"] += 1

    @staticmethod
    def _member(payload: Mapping[str, Any]) -> dict[str, Any]:
        raw = payload.get("member")
        return raw if isinstance(raw, dict) else {}

    def _readable_now(
        self, payload: Mapping[str, Any], user_id: str, here: str, state: GuildState | None
    ) -> tuple[str, ...]:
        """Channels the invoker can read at this moment (fail closed).

        The member's roles in this very interaction against the guild's current roles
        and overwrites, never the store's roster; and Discord's own computed permissions
        for the invoking channel (``member.permissions``) must agree. A guild whose
        permissions are not known yet gives nothing.
        """
        if state is None:
            return ()
        readable = self.permissions.readable(state, user_id, tr.member_roles(self._member(payload)))
        bits = tr.member_channel_permissions(payload)
        if bits is not None and bits & tr.READ_CHANNEL != tr.READ_CHANNEL:
            readable = tuple(c for c in readable if c != here)
        return readable

    def _is_admin(self, payload: Mapping[str, Any], user_id: str) -> bool:
        """Owner, Administrator or Manage Server from the member's roles in this interaction
        and the guild's role permissions as the gateway last sent them; unknown → no."""
        guild_id = payload.get("guild_id")
        state = self.guilds.get(str(guild_id)) if guild_id else None
        if state is None:
            return False
        return tr.is_guild_admin(tr.member_roles(self._member(payload)), user_id, state.perms)

    # ---- /memory --------------------------------------------------------------------------

    async def _on_memory(self, interaction: discord.Interaction, options: dict[str, Any]) -> None:
        """`/memory …` and `/memory-admin …`: one text line for the dispatcher; ephemeral."""
        payload = self._interaction_payload(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        subcommand = "memory"
        try:
            group, line = memory_line(req_dict(payload, "data", "discord /memory"))
            subcommand = line.split(" ", 1)[0]
            guild_id = payload.get("guild_id")
            state = self.guilds.get(str(guild_id)) if guild_id else None
            self._want_members(state)
            inv = tr.interaction_invocation(
                payload,
                command=MEMORY.name,
                text=line,
                options={"group": group},
                channel_parent=state.parents() if state is not None else None,
            )
            if inv is None:
                reply = CommandReply(text="Memory commands work in a server.", refused=True)
            else:
                inv = inv.model_copy(
                    update={
                        "is_admin": self._is_admin(payload, inv.user_id),
                        "readable_channels": self._readable_now(
                            payload, inv.user_id, inv.scope.channel, state
                        ),
                    }
                )
                reply = await self.dispatcher.memory_command(inv)
        except PayloadError as exc:
            log.warning("discord: malformed /memory interaction: %s", exc)
            reply = CommandReply(text="Sorry, I could not read that command.", refused=True)
        except Exception:
            self.stats["command_errors"] += 1
            log.exception("discord: /memory failed")
            reply = CommandReply(
                text="Sorry, something went wrong with that command. Please try again.",
                refused=True,
            )
        await self._send_reply(interaction, payload, reply, subcommand)
        self.stats["memory_refused" if reply.refused else "memory_answered"] += 1

    @staticmethod
    def _attachment_limit(payload: Mapping[str, Any]) -> int:
        limit = payload.get("attachment_size_limit")
        return limit if isinstance(limit, int) and limit > 0 else 8 * 1024 * 1024

    @staticmethod
    def _confirm_view(prompt: ConfirmPrompt) -> discord.ui.View:
        """Confirm/Cancel buttons whose custom_ids carry the token; clicks are handled in
        `_on_component` (by custom_id, so they work whatever discord.py's view store holds)."""
        view = discord.ui.View(timeout=None)
        view.add_item(
            discord.ui.Button(
                label=prompt.confirm_label[:80],
                style=discord.ButtonStyle.danger,
                custom_id=confirm_custom_id(prompt.token, accept=True),
            )
        )
        view.add_item(
            discord.ui.Button(
                label=prompt.cancel_label[:80],
                style=discord.ButtonStyle.secondary,
                custom_id=confirm_custom_id(prompt.token, accept=False),
            )
        )
        return view

    async def _send_reply(
        self,
        interaction: discord.Interaction,
        payload: Mapping[str, Any],
        reply: CommandReply,
        subcommand: str,
    ) -> None:
        """A follow-up (the response was deferred), always ephemeral, pinging nobody."""
        text = reply.text
        if reply.confirm is not None and reply.confirm.summary not in text:
            text = f"{text}\n{reply.confirm.summary}"
        content, attachment = reply_parts(
            text,
            reply.data,
            subcommand=subcommand,
            attachment_limit=self._attachment_limit(payload),
        )
        kwargs: dict[str, Any] = {
            "content": content,
            "ephemeral": True,
            "allowed_mentions": discord.AllowedMentions.none(),
        }
        if reply.confirm is not None:
            kwargs["view"] = self._confirm_view(reply.confirm)
        if attachment is not None:
            kwargs["file"] = discord.File(io.BytesIO(attachment[1]), filename=attachment[0])
        try:
            await interaction.followup.send(**kwargs)
        except discord.HTTPException as exc:
            self.stats["reply_failed"] += 1
            log.warning("discord: could not send the /memory reply (%s)", exc)

    async def _on_component(self, interaction: discord.Interaction) -> None:
        """A Confirm/Cancel click: admin rights and identity are checked again, now."""
        payload = self._interactions.pop(str(interaction.id), None)
        if payload is None:
            self.stats["interaction_rebuilt"] += 1
            roles = getattr(interaction.user, "roles", [])
            payload = {
                "type": 3,
                "guild_id": str(interaction.guild_id) if interaction.guild_id else None,
                "member": {
                    "user": {"id": str(interaction.user.id)},
                    "roles": [str(r.id) for r in roles if not r.is_default()],
                },
                "data": interaction.data or {},
            }
        try:
            parsed = parse_confirm_custom_id(payload)
        except PayloadError:
            parsed = None
        if parsed is None:
            return  # not one of our buttons
        token, accept = parsed
        user_id = str(interaction.user.id)
        try:
            reply = await self.dispatcher.confirm(
                token, user_id=user_id, is_admin=self._is_admin(payload, user_id), accept=accept
            )
        except Exception:
            self.stats["command_errors"] += 1
            log.exception("discord: confirmation failed")
            reply = CommandReply(
                text="Sorry, something went wrong. Please try again.", refused=True
            )
        content, attachment = reply_parts(
            reply.text,
            reply.data,
            subcommand="confirm",
            attachment_limit=self._attachment_limit(payload),
        )
        none = discord.AllowedMentions.none()
        try:
            if reply.refused:
                # leave the buttons to whoever asked; say why to whoever clicked
                await interaction.response.send_message(
                    content, ephemeral=True, allowed_mentions=none
                )
            else:
                await interaction.response.edit_message(
                    content=content, view=None, allowed_mentions=none
                )
                if attachment is not None:
                    await interaction.followup.send(
                        file=discord.File(io.BytesIO(attachment[1]), filename=attachment[0]),
                        ephemeral=True,
                    )
        except discord.HTTPException as exc:
            self.stats["reply_failed"] += 1
            log.warning("discord: could not answer a confirmation click (%s)", exc)
        self.stats["confirm_refused" if reply.refused else "confirm_done"] += 1

    async def notify(self, scope: Scope, text: str) -> None:
        """Post a normal message in a channel (the one-time "I remember this channel" notice)."""
        if self.client is None:
            raise RuntimeError("the Discord client is not running")
        channel = self.client.get_partial_messageable(
            int(scope.channel), guild_id=int(scope.workspace)
        )
        await channel.send(text, allowed_mentions=discord.AllowedMentions.none())

    async def _on_tree_error(
        self, interaction: discord.Interaction, error: app_commands.AppCommandError
    ) -> None:
        log.error("discord: /%s failed", getattr(interaction.command, "name", "?"), exc_info=error)
        self.stats["command_errors"] += 1
        text = "Sorry, something went wrong while recalling. Please try again."
        with contextlib.suppress(discord.HTTPException):
            if interaction.response.is_done():
                await interaction.followup.send(text, ephemeral=True)
            else:
                await interaction.response.send_message(text, ephemeral=True)
