"""What the bot does when someone uses a command: ``/recall``, ``/memory``, button clicks.

The raw INTERACTION_CREATE (stashed by `connection.Intake`) goes through the pure
translator; who may read what comes from the member's roles in this very interaction and
the guild's current permissions (`guild_state`), never from the store's roster, and fails
closed. ``/recall`` and the message context menu ("Ask SpeakerMem about this", always
ephemeral) are deferred at once, then answered with an embed
(`integrations.discord.render`); ``/memory`` replies are always ephemeral, and its Confirm
and Cancel buttons check admin rights and identity again at the click.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import discord
from discord import app_commands

from speakermem.bot.asks import context_question
from speakermem.bot.commands import MEMORY, RECALL
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.governance import CommandReply, ConfirmPrompt
from speakermem.bot.settings import Settings
from speakermem.integrations.discord import translate as tr
from speakermem.integrations.discord.commands import (
    confirm_custom_id,
    memory_line,
    parse_confirm_custom_id,
    reply_parts,
)
from speakermem.integrations.discord.connection import Intake
from speakermem.integrations.discord.guild_state import GuildRoster, GuildState
from speakermem.integrations.discord.members import LazyMembers
from speakermem.integrations.discord.render import render_embed
from speakermem.integrations.payload import PayloadError, req_dict
from speakermem.memory.query.answer import RecallAnswer

__all__ = ["DEFAULT_ATTACHMENT_LIMIT", "DiscordInteractions", "rebuilt_payload"]

log = logging.getLogger(__name__)

DEFAULT_ATTACHMENT_LIMIT = 8 * 1024 * 1024
"""Bytes a reply may attach when the interaction does not say (Discord's smallest limit)."""


def rebuilt_payload(interaction: discord.Interaction) -> dict[str, Any]:
    """An INTERACTION_CREATE rebuilt from discord.py's object (when the raw one is gone)."""
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


def _member(payload: Mapping[str, Any]) -> dict[str, Any]:
    raw = payload.get("member")
    return raw if isinstance(raw, dict) else {}


def _attachment_limit(payload: Mapping[str, Any]) -> int:
    limit = payload.get("attachment_size_limit")
    return limit if isinstance(limit, int) and limit > 0 else DEFAULT_ATTACHMENT_LIMIT


def _confirm_view(prompt: ConfirmPrompt) -> discord.ui.View:
    """Confirm/Cancel buttons whose custom_ids carry the token; clicks are handled in
    `on_component` (by custom_id, so they work whatever discord.py's view store holds)."""
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


class DiscordInteractions:
    """The command handlers the adapter registers on its tree and for component clicks."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        roster: GuildRoster,
        intake: Intake,
        members: LazyMembers,
        stats: Counter[str],
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.roster = roster
        self.intake = intake
        """Where the raw INTERACTION_CREATEs wait, by id."""
        self.members = members
        self.stats = stats

    def _payload(self, interaction: discord.Interaction) -> dict[str, Any]:
        """The raw INTERACTION_CREATE; rebuilt from the object if it was not stashed."""
        raw = self.intake.interactions.pop(str(interaction.id), None)
        if raw is not None:
            return raw
        self.stats["interaction_rebuilt"] += 1
        return rebuilt_payload(interaction)

    def _guild(self, payload: Mapping[str, Any]) -> GuildState | None:
        guild_id = payload.get("guild_id")
        return self.roster.guilds.get(str(guild_id)) if guild_id else None

    def readable_now(
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
        roles = tr.member_roles(_member(payload))
        readable = self.roster.permissions.readable(state, user_id, roles)
        bits = tr.member_channel_permissions(payload)
        if bits is not None and bits & tr.READ_CHANNEL != tr.READ_CHANNEL:
            readable = tuple(c for c in readable if c != here)
        return readable

    def is_admin(self, payload: Mapping[str, Any], user_id: str) -> bool:
        """Owner, Administrator or Manage Server from the member's roles in this interaction
        and the guild's role permissions as the gateway last sent them; unknown → no."""
        state = self._guild(payload)
        if state is None:
            return False
        return tr.is_guild_admin(tr.member_roles(_member(payload)), user_id, state.perms)

    # ---- /recall ----------------------------------------------------------------------------

    async def on_recall(self, interaction: discord.Interaction, options: dict[str, Any]) -> None:
        payload = self._payload(interaction)
        inv = None
        readable: tuple[str, ...] | None = None
        state: GuildState | None = None
        try:
            state = self._guild(payload)
            inv = tr.interaction_recall(
                payload, channel_parent=state.parents() if state is not None else None
            )
            if inv is not None:
                readable = self.readable_now(payload, inv.user_id, inv.scope.channel, state)
        except PayloadError as exc:
            log.warning("discord: malformed /recall interaction: %s", exc)
            inv = None  # permissions that cannot be read are no permission (fail closed)
        self.members.want(state)
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

    # ---- the message context menu -----------------------------------------------------------

    async def on_ask_about(
        self, interaction: discord.Interaction, message: discord.Message
    ) -> None:
        """The "Ask SpeakerMem about this" menu: what the chosen message is about, answered
        only to the one who asked, by `/recall`'s access rule (the chosen message, and its
        thread, come first)."""
        payload = self._payload(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        state = self._guild(payload)
        answer: RecallAnswer
        try:
            inv = tr.interaction_invocation(
                payload,
                command=RECALL.name,
                text=context_question(message.content or ""),
                channel_parent=state.parents() if state is not None else None,
            )
            if inv is None:
                answer = RecallAnswer(text="Ask about messages in a server.", refused=True)
            else:
                readable = self.readable_now(payload, inv.user_id, inv.scope.channel, state)
                inv = inv.model_copy(
                    update={
                        "via": "context",
                        "readable_channels": readable,
                        "options": {**inv.options, "thread_id": str(message.id)},
                    }
                )
                answer = self.dispatcher.ask_refusal(inv) or await self.dispatcher.recall(inv)
        except PayloadError as exc:
            log.warning("discord: malformed context-menu interaction: %s", exc)
            answer = RecallAnswer(text="Sorry, I could not read that request.", refused=True)
        self.members.want(state)
        embed = render_embed(answer, channel_names=state.names if state is not None else None)
        try:
            await interaction.followup.send(embed=discord.Embed.from_dict(embed), ephemeral=True)
        except discord.HTTPException as exc:
            self.stats["reply_failed"] += 1
            log.warning("discord: could not answer the context menu (%s)", exc)
        self.stats["context_refused" if answer.refused else "context_answered"] += 1

    # ---- /memory ----------------------------------------------------------------------------

    async def on_memory(self, interaction: discord.Interaction, options: dict[str, Any]) -> None:
        """`/memory …` and `/memory-admin …`: one text line for the dispatcher; ephemeral."""
        payload = self._payload(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        subcommand = "memory"
        try:
            group, line = memory_line(req_dict(payload, "data", "discord /memory"))
            subcommand = line.split(" ", 1)[0]
            state = self._guild(payload)
            self.members.want(state)
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
                        "is_admin": self.is_admin(payload, inv.user_id),
                        "readable_channels": self.readable_now(
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
            attachment_limit=_attachment_limit(payload),
        )
        kwargs: dict[str, Any] = {
            "content": content,
            "ephemeral": True,
            "allowed_mentions": discord.AllowedMentions.none(),
        }
        if reply.confirm is not None:
            kwargs["view"] = _confirm_view(reply.confirm)
        if attachment is not None:
            kwargs["file"] = discord.File(io.BytesIO(attachment[1]), filename=attachment[0])
        try:
            await interaction.followup.send(**kwargs)
        except discord.HTTPException as exc:
            self.stats["reply_failed"] += 1
            log.warning("discord: could not send the /memory reply (%s)", exc)

    # ---- buttons ----------------------------------------------------------------------------

    async def on_component(self, interaction: discord.Interaction) -> None:
        """A Confirm/Cancel click: admin rights and identity are checked again, now."""
        payload = self.intake.interactions.pop(str(interaction.id), None)
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
                token, user_id=user_id, is_admin=self.is_admin(payload, user_id), accept=accept
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
            attachment_limit=_attachment_limit(payload),
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

    async def on_tree_error(
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
