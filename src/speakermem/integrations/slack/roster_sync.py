"""Slack rosters at scale: one paged, cached workspace directory instead of a call per member.

A channel's roster sync used to ask ``users.info`` once for every member it had no name for:
10,000 calls for a 10,000-member channel, at Tier 4 pacing, and again after every restart.
Here the workspace's users come from ``users.list`` (cursor-paged, up to 1,000 a page, so 10
calls for 10,000 people), kept for `ttl_s` and updated from ``user_change`` / ``team_join``
events; a channel's members come from ``conversations.members`` pages; and the roster is
written in one transaction (`ChannelRepo.sync_members`). ``users.info`` remains only for
the few members a fresh directory does not know (someone who joined a moment ago).

Tier limits: pages are fetched one after another, never in parallel, and a 429 is waited out
for its ``Retry-After`` (the client's retry handler first, then here) before the same page
is asked again, so a large workspace is slow to list, never refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.events import Scope
from speakermem.integrations.slack.translate import display_name
from speakermem.memory.engine import MemoryEngine

log = logging.getLogger(__name__)

USERS_PAGE = 1_000
"""users.list's largest page."""
MEMBERS_PAGE = 1_000
"""conversations.members' largest page."""
MAX_USER_INFO = 50
"""At most this many users.info calls per sync, for members the directory does not know."""

Sleep = Callable[[float], Awaitable[None]]
UserInfo = Callable[[str, str], Awaitable[tuple[str, bool] | None]]


def retry_after_s(exc: SlackApiError, default: float = 1.0) -> float | None:
    """Seconds to wait before asking again, or None when the error is not a rate limit."""
    response = exc.response
    if getattr(response, "status_code", None) != 429:
        return None
    headers = getattr(response, "headers", None) or {}
    raw = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else default
    except (TypeError, ValueError):
        return default


class RateLimitedApi:
    """Web API calls asked again after each 429's Retry-After, counted per method.

    The client's own retry handler may already have waited; this is the loop that makes a
    long, paged listing slow rather than refused. Other errors, and the 429 after
    `max_retries` waits, are raised. Shared by the roster directory and channel history.
    """

    def __init__(
        self, client: AsyncWebClient, *, max_retries: int = 5, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.client = client
        self.max_retries = max_retries
        self._sleep = sleep
        self.calls: Counter[str] = Counter()
        """Calls made, by method (429s included), for stats and the benchmarks."""
        self.waited_s = 0.0
        """Time spent waiting out Retry-After here (after the client's own retries)."""

    async def call(self, method: str, **args: Any) -> Any:
        """One call (``"users.list"``), waiting out up to `max_retries` 429s."""
        for attempt in range(self.max_retries + 1):
            self.calls[method] += 1
            try:
                return await getattr(self.client, method.replace(".", "_"))(**args)
            except SlackApiError as exc:
                wait = retry_after_s(exc)
                if wait is None or attempt == self.max_retries:
                    raise
                self.waited_s += wait
                log.info("slack %s rate-limited; waiting %.1f s (Retry-After)", method, wait)
                await self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


class SlackDirectory:
    """Each workspace's users (id -> display name, is_bot), from paged users.list."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        ttl_s: float = 6 * 3600.0,
        retry_s: float = 60.0,
        max_retries: int = 5,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self.api = RateLimitedApi(client, max_retries=max_retries, sleep=sleep)
        self._users: dict[str, dict[str, tuple[str, bool]]] = {}
        self._loaded_at: dict[str, float] = {}
        self._failed_at: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def fresh(self, team: str) -> bool:
        loaded = self._loaded_at.get(team)
        return loaded is not None and time.monotonic() - loaded < self.ttl_s

    def get(self, team: str, user_id: str) -> tuple[str, bool] | None:
        return self._users.get(team, {}).get(user_id)

    def put(self, team: str, user_id: str, name: str, is_bot: bool) -> None:
        """A user seen in an event (rename, join): keeps the directory current between syncs."""
        self._users.setdefault(team, {})[user_id] = (name, is_bot)

    def size(self, team: str) -> int:
        return len(self._users.get(team, {}))

    async def ensure(self, team: str, *, force: bool = False) -> bool:
        """List the workspace's users unless a recent list is cached; False if Slack refused."""
        if not force and self.fresh(team):
            return True
        failed = self._failed_at.get(team)
        if not force and failed is not None and time.monotonic() - failed < self.retry_s:
            return team in self._users
        lock = self._locks.setdefault(team, asyncio.Lock())
        async with lock:
            if not force and self.fresh(team):
                return True
            try:
                users = await self._list_users()
            except (TimeoutError, SlackApiError, SlackClientError, OSError) as exc:
                self._failed_at[team] = time.monotonic()
                log.warning("users.list failed (%s: %s)", type(exc).__name__, str(exc)[:120])
                return team in self._users
            known = self._users.setdefault(team, {})
            known.update(users)
            self._loaded_at[team] = time.monotonic()
            self._failed_at.pop(team, None)
            return True

    async def _list_users(self) -> dict[str, tuple[str, bool]]:
        out: dict[str, tuple[str, bool]] = {}
        cursor: str | None = None
        while True:
            page = await self.api.call("users.list", limit=USERS_PAGE, cursor=cursor)
            for user in page.get("members") or []:
                if isinstance(user, Mapping) and isinstance(user.get("id"), str):
                    out[user["id"]] = (display_name(user) or user["id"], bool(user.get("is_bot")))
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                return out


@dataclass(frozen=True)
class SyncOutcome:
    members: int
    joined_or_renamed: int
    left: int
    unnamed: int
    """Members whose name neither the directory nor users.info gave (stored as their id)."""


async def channel_members(directory: SlackDirectory, channel: str) -> list[str]:
    """Every member id of a channel, from conversations.members pages."""
    members: list[str] = []
    cursor: str | None = None
    while True:
        page = await directory.api.call(
            "conversations.members", channel=channel, limit=MEMBERS_PAGE, cursor=cursor
        )
        members.extend(m for m in page.get("members") or [] if isinstance(m, str))
        cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
        if not cursor:
            return list(dict.fromkeys(members))


async def sync_channel_roster(
    engine: MemoryEngine,
    directory: SlackDirectory,
    scope: Scope,
    *,
    user_info: UserInfo | None = None,
) -> SyncOutcome:
    """Bring the store's roster of `scope` to Slack's member list, names from the directory."""
    listed = await channel_members(directory, scope.channel)
    await directory.ensure(scope.workspace)
    unknown = [u for u in listed if directory.get(scope.workspace, u) is None]
    if unknown and user_info is not None:
        # a fresh directory misses only brand-new members: ask for a few, never for thousands
        infos = await asyncio.gather(
            *(user_info(scope.workspace, u) for u in unknown[:MAX_USER_INFO])
        )
        for uid, info in zip(unknown, infos, strict=False):
            if info is not None:
                directory.put(scope.workspace, uid, *info)
    entries: list[tuple[str, str | None, bool]] = []
    unnamed = 0
    for uid in listed:
        known = directory.get(scope.workspace, uid)
        if known is None:
            unnamed += 1
        entries.append((uid, known[0], known[1]) if known else (uid, None, False))
    changed, left = await engine.sync_members(scope, entries)
    return SyncOutcome(len(listed), changed, left, unnamed)
