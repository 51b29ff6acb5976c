"""The Slack adapter: slack-bolt (async) in front of the platform-neutral dispatcher.

Why it is shaped like this:

- Ack first. Events are acked before any work, and `/recall` is acked with a short
  "Searching memory…" before the recall runs, so Slack's 3-second deadline never depends
  on the store or an LLM; the answer goes to ``response_url`` via ``respond()``.
- Payloads stay pure: `integrations.slack.translate` turns dicts into events, and the
  dispatcher is the one error funnel that writes them (one transaction each). A malformed
  payload is acked, logged without its text, and skipped.
- Slack has no "who can read this channel" in its events, so the roster (store) is the
  permission: a channel's members are fetched (``conversations.members``) the first time the
  channel is seen, kept live from member events, re-fetched after a TTL, and re-checked before
  a `/recall` answers there. Readable channels for `/recall` are then the store's default:
  the channels whose roster holds the asker.
- HTTP mode verifies the signature on the raw bytes before anything decodes them, so a signed
  body that is not UTF-8 is acked and dropped instead of crashing the request handler.
- Catch-up (integrations.slack.history): where every channel stands is noted before the app
  listens or connects; once started, what was posted meanwhile is fetched from
  ``conversations.history``/``replies`` in a background task, through the same dispatcher
  (a message already stored is a duplicate, not a second row). Socket Mode does not replay
  events sent while its socket was down, so every reconnect (a second ``hello``) starts
  another pass. Progress goes to the log and, through the saved cursors, to ``status``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

import aiohttp
from aiohttp import WSMessage, web
from pydantic import SecretStr
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.middleware.authorization.async_single_team_authorization import (
    AsyncSingleTeamAuthorization,
)
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot.commands import MEMORY, RECALL
from bot.dispatch import Dispatcher
from bot.events import Event, MessageEvent, RosterAction, RosterEvent, Scope
from bot.governance import CommandReply
from bot.inflight import InFlight
from bot.reconcile import Reconciler
from bot.settings import Settings
from integrations.slack.history import SlackCatchUp, SlackHistory
from integrations.slack.reconcile import SlackHistoryCheck
from integrations.slack.render import (
    CANCEL_ACTION,
    CONFIRM_ACTION,
    escape,
    fallback_text,
    render_blocks,
    reply_blocks,
)
from integrations.slack.roster_sync import SlackDirectory, sync_channel_roster
from integrations.slack.translate import (
    PLATFORM,
    PayloadError,
    channel_privacy,
    deleted_channel,
    display_name,
    translate_command,
    translate_event,
)
from memory.engine import MemoryEngine
from memory.governance.deletions import PlatformDeletions
from memory.query.answer import RecallAnswer
from memory.query.links import default_link

__all__ = ["ACK_TEXT", "SlackAdapter", "SlackConfigError"]

log = logging.getLogger(__name__)

ACK_TEXT = "Searching memory…"
MAX_SKEW_S = 60 * 5
"""Slack's replay window for signed requests."""
MAX_BODY_BYTES = 2 * 1024 * 1024
_MEMBER_EVENTS = ("member_joined_channel", "member_left_channel")
_ANY_EVENT = re.compile(r".*")

Respond = Callable[..., Awaitable[Any]]


class SlackConfigError(ValueError):
    """A setting the chosen Slack mode needs is missing."""


def _secret(value: SecretStr | None, env: str) -> str:
    raw = value.get_secret_value() if value is not None else ""
    if not raw:
        raise SlackConfigError(f"{env} is not set")
    return raw


def _brief(exc: BaseException) -> str:
    """An error for the log: its type and a bounded message (payload errors name fields)."""
    text = str(exc).replace("\n", " ")
    return f"{type(exc).__name__}: {text[:160]}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class _TTLCache:
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


