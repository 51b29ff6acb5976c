"""``/recall``, ``/memory`` and the Confirm/Cancel buttons on Slack, after the ack.

The listeners in the adapter ack first (Slack's 3-second deadline); these handlers then do
the work and post to ``response_url`` with ``respond()``, and never raise. Access fails
closed: a private channel's roster is re-listed before ``/recall`` answers there, and admin
rights are read from ``users.info`` at every command and every click, never cached.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import Scope
from speakermem.bot.governance import CommandReply
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.errors import brief
from speakermem.integrations.slack.render import (
    CONFIRM_ACTION,
    escape,
    fallback_text,
    render_blocks,
    reply_blocks,
)
from speakermem.integrations.slack.roster import LOOKUP_ERRORS, SlackRoster, TTLCache
from speakermem.integrations.slack.translate import PLATFORM, PayloadError, translate_command
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.answer import Citation, RecallAnswer
from speakermem.memory.query.links import default_link

__all__ = ["Respond", "SlackInteractions"]

log = logging.getLogger(__name__)

Respond = Callable[..., Awaitable[Any]]

PERMALINK_TTL_S = 24 * 3600.0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class SlackInteractions:
    """The work behind the slash commands and buttons (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        roster: SlackRoster,
        client: AsyncWebClient,
        stats: Counter[str],
        *,
        recall_roster_max_age_s: float,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.engine = engine
        self.roster = roster
        self.client = client
        self.stats = stats
        self.recall_roster_max_age_s = recall_roster_max_age_s
        self._permalinks = TTLCache(PERMALINK_TTL_S)

    # ---- /recall ----------------------------------------------------------------------------

    async def answer_recall(self, command: Mapping[str, Any], respond: Respond) -> None:
        """Run /recall after the ack and post Block Kit to response_url; never raises."""
        try:
            inv = translate_command(command)
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack slash command skipped (%s)", brief(exc))
            await self._respond(
                respond,
                RecallAnswer(text="Sorry, I could not read that command.", refused=True),
                {},
            )
            return
        try:
            refusal = await self.check_access(inv.scope)
            if refusal is None:
                locale = await self.roster.user_locale(inv.scope.workspace, inv.user_id)
                inv = inv.model_copy(update={"locale": locale})
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
        if not await self.engine.channel_is_private(scope):
            await self.roster.ensure(scope, max_age_s=self.recall_roster_max_age_s)
            return None
        if await self.roster.ensure(scope, force=True):
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
        await self._post(
            respond,
            "the /recall answer",
            text=fallback_text(answer),
            blocks=render_blocks(answer, links),
            ephemeral=answer.refused or self.settings.recall_ephemeral,
            replace_original=False,
        )

    async def _post(
        self,
        respond: Respond,
        what: str,
        *,
        text: str,
        blocks: list[dict[str, Any]],
        ephemeral: bool,
        replace_original: bool,
    ) -> None:
        """Post to response_url, never unfurling links; a failure is counted and logged.

        Through the adapter's HTTP session where there is one: Bolt's `respond()` opens a
        session, and so a new connection (a TLS handshake to Slack), for every answer."""
        message: dict[str, Any] = {
            "text": text,
            "blocks": blocks,
            "response_type": "ephemeral" if ephemeral else "in_channel",
            "replace_original": replace_original,
            "unfurl_links": False,
            "unfurl_media": False,
        }
        url = getattr(respond, "response_url", None)
        session = self.client.session
        try:
            if isinstance(url, str) and session is not None and not session.closed:
                webhook = AsyncWebhookClient(
                    url=url,
                    session=session,
                    proxy=getattr(respond, "proxy", None),
                    ssl=getattr(respond, "ssl", None),
                )
                await webhook.send(**message)
            else:
                await respond(**message)
        except Exception as exc:
            self.stats["respond_failed"] += 1
            log.warning("could not post %s to response_url (%s)", what, brief(exc))

    async def permalinks(self, answer: RecallAnswer) -> dict[int, str]:
        """``chat.getPermalink`` for each citation (cached); the derivable link on failure."""

        async def one(c: Citation) -> tuple[int, str | None]:
            key = (c.scope.workspace, c.scope.channel, c.message_id)
            cached = self._permalinks.get(key)
            if cached is not None:
                return c.n, cached
            if c.scope.platform == PLATFORM:
                try:
                    async with self.roster.lookups:
                        resp = await self.client.chat_getPermalink(
                            channel=c.scope.channel, message_ts=c.message_id
                        )
                    link = resp.get("permalink")
                    if isinstance(link, str) and link:
                        self._permalinks.put(key, link)
                        return c.n, link
                except LOOKUP_ERRORS as exc:
                    log.debug("chat.getPermalink failed (%s)", brief(exc))
            return c.n, c.link or default_link(c.scope, c.message_id)

        pairs: Iterable[tuple[int, str | None]] = await asyncio.gather(
            *(one(c) for c in answer.citations)
        )
        return {n: link for n, link in pairs if link}

    # ---- /memory ----------------------------------------------------------------------------

    async def is_admin(self, team: str, user_id: str) -> bool:
        """Workspace admin, owner or primary owner per ``users.info`` now (never cached), or
        listed in SPEAKERMEM_SLACK_ADMIN_USERS. Any failure means no (fail closed)."""
        if user_id in self.settings.slack_admin_ids:
            return True
        try:
            async with self.roster.lookups:
                resp = await self.client.users_info(user=user_id)
        except LOOKUP_ERRORS as exc:
            self.stats["admin_check_failed"] += 1
            log.warning("users.info failed; treating the user as no admin (%s)", brief(exc))
            return False
        user = resp.get("user")
        if not isinstance(user, Mapping) or user.get("deleted"):
            return False
        if user.get("team_id") not in (None, team):
            return False  # a guest from another workspace (Slack Connect) is no admin here
        return any(user.get(k) is True for k in ("is_admin", "is_owner", "is_primary_owner"))

    async def answer_memory(self, command: Mapping[str, Any], respond: Respond) -> None:
        """Run `/memory …` after the ack; the reply is always ephemeral; never raises."""

        async def run() -> CommandReply:
            inv = translate_command(command)
            inv = inv.model_copy(
                update={"is_admin": await self.is_admin(inv.scope.workspace, inv.user_id)}
            )
            return await self.dispatcher.memory_command(inv)

        reply = await self._refusing_on_error(
            run,
            malformed="/memory command",
            unreadable="command",
            failed="/memory",
            sorry="Sorry, something went wrong with that command. Please try again.",
        )
        self.stats["memory_refused" if reply.refused else "memory_answered"] += 1
        await self._respond_reply(respond, reply, replace_original=False)

    async def _refusing_on_error(
        self,
        run: Callable[[], Awaitable[CommandReply]],
        *,
        malformed: str,
        unreadable: str,
        failed: str,
        sorry: str,
    ) -> CommandReply:
        """`run()`'s reply, or a refusal: for a payload it cannot read (counted as malformed)
        or for any other failure (logged with its traceback)."""
        try:
            return await run()
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("malformed slack %s skipped (%s)", malformed, brief(exc))
            return CommandReply(text=f"Sorry, I could not read that {unreadable}.", refused=True)
        except Exception:
            self.stats["memory_failed"] += 1
            log.exception("slack %s failed", failed)
            return CommandReply(text=sorry, refused=True)

    async def _respond_reply(
        self, respond: Respond, reply: CommandReply, *, replace_original: bool
    ) -> None:
        await self._post(
            respond,
            "the /memory reply",
            text=escape(reply.text)[:3000],
            blocks=reply_blocks(reply.text, confirm=reply.confirm, data=reply.data),
            ephemeral=True,
            replace_original=replace_original,
        )

    async def answer_confirm(self, body: Mapping[str, Any], respond: Respond) -> None:
        """A Confirm/Cancel click: who clicked and their admin rights are checked now."""

        async def run() -> CommandReply:
            user = _mapping(body.get("user"))
            team_obj = _mapping(body.get("team"))
            actions = body.get("actions")
            action = _mapping(actions[0] if isinstance(actions, list) and actions else None)
            user_id, token = user.get("id"), action.get("value")
            team = team_obj.get("id") or user.get("team_id")
            if not (isinstance(user_id, str) and isinstance(token, str) and isinstance(team, str)):
                raise PayloadError("slack block_actions: no user, team or token")
            return await self.dispatcher.confirm(
                token,
                user_id=user_id,
                is_admin=await self.is_admin(team, user_id),
                accept=action.get("action_id") == CONFIRM_ACTION,
            )

        reply = await self._refusing_on_error(
            run,
            malformed="button click",
            unreadable="click",
            failed="confirmation",
            sorry="Sorry, something went wrong. Please try again.",
        )
        self.stats["confirm_refused" if reply.refused else "confirm_done"] += 1
        # done or cancelled: the buttons are replaced by the outcome; a refusal is a new
        # message so the requester's buttons stay usable
        await self._respond_reply(respond, reply, replace_original=not reply.refused)
