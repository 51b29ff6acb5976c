"""Discord at community scale: lazily known members and cached read permissions.

A large guild's member list is not requested at start-up (``chunk_guilds_at_startup`` off):
a guild of 100,000 members would be 100 GUILD_MEMBERS_CHUNK pages before the bot is ready,
and its whole permission matrix (members x channels) computed at once. Members are learned
as they show up instead: a message carries its author's roles (`member_from_message`), an
interaction its asker's, member events the rest.

Who can read which channel is computed per (member, roles) and cached (`PermissionCache`),
because every /recall asks it and the computation walks every channel of the guild. The
cache is dropped for a guild on any role, channel-overwrite or guild change, and for a
member on their own change; it is an LRU, so its memory stays bounded however many members
ask.

The rest of a guild's member list is asked for (`LazyMembers`) the first time the bot is used
there, in the background: guilds nobody asks in are never chunked.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import discord

log = logging.getLogger(__name__)

MAX_CACHED = 20_000
"""Cached (member, roles) answers over all guilds."""

CHUNK_TIMEOUT_S = 120.0
"""How long a lazy member request may take (a 100,000-member guild is 100 chunks)."""


class ReadableState(Protocol):
    """What the cache needs of a guild's state (`integrations.discord.guild_state.GuildState`)."""

    @property
    def guild_id(self) -> str: ...

    def readable(self, uid: str, roles: Iterable[str] | None = None) -> tuple[str, ...]: ...


class PermissionCache:
    """(guild, member, roles) -> readable channel ids, invalidated on permission changes."""

    def __init__(self, max_entries: int = MAX_CACHED) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str, frozenset[str]], tuple[str, ...]] = OrderedDict()
        self._answers: dict[tuple[str, ...], tuple[str, ...]] = {}
        """One copy of each distinct answer: thousands of members with the same roles share
        it (an answer is ~1,000 channel ids in a large guild, 8 KB as a tuple)."""
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def readable(
        self, state: ReadableState, uid: str, roles: Iterable[str] | None
    ) -> tuple[str, ...]:
        """The channels `uid` with `roles` can read (roles None: as the state knows them)."""
        if roles is None:  # the state's own view of the member: not keyed, not cached
            return state.readable(uid)
        key = (state.guild_id, uid, frozenset(roles))
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return found
        self.misses += 1
        value = state.readable(uid, key[2])
        if len(self._answers) >= self.max_entries:
            self._answers.clear()
        value = self._answers.setdefault(value, value)
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def invalidate_guild(self, guild_id: str) -> None:
        """A role, a channel's overwrites or the guild changed: every answer may be wrong."""
        for key in [k for k in self._entries if k[0] == guild_id]:
            del self._entries[key]
        self._answers.clear()

    def invalidate_member(self, guild_id: str, uid: str) -> None:
        for key in [k for k in self._entries if k[0] == guild_id and k[1] == uid]:
            del self._entries[key]


def member_from_message(d: Mapping[str, Any]) -> dict[str, Any] | None:
    """A GUILD_MEMBER-shaped payload from a MESSAGE_CREATE (its `member` lacks `user`)."""
    member, author = d.get("member"), d.get("author")
    if not isinstance(member, Mapping) or not isinstance(author, Mapping):
        return None
    if not isinstance(author.get("id"), str) or author.get("bot"):
        return None
    return {**member, "user": dict(author)}


class GuildMembers(Protocol):
    """What `LazyMembers` needs of a guild's state."""

    @property
    def guild_id(self) -> str: ...

    @property
    def complete(self) -> bool: ...


class LazyMembers:
    """Asks the gateway for a guild's whole member list, once, when the guild is first used."""

    def __init__(self, client: Callable[[], discord.Client | None], stats: Counter[str]) -> None:
        self._client = client
        self.stats = stats
        self._chunked: set[str] = set()
        """Guilds whose full member list was requested."""
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def want(self, state: GuildMembers | None) -> None:
        """The first time the bot is used in a guild whose member list is incomplete (no
        start-up chunks), ask for the rest in the background, so rosters and names fill in
        without making this answer wait. Guilds nobody asks in are never chunked, which
        keeps memory bounded for a bot in thousands of guilds."""
        client = self._client()
        if state is None or state.complete or state.guild_id in self._chunked:
            return
        if client is None or not client.intents.members:
            return
        self._chunked.add(state.guild_id)
        task = asyncio.create_task(
            self._request(state.guild_id), name=f"speakermem-chunk-{state.guild_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, guild_id: str) -> None:
        # one guild at a time: the gateway allows a limited number of commands per minute
        async with self._lock:
            client = self._client()
            guild = client.get_guild(int(guild_id)) if client is not None else None
            if guild is None:
                self._chunked.discard(guild_id)
                return
            try:
                # the chunks arrive as GUILD_MEMBERS_CHUNK events (guild_state.members_chunk);
                # discord.py's own member cache is not filled
                await asyncio.wait_for(guild.chunk(cache=False), CHUNK_TIMEOUT_S)
                self.stats["member_chunks_requested"] += 1
            except (TimeoutError, discord.DiscordException) as exc:
                self._chunked.discard(guild_id)  # asked again the next time
                log.warning("discord: member chunks for guild %s failed: %s", guild_id, exc)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
