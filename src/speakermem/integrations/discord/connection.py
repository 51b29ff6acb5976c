"""The gateway connection: discord.py's client, where it connects, and the raw intake.

As discord.py's ``gateway.py`` only decodes frames and hands each dispatch on, `Intake`
only queues: every gateway dispatch reaches ``on_socket_raw_receive``
(``enable_debug_events``) as the raw JSON, and the ones we use are queued and handled **in
order** by one worker, so an edit never overtakes the message it edits. Handling (the
adapter) uses the raw payloads and the pure functions in `integrations.discord.translate`,
never discord.py's message cache, so edits and deletes of messages the client never saw
(older than this process, or imported) still reach the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import discord
import yarl

from speakermem.bot.dispatch import GROUP_MAX
from speakermem.bot.settings import Settings
from speakermem.integrations.payload import PayloadError

__all__ = [
    "BURST_MAX",
    "GUILD_EVENTS",
    "HANDLED_EVENTS",
    "IDENTIFY_SPACING_S",
    "MESSAGE_EVENTS",
    "Burst",
    "DiscordStartError",
    "Intake",
    "build_intents",
    "discord_endpoints",
    "discord_token",
    "guard_parsers",
    "make_client",
]

log = logging.getLogger(__name__)

BURST_MAX = GROUP_MAX
"""Most MESSAGE_CREATEs stored in one transaction when they wait in the queue together."""

MESSAGE_EVENTS = frozenset(
    {"MESSAGE_CREATE", "MESSAGE_UPDATE", "MESSAGE_DELETE", "MESSAGE_DELETE_BULK"}
)
GUILD_EVENTS = frozenset(
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
HANDLED_EVENTS = MESSAGE_EVENTS | GUILD_EVENTS
IDENTIFY_SPACING_S = 5.0
"""What discord.py's default ``before_identify_hook`` waits before each IDENTIFY after a
client's first (Discord's identify rate limit): a process running N shards is ready that
much later per extra shard, so `start` waits that much longer than ``ready_timeout``."""
STASHED_INTERACTIONS = 256


class DiscordStartError(RuntimeError):
    """The client could not log in or connect (bad token, missing intents, unreachable)."""


def build_intents() -> discord.Intents:
    """Exactly what the bot needs; members and message_content are privileged."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.members = True
    intents.message_content = True
    intents.dm_messages = True  # questions in a direct message (answered, never stored)
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


def discord_token(settings: Settings) -> str:
    token = settings.discord_token.get_secret_value().strip() if settings.discord_token else ""
    if not token:
        raise ValueError(
            "SPEAKERMEM_DISCORD_TOKEN is not set (the bot token from the Developer "
            "Portal, Bot → Reset Token)"
        )
    return token


def make_client(settings: Settings, *, guild_ready_timeout: float) -> discord.Client:
    """The gateway client for `settings`: one session, or this process's range of shards."""
    options: dict[str, Any] = {
        "intents": build_intents(),
        "enable_debug_events": True,  # raw payloads via on_socket_raw_receive
        "guild_ready_timeout": guild_ready_timeout,
        "max_messages": None,  # we never read discord.py's message cache
        # members are learned lazily (messages, interactions, member events), not as
        # 100 chunk pages per 100,000-member guild before ready (integrations.discord.members)
        "chunk_guilds_at_startup": False,
    }
    shards = settings.discord_shard_count
    if shards:
        # SPEAKERMEM_DISCORD_SHARD_IDS: this process runs only its range of the shards
        # (validated within the count by Settings); None = every shard here.
        ids = settings.discord_shard_ids
        if ids is not None:
            options["shard_ids"] = list(ids)
        return discord.AutoShardedClient(shard_count=shards, **options)
    return discord.Client(**options)


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


Burst = list[tuple[str, Any]]
"""MESSAGE_CREATEs taken from the queue together: (event name, payload) each."""


class Intake:
    """Gateway dispatches we handle, queued in arrival order for one worker (`work`)."""

    def __init__(self, stats: Counter[str]) -> None:
        self.stats = stats
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.processed = 0
        self._progress = asyncio.Condition()
        self.interactions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """Raw INTERACTION_CREATEs by id: the command handlers read them back to run the
        pure translator (bounded: the oldest go first)."""

    def receive(self, msg: Any) -> None:
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
            self.interactions[str(data["id"])] = data
            while len(self.interactions) > STASHED_INTERACTIONS:
                self.interactions.popitem(last=False)
        elif event in HANDLED_EVENTS:
            self.queue.put_nowait((event, data))

    async def work(
        self,
        handle_burst: Callable[[Burst], Awaitable[None]],
        handle: Callable[[str, Any], Awaitable[None]],
    ) -> None:
        """Events in arrival order; a run of MESSAGE_CREATEs already waiting in the queue is
        handed over as one burst (stored in one transaction), so a busy guild does not pay a
        transaction per message. Order holds: a burst never jumps over an edit or a delete.
        A malformed payload is logged and skipped; so is any other failure."""
        carry: tuple[str, Any] | None = None
        while True:
            item = carry if carry is not None else await self.queue.get()
            carry = None
            burst = [item]
            if item[0] == "MESSAGE_CREATE":
                while len(burst) < BURST_MAX and not self.queue.empty():
                    nxt = self.queue.get_nowait()
                    if nxt[0] != "MESSAGE_CREATE":
                        carry = nxt
                        break
                    burst.append(nxt)
            try:
                if item[0] == "MESSAGE_CREATE":
                    await handle_burst(burst)
                else:
                    await handle(*item)
                    self.stats[item[0]] += 1
            except PayloadError as exc:
                self.stats["malformed"] += 1
                log.warning("discord: skipped malformed %s: %s", item[0], exc)
            except Exception:
                self.stats["errors"] += 1
                log.exception("discord: failed to handle %s; skipped", item[0])
            finally:
                for _ in burst:
                    self.queue.task_done()
                async with self._progress:
                    self.processed += len(burst)
                    self._progress.notify_all()

    async def drain(self, window: float, limit: float) -> None:
        """Wait for the queue to empty while it keeps moving (each `window` must apply
        something), up to `limit` in all."""
        deadline = time.monotonic() + limit
        while True:
            before = self.processed
            try:
                await asyncio.wait_for(
                    self.queue.join(), max(0.0, min(window, deadline - time.monotonic()))
                )
                return
            except TimeoutError:
                if self.processed == before or time.monotonic() >= deadline:
                    log.warning(
                        "discord: %d queued event(s) left unapplied on stop; the next start's "
                        "catch-up fetches their messages from channel history",
                        self.queue.qsize(),
                    )
                    return
                log.info("discord: draining, %d event(s) still queued", self.queue.qsize())

    async def wait_processed(self, count: int, within: float = 5.0) -> None:
        """Wait until `count` queued events have been handled (tests, graceful shutdowns)."""
        async with asyncio.timeout(within), self._progress:
            await self._progress.wait_for(lambda: self.processed >= count)