class SlackAdapter:
    """Serve one Slack app (HTTP Events API or Socket Mode) into the dispatcher."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        *,
        mode: Literal["http", "socket"] | None = None,
        process_before_response: bool = False,
        roster_ttl_s: float = 6 * 3600.0,
        recall_roster_max_age_s: float = 300.0,
        roster_retry_s: float = 60.0,
        user_ttl_s: float = 3600.0,
        lookup_concurrency: int = 4,
        rate_limit_retries: int = 3,
        drain_timeout_s: float = 30.0,
        catch_up: bool = True,
        catchup_page_size: int = 200,
        thread_lookback_s: float = 24 * 3600.0,
    ) -> None:
        """`process_before_response=True` finishes the work before the HTTP 200 (tests, FaaS);
        the default acks first and works after, which is what Slack's 3 s deadline wants.
        `catch_up=False` skips history catch-up (start and Socket Mode reconnects)."""
        self.settings = settings
        self.dispatcher = dispatcher
        self.engine = engine
        self.mode = mode or settings.slack_mode
        bot_token = _secret(settings.slack_bot_token, "SPEAKERMEM_SLACK_BOT_TOKEN")
        if self.mode == "http":
            self._signing_secret = _secret(
                settings.slack_signing_secret, "SPEAKERMEM_SLACK_SIGNING_SECRET"
            ).encode()
        else:
            self._signing_secret = b""
            _secret(settings.slack_app_token, "SPEAKERMEM_SLACK_APP_TOKEN")

        self.client = AsyncWebClient(token=bot_token, base_url=settings.slack_api_url)
        self.client.retry_handlers.append(
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries)
        )
        self.app = AsyncApp(
            client=self.client,
            signing_secret=self._signing_secret.decode() or None,
            process_before_response=process_before_response,
            request_verification_enabled=self.mode == "http",
            logger=logging.getLogger("slack_bolt.speakermem"),
        )
        self.app.command(f"/{RECALL.name}")(self._on_recall)
        self.app.command(f"/{MEMORY.name}")(self._on_memory)
        self.app.action(CONFIRM_ACTION)(self._on_confirm_action)
        self.app.action(CANCEL_ACTION)(self._on_confirm_action)
        self.dispatcher.set_notifier(PLATFORM, self.notify)
        self.app.event(_ANY_EVENT)(self._on_event)
        self.app.error(self._on_bolt_error)

        self.roster_ttl_s = roster_ttl_s
        self.recall_roster_max_age_s = recall_roster_max_age_s
        self.roster_retry_s = roster_retry_s
        self._synced = _TTLCache(roster_ttl_s)
        self._sync_failed = _TTLCache(roster_retry_s)
        self._sync_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users = _TTLCache(user_ttl_s)
        self.directory = SlackDirectory(self.client, ttl_s=roster_ttl_s, retry_s=roster_retry_s)
        """The workspace's users from paged users.list (integrations.slack.roster_sync)."""
        self._users_missing = _TTLCache(roster_retry_s)
        self._user_lookups: dict[tuple[str, str], asyncio.Future[tuple[str, bool] | None]] = {}
        self._permalinks = _TTLCache(24 * 3600.0)
        self._privacy: dict[tuple[str, str], bool] = {}
        """Channel privacy as last written to the store (from events' channel_type)."""
        self._lookups = asyncio.Semaphore(lookup_concurrency)
        self.stats: Counter[str] = Counter()
        self.inflight = InFlight("slack")
        """Listener tasks bolt started after the ack; `stop()` waits for them."""
        self.drain_timeout_s = drain_timeout_s

        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self.port: int | None = None
        """The bound HTTP port (useful with SPEAKERMEM_SLACK_HTTP_PORT=0)."""
        self.catch_up = catch_up
        self.catchup_page_size = catchup_page_size
        self.thread_lookback_s = thread_lookback_s
        self.catchup: SlackCatchUp | None = None
        """History catch-up at start and after Socket Mode reconnects (slack/history.py)."""
        self.deletions = PlatformDeletions(dispatcher.governance)
        """Forgets deleted channels, and what reconciliation finds deleted (bot/reconcile.py)."""
        self._hellos = 0

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Check the token (``auth.test``: also who the bot is), then serve or connect."""
        # One HTTP session for every Web API call: without it slack_sdk opens (and closes) a
        # session and a connection per call, a permalink lookup per cited message included.
        self.client.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.client.timeout)
        )
        try:
            await self._start()
        except BaseException:
            await self.client.session.close()
            raise

    async def _start(self) -> None:
        auth = await self.client.auth_test()
        self.bot_user_id = auth.get("user_id")
        self.bot_id = auth.get("bot_id")
        # Hand the result to bolt's single-team authorization, which otherwise calls auth.test
        # once per request until its first call returns (a burst at start-up = a burst of calls).
        for middleware in getattr(self.app, "_async_middleware_list", []):
            if isinstance(middleware, AsyncSingleTeamAuthorization):
                middleware.auth_test_result = auth
        if self.catch_up:
            team = auth.get("team_id")
            self.catchup = SlackCatchUp(
                self.dispatcher,
                self.engine.cursors,
                SlackHistory(
                    self.client,
                    names=self.user_info,
                    before_channel=self.ensure_roster,
                    page_size=self.catchup_page_size,
                    thread_lookback_s=self.thread_lookback_s,
                ),
                workspace=team if isinstance(team, str) and team else None,
                on_page=lambda _prog, n: self.stats.update(catchup_messages=n),
                reconcile=self._reconciler(),
            )
            await self.catchup.before_connect()  # before any live event can move it
        if self.mode == "socket":
            app_token = _secret(self.settings.slack_app_token, "SPEAKERMEM_SLACK_APP_TOKEN")
            self._socket = AsyncSocketModeHandler(self.app, app_token=app_token)
            self._hellos = 0
            self._socket.client.on_message_listeners.append(self._on_socket_message)  # type: ignore[attr-defined]
            await self._socket.connect_async()
            log.info("slack adapter connected (socket mode)")
            if self.catchup is not None:
                self.catchup.begin()
            return
        web_app = web.Application(client_max_size=MAX_BODY_BYTES)
        web_app.router.add_post(self.settings.slack_http_path, self._http)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.slack_http_host, self.settings.slack_http_port
        )
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.slack_http_port
        log.info(
            "slack adapter listening on %s:%s%s",
            self.settings.slack_http_host,
            self.port,
            self.settings.slack_http_path,
        )
        if self.catchup is not None:
            self.catchup.begin()

    def _reconciler(self) -> Reconciler | None:
        """Reconciliation after each catch-up pass, unless SPEAKERMEM_RECONCILE_LOOKBACK_S=0.
        Its reads use a client without the SDK's rate-limit retries: a Retry-After is waited
        out only within the run's budget (integrations/slack/reconcile.py)."""
        if self.settings.reconcile_lookback_s <= 0:
            return None
        client = AsyncWebClient(
            token=self.client.token, base_url=self.client.base_url, session=self.client.session
        )
        return Reconciler(
            self.deletions,
            self.engine.cursors,
            SlackHistoryCheck(client, page_size=self.catchup_page_size),
            lookback_s=self.settings.reconcile_lookback_s,
            budget_s=self.settings.reconcile_budget_s,
        )

    async def _on_socket_message(self, message: WSMessage) -> None:
        """Every Socket Mode text frame, read before the next: a ``hello`` after the first
        one is a new session after a lost one, so catch up (never raises into the SDK)."""
        try:
            data = message.data
            if not isinstance(data, str) or '"hello"' not in data:
                return
            if json.loads(data).get("type") != "hello":
                return
            self._hellos += 1
            if self._hellos > 1 and self.catchup is not None:
                self.stats["socket_reconnects"] += 1
                await self.catchup.on_reconnect()
        except Exception as exc:
            log.warning("slack socket message listener failed (%s)", _brief(exc))

    def catchup_lines(self) -> list[str]:
        """Catch-up progress of this run: "#eng caught up to 14:02, 1,240 messages"."""
        return self.catchup.lines() if self.catchup is not None else []

    async def stop(self) -> None:
        """Stop taking requests, then let acked work finish (bounded) before the store closes."""
        if self.catchup is not None:
            await self.catchup.stop()  # cursors are saved per page: the next start resumes
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        left = await self.inflight.drain(self.drain_timeout_s)
        if left:
            self.stats["drain_cancelled"] += left
        if self.client.session is not None:
            await self.client.session.close()

    async def connected(self) -> bool:
        """For /healthz: HTTP mode is up while it listens; Socket Mode while its session is."""
        if self._socket is not None:
            return bool(await self._socket.client.is_connected())
        return self._runner is not None

    @property
    def url(self) -> str:
        """Where the Events API / slash commands are served (HTTP mode, after start())."""
        host = self.settings.slack_http_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}{self.settings.slack_http_path}"

    # ---- HTTP ---------------------------------------------------------------------------

    def _signature_ok(self, raw: bytes, headers: Mapping[str, str]) -> bool:
        stamp = headers.get("X-Slack-Request-Timestamp", "")
        signature = headers.get("X-Slack-Signature", "")
        if not stamp.isdigit() or abs(time.time() - int(stamp)) > MAX_SKEW_S:
            return False
        if not stamp.isascii() or not signature.isascii():
            return False  # compare_digest raises on non-ASCII str; a forged header is a 401
        base = b"v0:" + stamp.encode() + b":" + raw
        expected = "v0=" + hmac.new(self._signing_secret, base, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), signature.encode())

    async def _http(self, request: web.Request) -> web.Response:
        """Verify on raw bytes, drop undecodable bodies, then hand the request to bolt."""
        raw = await request.read()
        if not self._signature_ok(raw, request.headers):
            self.stats["bad_signature"] += 1
            log.warning("slack request with a bad or stale signature rejected")
            return web.Response(status=401)
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.stats["malformed"] += 1
            log.warning("signed slack request body is not valid UTF-8; acked and skipped")
            return web.Response(status=200)
        try:
            bolt_req = AsyncBoltRequest(
                body=body,
                query=request.query_string,
                headers=request.headers,  # type: ignore[arg-type]
            )
        except ValueError as exc:  # bolt parses JSON/form bodies eagerly
            self.stats["malformed"] += 1
            log.warning("signed slack request body unparsable; acked and skipped (%s)", _brief(exc))
            return web.Response(status=200)
        resp = await self.app.async_dispatch(bolt_req)
        if resp.status == 404 and bolt_req.body.get("type") == "event_callback":
            # an event no listener matches (no "type"): ack it, or Slack redelivers it
            self.stats["malformed"] += 1
            log.warning("slack event without a usable type; acked and skipped")
            resp = BoltResponse(status=200, body="")
        return await to_aiohttp_response(resp)

    async def _on_bolt_error(self, error: Exception, request: AsyncBoltRequest) -> BoltResponse:
        """Bolt's own middleware can choke on odd payloads (an ``event`` that is not an
        object): log it briefly and ack, so Slack does not redeliver it three times."""
        self.stats["malformed"] += 1
        log.warning("slack payload bolt could not process; acked and skipped (%s)", _brief(error))
        return BoltResponse(status=200, body="")

    # ---- events -------------------------------------------------------------------------

    async def _on_event(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        with self.inflight.track():
            await ack()
            await self.handle_event_body(body)

    async def handle_event_body(self, body: Mapping[str, Any]) -> Event | None:
        """Translate one Events API body and apply it; never raises. Returns what was applied."""
        try:
            gone = deleted_channel(body)
            event = translate_event(body, user_names=self._known_names(body)) if not gone else None
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack event skipped (%s)", _brief(exc))
            return None
        except Exception as exc:  # the translator is pure; anything else is still a bad payload
            self.stats["malformed"] += 1
            log.warning("unreadable slack event skipped (%s)", _brief(exc))
            return None
        if gone is not None:
            await self._channel_deleted(gone)
            return None
        if event is None:
            self.stats["ignored"] += 1
            return None
        if isinstance(event, MessageEvent) and event.speaker_id in (self.bot_user_id, self.bot_id):
            # bolt drops self events already; this also covers its middleware being off
            self.stats["ignored"] += 1
            return None
        await self._note_privacy(event, channel_privacy(body))
        try:
            event = await self._enrich(event)
        except Exception as exc:  # enrichment is best effort; the event still goes in
            log.warning("slack roster/name lookup failed (%s)", _brief(exc))
        if isinstance(event, MessageEvent):
            # many events arrive as concurrent requests: one transaction for those that
            # arrive while the previous batch is written, not one each
            await self.dispatcher.handle_grouped(event)
        else:
            await self.dispatcher.handle(event)
        self.stats[f"event_{type(event).__name__}"] += 1
        if isinstance(event, RosterEvent):
            self._after_roster_event(event)
        return event

    async def _channel_deleted(self, scope: Scope) -> None:
        """A channel deleted on Slack: everything it held is forgotten, with an audit entry."""
        try:
            await self.deletions.channel_deleted(scope, actor=PLATFORM)
        except Exception:
            self.stats["errors"] += 1
            log.exception("forgetting the deleted slack channel %s failed", scope.channel)
            return
        self.stats["channel_deleted"] += 1

    async def _note_privacy(self, event: Event, private: bool | None) -> None:
        """Record what the event's channel_type says about privacy (only when it changes)."""
        if private is None or event.scope.channel == "*":
            return
        key = (event.scope.workspace, event.scope.channel)
        if self._privacy.get(key) is private:
            return
        try:
            await self.engine.store.channels.set_meta(event.scope, name=None, is_private=private)
        except Exception as exc:  # the store default (private) still holds
            log.warning("could not record slack channel privacy (%s)", _brief(exc))
            return
        self._privacy[key] = private

    def _known_names(self, body: Mapping[str, Any]) -> dict[str, str]:
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

    async def _enrich(self, event: Event) -> Event:
        """Sync the channel's roster on first sight and fill in names the payload lacked."""
        if isinstance(event, MessageEvent):
            if event.speaker_is_bot:
                return event
            await self.ensure_roster(event.scope)
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
            bot_joined = event.action is RosterAction.JOIN and event.user_id == self.bot_user_id
            await self.ensure_roster(event.scope, force=bot_joined)
            if event.action is RosterAction.JOIN and not event.name:
                info = await self.user_info(event.scope.workspace, event.user_id)
                if info is not None:
                    return event.model_copy(update={"name": info[0], "is_bot": info[1]})
        return event

    def _after_roster_event(self, event: RosterEvent) -> None:
        key = (event.scope.workspace, event.user_id)
        if event.action is RosterAction.RENAME and event.name:
            self._users.put(key, (event.name, event.is_bot))
            self.directory.put(event.scope.workspace, event.user_id, event.name, event.is_bot)
        if event.action is RosterAction.LEAVE and event.user_id == self.bot_user_id:
            # without the bot in the channel its roster can no longer be checked
            self._synced.pop((event.scope.workspace, event.scope.channel))

    # ---- roster -------------------------------------------------------------------------

    async def ensure_roster(
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
                await self._sync_roster(scope)
            except (TimeoutError, SlackApiError, SlackClientError, OSError) as exc:
                self.stats["roster_sync_failed"] += 1
                self._sync_failed.put(key, True)
                log.warning(
                    "roster sync for slack channel %s failed (%s)", scope.channel, _brief(exc)
                )
                return False
            self._synced.put(key, True)
            self._sync_failed.pop(key)
            return True

    async def _channel_meta(self, scope: Scope) -> None:
        try:
            info = await self.client.conversations_info(channel=scope.channel)
        except SlackApiError as exc:
            log.debug("conversations.info for %s failed (%s)", scope.channel, _brief(exc))
            return
        channel = info.get("channel") or {}
        if not isinstance(channel, Mapping):
            return
        name = channel.get("name") if isinstance(channel.get("name"), str) else None
        private = channel.get("is_private")
        if channel.get("is_im") or channel.get("is_mpim"):
            private = True
        await self.engine.store.channels.set_meta(
            scope, name=name, is_private=private if isinstance(private, bool) else None
        )
        if isinstance(private, bool):
            self._privacy[(scope.workspace, scope.channel)] = private

    async def _sync_roster(self, scope: Scope) -> None:
        """Everyone Slack lists joins (names from the paged users.list directory), everyone
        the store has who is gone leaves: one roster write, no users.info per member."""
        outcome = await sync_channel_roster(
            self.engine, self.directory, scope, user_info=self.user_info
        )
        await self._channel_meta(scope)
        self.stats["roster_synced"] += 1
        log.debug("slack roster synced for %s: %d members", scope.channel, outcome.members)

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
            async with self._lookups:
                resp = await self.client.users_info(user=user_id)
            user = resp.get("user")
            if isinstance(user, Mapping):
                name = display_name(user) or user_id
                result = (name, bool(user.get("is_bot")))
                self._users.put(key, result)
        except (TimeoutError, SlackApiError, SlackClientError, OSError) as exc:
            self._users_missing.put(key, True)
            log.debug("users.info failed for a slack user (%s)", _brief(exc))
        finally:
            self._user_lookups.pop(key, None)
            future.set_result(result)
        return result

    # ---- /recall ------------------------------------------------------------------------

    async def _on_recall(
        self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any], respond: Respond
    ) -> None:
        with self.inflight.track():
            await ack(ACK_TEXT)
            await self.answer_recall(command, respond)

    async def answer_recall(self, command: Mapping[str, Any], respond: Respond) -> None:
        """Run /recall after the ack and post Block Kit to response_url; never raises."""
        try:
            inv = translate_command(command)
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack slash command skipped (%s)", _brief(exc))
            await self._respond(
                respond,
                RecallAnswer(text="Sorry, I could not read that command.", refused=True),
                {},
            )
            return
        try:
            refusal = await self.check_access(inv.scope)
            answer = refusal or await self.dispatcher.recall(inv)
            links = {} if answer.refused else await self.permalinks(answer)
        except Exception:
            self.stats["recall_failed"] += 1
            log.exception("slack /recall failed in %s", inv.scope)
            answer = RecallAnswer(
                text="Sorry, something went wrong while recalling. Please try again.",
                refused=True,
            )
            links = {}
        self.stats["recall_refused" if answer.refused else "recall_answered"] += 1
        await self._respond(respond, answer, links)

    async def check_access(self, scope: Scope) -> RecallAnswer | None:
        """Make the roster the asker is checked against current; a refusal if it cannot be.

        Slack events do not say who can read a channel, so the roster is the permission.
        A private channel (or one whose privacy is unknown) is re-listed now, at every
        question, so someone who left a second ago is already out; if Slack will not list
        it, the stale roster is not trusted and the answer is a refusal. A public channel
        is re-listed when its roster is older than `recall_roster_max_age_s`.
        """
        if not await self.engine.store.channels.is_private(scope):
            await self.ensure_roster(scope, max_age_s=self.recall_roster_max_age_s)
            return None
        if await self.ensure_roster(scope, force=True):
            return None
        self.stats["recall_roster_unavailable"] += 1
        return RecallAnswer(
            text=(
                "Sorry: I cannot check who is in this private channel right now (Slack did "
                "not list its members), so I will not recall anything from it. Please try "
                "again in a minute."
            ),
            refused=True,
        )

    async def _respond(self, respond: Respond, answer: RecallAnswer, links: dict[int, str]) -> None:
        ephemeral = answer.refused or self.settings.recall_ephemeral
        try:
            await respond(
                text=fallback_text(answer),
                blocks=render_blocks(answer, links),
                response_type="ephemeral" if ephemeral else "in_channel",
                replace_original=False,
                unfurl_links=False,
                unfurl_media=False,
            )
        except Exception as exc:
            self.stats["respond_failed"] += 1
            log.warning("could not post the /recall answer to response_url (%s)", _brief(exc))

    async def permalinks(self, answer: RecallAnswer) -> dict[int, str]:
        """``chat.getPermalink`` for each citation (cached); the derivable link on failure."""

        async def one(c: Any) -> tuple[int, str | None]:
            key = (c.scope.workspace, c.scope.channel, c.message_id)
            cached = self._permalinks.get(key)
            if cached is not None:
                return c.n, cached
            if c.scope.platform == PLATFORM:
                try:
                    async with self._lookups:
                        resp = await self.client.chat_getPermalink(
                            channel=c.scope.channel, message_ts=c.message_id
                        )
                    link = resp.get("permalink")
                    if isinstance(link, str) and link:
                        self._permalinks.put(key, link)
                        return c.n, link
                except (TimeoutError, SlackApiError, SlackClientError, OSError) as exc:
                    log.debug("chat.getPermalink failed (%s)", _brief(exc))
            return c.n, c.link or default_link(c.scope, c.message_id)

        pairs: Iterable[tuple[int, str | None]] = await asyncio.gather(
            *(one(c) for c in answer.citations)
        )
        return {n: link for n, link in pairs if link}

    # ---- /memory ------------------------------------------------------------------------

    async def is_admin(self, team: str, user_id: str) -> bool:
        """Workspace admin, owner or primary owner per ``users.info`` now (never cached), or
        listed in SPEAKERMEM_SLACK_ADMIN_USERS. Any failure means no (fail closed)."""
        if user_id in self.settings.slack_admin_ids:
            return True
        try:
            async with self._lookups:
                resp = await self.client.users_info(user=user_id)
        except (TimeoutError, SlackApiError, SlackClientError, OSError) as exc:
            self.stats["admin_check_failed"] += 1
            log.warning("users.info failed; treating the user as no admin (%s)", _brief(exc))
            return False
        user = resp.get("user")
        if not isinstance(user, Mapping) or user.get("deleted"):
            return False
        if user.get("team_id") not in (None, team):
            return False  # a guest from another workspace (Slack Connect) is no admin here
        return any(user.get(k) is True for k in ("is_admin", "is_owner", "is_primary_owner"))

    async def _on_memory(
        self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any], respond: Respond
    ) -> None:
        with self.inflight.track():
            await ack()
            await self.answer_memory(command, respond)

    async def answer_memory(self, command: Mapping[str, Any], respond: Respond) -> None:
        """Run `/memory …` after the ack; the reply is always ephemeral; never raises."""
        try:
            inv = translate_command(command)
            inv = inv.model_copy(
                update={"is_admin": await self.is_admin(inv.scope.workspace, inv.user_id)}
            )
            reply = await self.dispatcher.memory_command(inv)
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack /memory command skipped (%s)", _brief(exc))
            reply = CommandReply(text="Sorry, I could not read that command.", refused=True)
        except Exception:
            self.stats["memory_failed"] += 1
            log.exception("slack /memory failed")
            reply = CommandReply(
                text="Sorry, something went wrong with that command. Please try again.",
                refused=True,
            )
        self.stats["memory_refused" if reply.refused else "memory_answered"] += 1
        await self._respond_reply(respond, reply, replace_original=False)

    async def _respond_reply(
        self, respond: Respond, reply: CommandReply, *, replace_original: bool
    ) -> None:
        try:
            await respond(
                text=escape(reply.text)[:3000],
                blocks=reply_blocks(reply.text, confirm=reply.confirm, data=reply.data),
                response_type="ephemeral",
                replace_original=replace_original,
                unfurl_links=False,
                unfurl_media=False,
            )
        except Exception as exc:
            self.stats["respond_failed"] += 1
            log.warning("could not post the /memory reply to response_url (%s)", _brief(exc))

    async def _on_confirm_action(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], respond: Respond
    ) -> None:
        """A Confirm/Cancel click: who clicked and their admin rights are checked now."""
        with self.inflight.track():
            await ack()
            await self.answer_confirm(body, respond)

    async def answer_confirm(self, body: Mapping[str, Any], respond: Respond) -> None:
        try:
            user = _mapping(body.get("user"))
            team_obj = _mapping(body.get("team"))
            actions = body.get("actions")
            action = _mapping(actions[0] if isinstance(actions, list) and actions else None)
            user_id, token = user.get("id"), action.get("value")
            team = team_obj.get("id") or user.get("team_id")
            if not (isinstance(user_id, str) and isinstance(token, str) and isinstance(team, str)):
                raise PayloadError("slack block_actions: no user, team or token")
            reply = await self.dispatcher.confirm(
                token,
                user_id=user_id,
                is_admin=await self.is_admin(team, user_id),
                accept=action.get("action_id") == CONFIRM_ACTION,
            )
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack button click skipped (%s)", _brief(exc))
            reply = CommandReply(text="Sorry, I could not read that click.", refused=True)
        except Exception:
            self.stats["memory_failed"] += 1
            log.exception("slack confirmation failed")
            reply = CommandReply(
                text="Sorry, something went wrong. Please try again.", refused=True
            )
        self.stats["confirm_refused" if reply.refused else "confirm_done"] += 1
        # done or cancelled: the buttons are replaced by the outcome; a refusal is a new
        # message so the requester's buttons stay usable
        await self._respond_reply(respond, reply, replace_original=not reply.refused)

    async def notify(self, scope: Scope, text: str) -> None:
        """Post a normal message in a channel (the one-time "I remember this channel" notice)."""
        await self.client.chat_postMessage(
            channel=scope.channel, text=text, unfurl_links=False, unfurl_media=False
        )
