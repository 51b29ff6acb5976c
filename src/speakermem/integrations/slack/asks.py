"""Questions asked where people talk on Slack: a mention of the bot, a direct message.

A mention (``app_mention``) is answered in the thread it was asked in, or in a new thread
under it; asked inside a thread, the question is about that thread first. The asker is
checked as for ``/recall`` (`SlackInteractions.check_access`: the channel's roster,
re-listed now for a private channel, fail closed).

A direct message (``message`` in an ``im``) is answered in the direct message, from every
channel the asker can read, which the answer names. Which channels: the rosters the store
holds for the asker, each made current as for ``/recall`` (a private one re-listed now,
and left out when Slack will not list it, or no longer lists the asker). The direct
message itself is never stored: the translator drops it, and this path never hands it to
the dispatcher's event path.

Refusals (no access, rate limited, memory off) go to the asker only (``chat.postEphemeral``
in a channel). Every answer is escaped Block Kit (`integrations.slack.render`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.asks import NOTHING_READABLE, question_text
from speakermem.bot.commands import RECALL
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import CommandInvocation, Scope
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.errors import brief
from speakermem.integrations.slack.interactions import SlackInteractions
from speakermem.integrations.slack.render import fallback_text, render_blocks
from speakermem.integrations.slack.roster import LOOKUP_ERRORS, SlackRoster
from speakermem.integrations.slack.translate import PLATFORM, WORKSPACE_CHANNEL, SlackAsk, is_direct
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.answer import RecallAnswer

__all__ = ["SlackAsks"]

log = logging.getLogger(__name__)

SORRY = "Sorry, something went wrong while recalling. Please try again."


class SlackAsks:
    """Answers mentions and direct messages (see the module docstring); never raises."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        roster: SlackRoster,
        interactions: SlackInteractions,
        client: AsyncWebClient,
        stats: Counter[str],
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.engine = engine
        self.roster = roster
        self.interactions = interactions
        self.client = client
        self.stats = stats

    async def answer(self, ask: SlackAsk, bot_ids: Iterable[str | None]) -> None:
        """Answer one question where it was asked; failures become a "sorry" reply."""
        kind = "dm" if ask.direct else "mention"
        inv = CommandInvocation(
            scope=Scope(platform=PLATFORM, workspace=ask.team, channel=ask.channel),
            command=RECALL.name,
            user_id=ask.user,
            text=question_text(ask.text, [b for b in bot_ids if b])[:20_000],
            via=kind,
            options={"message_id": ask.ts, "thread_id": ask.thread_ts or ""}
            if not ask.direct
            else {},
        )
        try:
            answer = self.dispatcher.ask_refusal(inv)
            if answer is None:
                answer = await (self._direct(inv) if ask.direct else self._mention(inv))
            links = {} if answer.refused else await self.interactions.permalinks(answer)
        except Exception:
            self.stats[f"{kind}_failed"] += 1
            log.exception("slack %s question failed in %s", kind, inv.scope)
            answer, links = RecallAnswer(text=SORRY, refused=True), {}
        self.stats[f"{kind}_refused" if answer.refused else f"{kind}_answered"] += 1
        await self._post(ask, answer, links)

    async def _mention(self, inv: CommandInvocation) -> RecallAnswer:
        refusal = await self.interactions.check_access(inv.scope)
        return refusal or await self.dispatcher.recall(inv)

    async def _direct(self, inv: CommandInvocation) -> RecallAnswer:
        readable = await self.readable(inv.scope.workspace, inv.user_id)
        if not readable:
            return RecallAnswer(text=NOTHING_READABLE, refused=True)
        return await self.dispatcher.recall(inv.model_copy(update={"readable_scopes": readable}))

    async def readable(self, team: str, user_id: str) -> tuple[Scope, ...]:
        """The channels the asker can read now, by the `/recall` rule (fail closed): the
        store's rosters that hold them, each made current; a private roster Slack will
        not list now is left out."""
        candidates = await self.engine.readable_channels(PLATFORM, team, user_id)
        kept: list[Scope] = []
        for scope in candidates:
            if scope.channel == WORKSPACE_CHANNEL or is_direct({"channel": scope.channel}):
                continue  # the workspace-wide roster, and direct messages, are no channels
            if not await self.engine.channel_is_private(scope):
                await self.roster.ensure(scope, max_age_s=self.interactions.recall_roster_max_age_s)
                kept.append(scope)
            elif await self.roster.ensure(scope, force=True):
                kept.append(scope)
            else:
                self.stats["dm_roster_unavailable"] += 1
        now = set(await self.engine.readable_channels(PLATFORM, team, user_id))
        return tuple(s for s in kept if s in now)

    async def _post(self, ask: SlackAsk, answer: RecallAnswer, links: dict[int, str]) -> None:
        """In the thread (a mention) or the direct message; refusals to the asker only."""
        searched = [s.channel for s in answer.searched] if ask.direct else []
        kwargs: dict[str, Any] = {
            "channel": ask.channel,
            "text": fallback_text(answer),
            "blocks": render_blocks(answer, links, searched=searched),
        }
        if not ask.direct or ask.thread_ts:  # a direct message's thread is answered there too
            kwargs["thread_ts"] = ask.thread_ts or ask.ts
        try:
            if not ask.direct and (answer.refused or self.settings.recall_ephemeral):
                await self.client.chat_postEphemeral(user=ask.user, **kwargs)
            else:
                await self.client.chat_postMessage(**kwargs, unfurl_links=False, unfurl_media=False)
        except LOOKUP_ERRORS as exc:
            self.stats["respond_failed"] += 1
            log.warning("could not post the answer to a slack question (%s)", brief(exc))
