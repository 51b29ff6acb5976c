"""Who is in each Slack channel, kept current: on Slack the roster is the permission.

Slack has no "who can read this channel" in its events, so a channel's members are fetched
(``conversations.members``, names from the paged ``users.list`` directory of
`roster_sync`) the first time the channel is seen, kept live from member events, re-fetched
after a TTL, and re-checked before a ``/recall`` answers there (`SlackRoster.ensure`).
Readable channels for ``/recall`` are then the store's default: the channels whose roster
holds the asker. Channel privacy comes from events' ``channel_type`` and
``conversations.info``; display names from a cache in front of ``users.info``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.events import Event, MessageEvent, RosterAction, RosterEvent, Scope
from speakermem.integrations.slack.errors import brief
from speakermem.integrations.slack.roster_sync import SlackDirectory, sync_channel_roster
from speakermem.integrations.slack.translate import display_name
from speakermem.memory.engine import MemoryEngine

__all__ = ["SlackRoster", "TTLCache"]

log = logging.getLogger(__name__)

LOOKUP_ERRORS = (TimeoutError, SlackApiError, SlackClientError, OSError)
"""What a Web API read may raise that means "Slack would not say now"."""


class TTLCache:
    """A small LRU with per-entry expiry (user names, permalinks, roster sync times)."""

    def __init__(self, ttl_s: float, max_items: int = 50_000) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._items: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def get(self, key: Any, max_age_s: float | None = None) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        stored_at, value = item
        age = time.monotonic() - stored_at
        if age > (self.ttl_s if max_age_s is None else min(self.ttl_s, max_age_s)):
            return None
        self._items.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self._items[key] = (time.monotonic(), value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def pop(self, key: Any) -> None:
        self._items.pop(key, None)


class SlackRoster:
    """Channel rosters, privacy and user names for one Slack app (see the module)."""

    def __init__(
        self,
        client: AsyncWebClient,
        engine: MemoryEngine,
        stats: Counter[str],
        lookups: asyncio.Semaphore,
        *,
        roster_ttl_s: float,
        roster_retry_s: float,
        user_ttl_s: float,
    ) -> None:
        self.client = client
        self.engine = engine
        self.stats = stats
        self.lookups = lookups
        """Bounds the Web API reads in flight (shared with the command handlers)."""
        self._synced = TTLCache(roster_ttl_s)
        self._sync_failed = TTLCache(roster_retry_s)
        self._sync_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users = TTLCache(user_ttl_s)
        self.directory = SlackDirectory(client, ttl_s=roster_ttl_s, retry_s=roster_retry_s)
        """The workspace's users from paged users.list (integrations.slack.roster_sync)."""
        self._users_missing = TTLCache(roster_retry_s)
        self._locales = TTLCache(user_ttl_s)
        """A user's locale ("ja-JP") from users.info, or "" when Slack gave none."""
        self._user_lookups: dict[tuple[str, str], asyncio.Future[tuple[str, bool] | None]] = {}
        self._privacy: dict[tuple[str, str], bool] = {}
        """Channel privacy as last written to the store (from events' channel_type)."""

    # ---- rosters ----------------------------------------------------------------------------

    async def ensure(
        self, scope: Scope, *, force: bool = False, max_age_s: float | None = None
    ) -> bool:
        """Make sure `scope`'s roster was fetched recently; False when Slack would not say."""
        key = (scope.workspace, scope.channel)
        if not force and self._synced.get(key, max_age_s) is not None:
            return True
        if not force and self._sync_failed.get(key) is not None:
            return False
        lock = self._sync_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not force and self._synced.get(key, max_age_s) is not None:
                return True
            try:
                await self._sync(scope)
            except LOOKUP_ERRORS as exc:
                self.stats["roster_sync_failed"] += 1
                self._sync_failed.put(key, True)
                log.warning(
                    "roster sync for slack channel %s failed (%s)", scope.channel, brief(exc)
                )
                return False
            self._synced.put(key, True)
            self._sync_failed.pop(key)
            return True

    async def _sync(self, scope: Scope) -> None:
        """Everyone Slack lists joins (names from the paged users.list directory), everyone
        the store has who is gone leaves: one roster write, no users.info per member."""
        outcome = await sync_channel_roster(
            self.engine, self.directory, scope, user_info=self.user_info
        )
        await self._channel_meta(scope)
        self.stats["roster_synced"] += 1
        log.debug("slack roster synced for %s: %d members", scope.channel, outcome.members)

    async def _channel_meta(self, scope: Scope) -> None:
        try:
            info = await self.client.conversations_info(channel=scope.channel)
        except SlackApiError as exc:
            log.debug("conversations.info for %s failed (%s)", scope.channel, brief(exc))
            return
        channel = info.get("channel") or {}
        if not isinstance(channel, Mapping):
            return
        name = channel.get("name") if isinstance(channel.get("name"), str) else None
        private = channel.get("is_private")
        if channel.get("is_im") or channel.get("is_mpim"):
            private = True
        await self.engine.set_channel_meta(
            scope, name=name, is_private=private if isinstance(private, bool) else None
        )
        if isinstance(private, bool):
            self._privacy[(scope.workspace, scope.channel)] = private

    async def note_privacy(self, event: Event, private: bool | None) -> None:
        """Record what the event's channel_type says about privacy (only when it changes)."""
        if private is None or event.scope.channel == "*":
            return
        key = (event.scope.workspace, event.scope.channel)
        if self._privacy.get(key) is private:
            return
        try:
            await self.engine.set_channel_meta(event.scope, name=None, is_private=private)
        except Exception as exc:  # the store default (private) still holds
            log.warning("could not record slack channel privacy (%s)", brief(exc))
            return
        self._privacy[key] = private

    # ---- names ------------------------------------------------------------------------------

    async def user_info(self, team: str, user_id: str) -> tuple[str, bool] | None:
        """(display name, is_bot) from cache or ``users.info``; one call per user at a time."""
        key = (team, user_id)
        cached = self._users.get(key) or self.directory.get(team, user_id)
        if cached is not None:
            return cached
        if self._users_missing.get(key) is not None:
            return None  # users.info failed recently: do not ask again for every message
        pending = self._user_lookups.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[tuple[str, bool] | None] = asyncio.get_running_loop().create_future()
        self._user_lookups[key] = future
        result: tuple[str, bool] | None = None
        try:
            async with self.lookups:
                resp = await self.client.users_info(user=user_id)
            user = resp.get("user")
            if isinstance(user, Mapping):
                name = display_name(user) or user_id
                result = (name, bool(user.get("is_bot")))
                self._users.put(key, result)
        except LOOKUP_ERRORS as exc:
            self._users_missing.put(key, True)
            log.debug("users.info failed for a slack user (%s)", brief(exc))
        finally:
            self._user_lookups.pop(key, None)
            future.set_result(result)
        return result

    async def user_locale(self, team: str, user_id: str) -> str | None:
        """The user's Slack locale ("ja-JP"), for the extractive answer's language: slash
        commands do not carry it, so ``users.info`` is asked with ``include_locale`` once per
        user (cached). None when Slack does not say or cannot be asked."""
        key = (team, user_id)
        cached = self._locales.get(key)
        if cached is not None:
            return cached or None
        locale = ""
        try:
            async with self.lookups:
                resp = await self.client.users_info(user=user_id, include_locale=True)
            user = resp.get("user")
            if isinstance(user, Mapping) and isinstance(user.get("locale"), str):
                locale = user["locale"][:35]
        except LOOKUP_ERRORS as exc:
            log.debug("users.info (locale) failed for a slack user (%s)", brief(exc))
        self._locales.put(key, locale)
        return locale or None

    def known_names(self, body: Mapping[str, Any]) -> dict[str, str]:
        """Cached display names for the user ids a body mentions (no API calls)."""
        event = body.get("event") if isinstance(body.get("event"), Mapping) else body
        team = body.get("team_id")
        out: dict[str, str] = {}
        if not isinstance(event, Mapping) or not isinstance(team, str):
            return out
        uid = event.get("user")
        if isinstance(uid, str):
            cached = self._users.get((team, uid))
            if cached:
                out[uid] = cached[0]
        return out

    # ---- events -----------------------------------------------------------------------------

    async def enrich(self, event: Event, bot_user_id: str | None) -> Event:
        """Sync the channel's roster on first sight and fill in names the payload lacked."""
        if isinstance(event, MessageEvent):
            if event.speaker_is_bot:
                return event
            await self.ensure(event.scope)
            if event.speaker_name == event.speaker_id:
                info = await self.user_info(event.scope.workspace, event.speaker_id)
                if info is not None:
                    return event.model_copy(update={"speaker_name": info[0]})
            return event
        if isinstance(event, RosterEvent) and event.action in (
            RosterAction.JOIN,
            RosterAction.LEAVE,
        ):
            if event.scope.channel == "*":
                return event
            # the bot itself joining: the roster it could not see before is now readable
            bot_joined = event.action is RosterAction.JOIN and event.user_id == bot_user_id
            await self.ensure(event.scope, force=bot_joined)
            if event.action is RosterAction.JOIN and not event.name:
                info = await self.user_info(event.scope.workspace, event.user_id)
                if info is not None:
                    return event.model_copy(update={"name": info[0], "is_bot": info[1]})
        return event

    def applied(self, event: RosterEvent, bot_user_id: str | None) -> None:
        """Keep the caches in step with a roster event the dispatcher applied."""
        key = (event.scope.workspace, event.user_id)
        if event.action is RosterAction.RENAME and event.name:
            self._users.put(key, (event.name, event.is_bot))
            self.directory.put(event.scope.workspace, event.user_id, event.name, event.is_bot)
        if event.action is RosterAction.LEAVE and event.user_id == bot_user_id:
            # without the bot in the channel its roster can no longer be checked
            self._synced.pop((event.scope.workspace, event.scope.channel))
