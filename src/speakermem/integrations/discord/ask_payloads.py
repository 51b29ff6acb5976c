"""Which gateway messages are questions to the bot, as pure functions over MESSAGE_CREATE.

A member asks by mentioning the bot in a server channel or thread, by replying to a
message while mentioning it (Discord puts the replied-to author in ``mentions`` when the
reply pings, so a reply to the bot's own answer asks too), or by a direct message to the
bot (no ``guild_id``). Bots, webhooks and the bot itself never ask. Direct messages are
never events to store (`translate.message_create` drops them); mentions in a server are
also stored as the channel messages they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from speakermem.integrations.discord.translate import ChannelParents, place, user_ids
from speakermem.integrations.payload import PayloadError, check_text, opt_str, req_dict, req_str
from speakermem.memory.models import Scope

__all__ = ["DiscordAsk", "ask_of"]

_ASKING_TYPES = frozenset({0, 19})
"""DEFAULT and REPLY messages; commands, joins and pins ask nothing."""
_FORWARD = 1


class DiscordAsk(BaseModel):
    """A question to the bot found in a MESSAGE_CREATE."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["mention", "reply", "dm"]
    user_id: str
    channel_id: str
    """Where it was posted (a thread's own id, or the direct message channel)."""
    message_id: str
    text: str
    scope: Scope | None = None
    """The server channel (a thread's parent); None for a direct message."""
    thread_id: str | None = None
    roles: tuple[str, ...] | None = None
    """The author's roles as the message reports them (None: not sent)."""
    replied_id: str | None = None
    replied_text: str = ""


def ask_of(
    d: Mapping[str, Any], *, bot_id: str | None, channel_parent: ChannelParents | None
) -> DiscordAsk | None:
    """The question in a MESSAGE_CREATE, or None when it asks the bot nothing."""
    where = "discord MESSAGE_CREATE"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    if d.get("type", 0) not in _ASKING_TYPES or d.get("webhook_id") is not None:
        return None
    author = req_dict(d, "author", where)
    user_id = req_str(author, "id", where)
    if not bot_id or author.get("bot") or user_id == bot_id:
        return None
    message_id = req_str(d, "id", where)
    channel_id = req_str(d, "channel_id", where)
    text = check_text(d.get("content") or "", where)
    guild = opt_str(d, "guild_id", where)
    if guild is None:
        return DiscordAsk(
            kind="dm", user_id=user_id, channel_id=channel_id, message_id=message_id, text=text
        )
    if bot_id not in user_ids(d.get("mentions"), where):
        return None
    scope, thread_id = place(guild, channel_id, channel_parent)
    member = d.get("member")
    roles = member.get("roles") if isinstance(member, Mapping) else None
    replied_id, replied_text = None, ""
    ref = d.get("message_reference")
    if isinstance(ref, Mapping) and ref.get("type", 0) != _FORWARD:
        replied_id = opt_str(ref, "message_id", where)
        referenced = d.get("referenced_message")
        if isinstance(referenced, Mapping) and isinstance(referenced.get("content"), str):
            replied_text = check_text(referenced["content"], where)
    return DiscordAsk(
        kind="reply" if replied_id else "mention",
        user_id=user_id,
        channel_id=channel_id,
        message_id=message_id,
        text=text,
        scope=scope,
        thread_id=thread_id,
        roles=tuple(str(r) for r in roles) if isinstance(roles, list) else None,
        replied_id=replied_id,
        replied_text=replied_text,
    )
