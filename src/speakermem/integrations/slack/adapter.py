"""The Slack adapter: slack-bolt (async) in front of the platform-neutral dispatcher.

Why it is shaped like this:

- Ack first. Events are acked before any work, and `/recall` is acked with a short
  "Searching memory…" before the recall runs, so Slack's 3-second deadline never depends
  on the store or an LLM; the answer goes to ``response_url`` via ``respond()``.
- Payloads stay pure: `integrations.slack.translate` turns dicts into events, and the
  dispatcher is the one error funnel that writes them (one transaction each). A malformed
  payload is acked, logged without its text, and skipped.
- Slack has no "who can read this channel" in its events, so the roster (store) is the
  permission (`integrations.slack.roster`): fetched the first time a channel is seen, kept
  live from member events, re-fetched after a TTL, and re-checked before a `/recall` answers.
- HTTP mode verifies the signature on the raw bytes before anything decodes them
  (`integrations.slack.http_endpoint`); the commands' work after the ack is in
  `integrations.slack.interactions`.
- A mention of the bot, or a direct message to it, is a question, never stored: answered
  in the thread or the direct message (`integrations.slack.asks`).
- Catch-up (integrations.slack.history): where every channel stands is noted before the app
  listens or connects; once started, what was posted meanwhile is fetched from
  ``conversations.history``/``replies`` in a background task, through the same dispatcher
  (a message already stored is a duplicate, not a second row). Socket Mode does not replay
  events sent while its socket was down, so every reconnect (a second ``hello``) starts
  another pass. Progress goes to the log and, through the saved cursors, to ``status``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import aiohttp
from aiohttp import WSMessage
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.middleware.authorization.async_single_team_authorization import (
    AsyncSingleTeamAuthorization,
)
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.commands import MEMORY, RECALL
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import Event, MessageEvent, RosterEvent, Scope
from speakermem.bot.inflight import InFlight
from speakermem.bot.reconcile import Reconciler
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.asks import SlackAsks
from speakermem.integrations.slack.errors import SlackConfigError, brief, required_secret
from speakermem.integrations.slack.history import SlackCatchUp, SlackHistory
from speakermem.integrations.slack.http_endpoint import SlackHttpEndpoint
from speakermem.integrations.slack.interactions import Respond, SlackInteractions
from speakermem.integrations.slack.reconcile import SlackHistoryCheck
from speakermem.integrations.slack.render import CANCEL_ACTION, CONFIRM_ACTION
from speakermem.integrations.slack.roster import SlackRoster
from speakermem.integrations.slack.translate import (
    PLATFORM,
    PayloadError,
    ask_of,
    channel_privacy,
    deleted_channel,
    translate_event,
)
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.deletions import PlatformDeletions

__all__ = ["ACK_TEXT", "SlackAdapter", "SlackConfigError"]

log = logging.getLogger(__name__)

ACK_TEXT = "Searching memory…"
_ANY_EVENT = re.compile(r".*")


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
        bot_token = required_secret(settings.slack_bot_token, "SPEAKERMEM_SLACK_BOT_TOKEN")
        if self.mode == "http":
            signing_secret = required_secret(
                settings.slack_signing_secret, "SPEAKERMEM_SLACK_SIGNING_SECRET"
            ).encode()
        else:
            signing_secret = b""
            required_secret(settings.slack_app_token, "SPEAKERMEM_SLACK_APP_TOKEN")

        self.client = AsyncWebClient(token=bot_token, base_url=settings.slack_api_url)
        self.client.retry_handlers.append(
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries)
        )
        self.app = AsyncApp(
            client=self.client,
            signing_secret=signing_secret.decode() or None,
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

        self.stats: Counter[str] = Counter()
        self.roster = SlackRoster(
            self.client,
            engine,
            self.stats,
            asyncio.Semaphore(lookup_concurrency),
            roster_ttl_s=roster_ttl_s,
            roster_retry_s=roster_retry_s,
            user_ttl_s=user_ttl_s,
        )
        """Channel rosters, privacy and user names (integrations/slack/roster.py)."""
        self.interactions = SlackInteractions(
            settings,
            dispatcher,
            engine,
            self.roster,
            self.client,
            self.stats,
            recall_roster_max_age_s=recall_roster_max_age_s,
        )
        self.asks = SlackAsks(
            settings, dispatcher, engine, self.roster, self.interactions, self.client, self.stats
        )
        """Mentions of the bot and direct messages to it (integrations/slack/asks.py)."""
        self.http = SlackHttpEndpoint(self.app, signing_secret, self.stats)
        self.inflight = InFlight("slack")
        """Listener tasks bolt started after the ack; `stop()` waits for them."""
        self.drain_timeout_s = drain_timeout_s

        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self.catch_up = catch_up
        self.catchup_page_size = catchup_page_size
        self.thread_lookback_s = thread_lookback_s
        self.catchup: SlackCatchUp | None = None
        """History catch-up at start and after Socket Mode reconnects (slack/history.py)."""
        self.deletions = PlatformDeletions(dispatcher.governance)
        """Forgets deleted channels, and what reconciliation finds deleted (bot/reconcile.py)."""
        self._hellos = 0

    @property
    def port(self) -> int | None:
        """The bound HTTP port (useful with SPEAKERMEM_SLACK_HTTP_PORT=0)."""
        return self.http.port

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
                self.engine,
                SlackHistory(
                    self.client,
                    names=self.roster.user_info,
                    before_channel=self.roster.ensure,
                    page_size=self.catchup_page_size,
                    thread_lookback_s=self.thread_lookback_s,
                ),
                workspace=team if isinstance(team, str) and team else None,
                on_page=lambda _prog, n: self.stats.update(catchup_messages=n),
                reconcile=self._reconciler(),
            )
            await self.catchup.before_connect()  # before any live event can move it
        if self.mode == "socket":
            app_token = required_secret(self.settings.slack_app_token, "SPEAKERMEM_SLACK_APP_TOKEN")
            self._socket = AsyncSocketModeHandler(self.app, app_token=app_token)
            self._hellos = 0
            self._socket.client.on_message_listeners.append(self._on_socket_message)  # type: ignore[attr-defined]
            await self._socket.connect_async()
            log.info("slack adapter connected (socket mode)")
        else:
            port = await self.http.serve(
                self.settings.slack_http_host,
                self.settings.slack_http_port,
                self.settings.slack_http_path,
            )
            log.info(
                "slack adapter listening on %s:%s%s",
                self.settings.slack_http_host,
                port,
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
            log.warning("slack socket message listener failed (%s)", brief(exc))

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
        await self.http.close()
        left = await self.inflight.drain(self.drain_timeout_s)
        if left:
            self.stats["drain_cancelled"] += left
        if self.client.session is not None:
            await self.client.session.close()

    async def connected(self) -> bool:
        """For /healthz: HTTP mode is up while it listens; Socket Mode while its session is."""
        if self._socket is not None:
            return bool(await self._socket.client.is_connected())
        return self.http.serving

    @property
    def url(self) -> str:
        """Where the Events API / slash commands are served (HTTP mode, after start())."""
        host = self.settings.slack_http_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}{self.settings.slack_http_path}"

    async def _on_bolt_error(self, error: Exception, request: AsyncBoltRequest) -> BoltResponse:
        """Bolt's own middleware can choke on odd payloads (an ``event`` that is not an
        object): log it briefly and ack, so Slack does not redeliver it three times."""
        self.stats["malformed"] += 1
        log.warning("slack payload bolt could not process; acked and skipped (%s)", brief(error))
        return BoltResponse(status=200, body="")

    async def notify(self, scope: Scope, text: str) -> None:
        """Post a normal message in a channel (the one-time "I remember this channel" notice)."""
        await self.client.chat_postMessage(
            channel=scope.channel, text=text, unfurl_links=False, unfurl_media=False
        )

    # ---- listeners: ack first, then work (tracked, so stop() can wait for it) -----------

    async def _on_event(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        with self.inflight.track():
            await ack()
            await self.handle_event_body(body)

    async def _on_recall(
        self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any], respond: Respond
    ) -> None:
        with self.inflight.track():
            await ack(ACK_TEXT)
            await self.interactions.answer_recall(command, respond)

    async def _on_memory(
        self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any], respond: Respond
    ) -> None:
        with self.inflight.track():
            await ack()
            await self.interactions.answer_memory(command, respond)

    async def _on_confirm_action(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], respond: Respond
    ) -> None:
        """A Confirm/Cancel click: who clicked and their admin rights are checked now."""
        with self.inflight.track():
            await ack()
            await self.interactions.answer_confirm(body, respond)

    # ---- events -------------------------------------------------------------------------

    async def handle_event_body(self, body: Mapping[str, Any]) -> Event | None:
        """Translate one Events API body and apply it; never raises. Returns what was applied.

        A mention of the bot or a direct message to it is a question: answered, never
        applied (`integrations.slack.asks`)."""
        try:
            ask = ask_of(body, bot_user_id=self.bot_user_id, bot_id=self.bot_id)
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack question skipped (%s)", brief(exc))
            return None
        except Exception as exc:
            self.stats["malformed"] += 1
            log.warning("unreadable slack question skipped (%s)", brief(exc))
            return None
        if ask is not None:
            await self.asks.answer(ask, (self.bot_user_id,))
            return None
        try:
            gone = deleted_channel(body)
            event = (
                translate_event(body, user_names=self.roster.known_names(body))
                if not gone
                else None
            )
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack event skipped (%s)", brief(exc))
            return None
        except Exception as exc:  # the translator is pure; anything else is still a bad payload
            self.stats["malformed"] += 1
            log.warning("unreadable slack event skipped (%s)", brief(exc))
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
        await self.roster.note_privacy(event, channel_privacy(body))
        try:
            event = await self.roster.enrich(event, self.bot_user_id)
        except Exception as exc:  # enrichment is best effort; the event still goes in
            log.warning("slack roster/name lookup failed (%s)", brief(exc))
        if isinstance(event, MessageEvent):
            # many events arrive as concurrent requests: one transaction for those that
            # arrive while the previous batch is written, not one each
            await self.dispatcher.handle_grouped(event)
        else:
            await self.dispatcher.handle(event)
        self.stats[f"event_{type(event).__name__}"] += 1
        if isinstance(event, RosterEvent):
            self.roster.applied(event, self.bot_user_id)
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
