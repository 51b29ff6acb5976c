"""Questions asked where people talk on Discord: a mention, a reply that mentions the bot,
a direct message to the bot.

Each is a ``/recall`` (`Dispatcher.recall`) with the same access rule: who may read which
channel comes from the guild's current roles and overwrites (`guild_state`), with the
author's roles as the message reports them, never from the store's roster, and an unknown
guild or member reads nothing (fail closed).

- A mention in a channel or thread is answered as a reply to it; in a thread, the
  thread's messages come first.
- A reply that mentions the bot asks about the message it replies to: that message is
  quoted in the question and comes first, with its thread.
- A direct message is answered from every channel the asker can read in the guilds they
  share with the bot (the channels are named in the answer). It is never stored: the
  translator drops guild-less messages before the dispatcher's event path.

Answers run as tasks of their own, so the gateway's event queue never waits on a recall;
`drain` lets them finish at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import discord

from speakermem.bot.asks import question_text, reply_question
from speakermem.bot.commands import RECALL
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import CommandInvocation, Scope
from speakermem.bot.settings import Settings
from speakermem.integrations.discord.ask_payloads import DiscordAsk, ask_of
from speakermem.integrations.discord.guild_state import GuildRoster
from speakermem.integrations.discord.render import render_embed
from speakermem.integrations.discord.translate import PLATFORM
from speakermem.integrations.payload import PayloadError
from speakermem.memory.query.answer import RecallAnswer

__all__ = ["DM_WORKSPACE", "DiscordAsks"]

log = logging.getLogger(__name__)

DM_WORKSPACE = "@me"
"""The workspace of a direct message's scope (Discord's own name for it); the answer draws
on the guilds' channels, never on this one."""
SORRY = "Sorry, something went wrong while recalling. Please try again."
PRIVATE_HERE = (
    "Answers are private on this server: ask with `/recall`, or pick the message's "
    "Apps → Ask SpeakerMem about this."
)


class DiscordAsks:
    """Answers mentions, replies and direct messages (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        roster: GuildRoster,
        client: Callable[[], discord.Client | None],
        stats: Counter[str],
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.roster = roster
        self.client = client
        self.stats = stats
        self._tasks: set[asyncio.Task[None]] = set()

    def _bot_id(self) -> str | None:
        client = self.client()
        return str(client.user.id) if client is not None and client.user is not None else None

    def on_message(self, d: Mapping[str, Any], parents: Mapping[str, str]) -> bool:
        """Start answering when a MESSAGE_CREATE asks the bot something; whether it did."""
        try:
            ask = ask_of(d, bot_id=self._bot_id(), channel_parent=parents)
        except PayloadError as exc:
            self.stats["malformed"] += 1
            log.warning("discord: skipped a malformed question: %s", exc)
            return False
        except Exception as exc:  # the reading is pure: anything else is a bad payload too
            self.stats["malformed"] += 1
            log.warning("discord: skipped an unreadable question (%s)", type(exc).__name__)
            return False
        if ask is None:
            return False
        task = asyncio.create_task(self.answer(ask), name=f"speakermem-discord-{ask.kind}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def drain(self, within: float) -> None:
        """Let answers being written finish (bounded), then cancel the rest."""
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(set(self._tasks), timeout=within)
        for task in pending:
            task.cancel()
        self.stats["asks_cancelled"] += len(pending)

    # ---- the question ---------------------------------------------------------------------

    def invocation(self, ask: DiscordAsk) -> CommandInvocation:
        """The `/recall` a question is: its channels, its focus, its way in."""
        question = question_text(ask.text, [b for b in (self._bot_id(),) if b])
        if ask.scope is None:
            return CommandInvocation(
                scope=Scope(platform=PLATFORM, workspace=DM_WORKSPACE, channel=ask.channel_id),
                command=RECALL.name,
                user_id=ask.user_id,
                text=question[:20_000],
                via="dm",
                readable_scopes=self.dm_readable(ask.user_id),
            )
        state = self.roster.guilds.get(ask.scope.workspace)
        readable = (
            self.roster.permissions.readable(state, ask.user_id, ask.roles)
            if state is not None
            else ()
        )
        focus = ask.thread_id
        if ask.kind == "reply":
            question, focus = reply_question(question, ask.replied_text), ask.replied_id
        return CommandInvocation(
            scope=ask.scope,
            command=RECALL.name,
            user_id=ask.user_id,
            text=question[:20_000],
            via=ask.kind,
            options={"message_id": ask.message_id, **({"thread_id": focus} if focus else {})},
            readable_channels=readable,
        )

    def dm_readable(self, user_id: str) -> tuple[Scope, ...]:
        """Every channel the asker can read in the guilds they share with the bot, by the
        roles the guild state knows for them (an unknown member reads nothing)."""
        return tuple(
            Scope(platform=PLATFORM, workspace=gid, channel=cid)
            for gid, state in self.roster.guilds.items()
            for cid in self.roster.permissions.readable(state, user_id, None)
        )

    async def answer(self, ask: DiscordAsk) -> None:
        """Answer one question where it was asked; never raises."""
        try:
            inv = self.invocation(ask)
            if ask.scope is not None and self.settings.recall_ephemeral:
                answer = RecallAnswer(text=PRIVATE_HERE, refused=True)
            else:
                answer = self.dispatcher.ask_refusal(inv) or await self.dispatcher.recall(inv)
        except Exception:
            self.stats[f"{ask.kind}_failed"] += 1
            log.exception("discord: a %s question failed", ask.kind)
            answer = RecallAnswer(text=SORRY, refused=True)
        self.stats[f"{ask.kind}_refused" if answer.refused else f"{ask.kind}_answered"] += 1
        await self._post(ask, answer)

    async def _post(self, ask: DiscordAsk, answer: RecallAnswer) -> None:
        """A reply to the question (a server) or a message in the direct message."""
        client = self.client()
        if client is None:
            return
        names: dict[str, str] = {}
        for state in self.roster.guilds.values():
            names.update(state.names)
        embed = render_embed(
            answer,
            channel_names=names,
            searched=[s.channel for s in answer.searched] if ask.scope is None else (),
        )
        guild = int(ask.scope.workspace) if ask.scope is not None else None
        channel = client.get_partial_messageable(int(ask.channel_id), guild_id=guild)
        reference = discord.MessageReference(
            message_id=int(ask.message_id), channel_id=int(ask.channel_id), fail_if_not_exists=False
        )
        try:
            await channel.send(
                embed=discord.Embed.from_dict(embed),
                reference=reference,
                allowed_mentions=discord.AllowedMentions.none(),
                mention_author=False,
            )
        except discord.HTTPException as exc:
            self.stats["reply_failed"] += 1
            log.warning("discord: could not answer a %s question (%s)", ask.kind, exc)
