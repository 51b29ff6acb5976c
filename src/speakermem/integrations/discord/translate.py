"""Discord gateway payloads → platform-neutral events, as pure functions over dicts.

Each function takes the ``d`` of a gateway dispatch (what discord.py hands to
``on_socket_raw_receive`` / the ``data`` of ``on_raw_*`` events), so the rules are
testable without a client. discord.py is not imported here.

Conventions:

- Scope is ``(discord, guild_id, channel)`` where channel is the parent channel
  for a thread (``thread_id`` = the thread's id) and the channel itself otherwise.
  The adapter supplies `channel_parent` (thread id → parent channel id) from its
  cache; a thread missing from it is treated as a plain channel.
- ``message_id`` is the snowflake string; ``reply_to`` is
  ``message_reference.message_id`` (not for forwards); addressees are the
  mentioned users plus the referenced message's author, never the speaker.
- Guild membership is guild-wide, so member add/remove/update events use the
  channel ``"*"``; which channels a member may read comes from `can_read_channel`.
- Direct messages (no guild) are ignored: the bot remembers group conversations.

Return values: an event; None for payloads deliberately ignored (system message
types, updates without a content change, other commands); PayloadError for
malformed ones.

Who may read a channel is computed in `integrations.discord.permissions`; its names are
re-exported here, so a caller reads a payload's whole meaning from one module.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from speakermem.bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    MessageEvent,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.integrations.discord.permissions import (
    ADMINISTRATOR,
    MANAGE_GUILD,
    READ_CHANNEL,
    READ_MESSAGE_HISTORY,
    THREAD_TYPES,
    VIEW_CHANNEL,
    ChannelPerms,
    GuildPerms,
    Overwrite,
    can_read_channel,
    is_guild_admin,
    member_channel_permissions,
    member_roles,
    perms_from_guild_create,
    readable_channels,
)
from speakermem.integrations.payload import (
    PayloadError,
    build,
    check_text,
    opt_str,
    parse_iso,
    req_dict,
    req_str,
)

__all__ = [
    "ADMINISTRATOR",
    "GUILD_CHANNEL",
    "MANAGE_GUILD",
    "MESSAGE_TYPES",
    "PLATFORM",
    "READ_CHANNEL",
    "READ_MESSAGE_HISTORY",
    "THREAD_TYPES",
    "VIEW_CHANNEL",
    "ChannelPerms",
    "GuildPerms",
    "Overwrite",
    "PayloadError",
    "can_read_channel",
    "display_name",
    "interaction_invocation",
    "interaction_recall",
    "is_guild_admin",
    "member_add",
    "member_channel_permissions",
    "member_remove",
    "member_roles",
    "member_update",
    "message_create",
    "message_delete",
    "message_delete_bulk",
    "message_update",
    "perms_from_guild_create",
    "place",
    "readable_channels",
    "user_ids",
]

log = logging.getLogger(__name__)

PLATFORM = "discord"
GUILD_CHANNEL = "*"
"""Channel value of a scope that means 'the whole guild'."""

MESSAGE_TYPES = frozenset({0, 19, 20, 23})
"""DEFAULT, REPLY, CHAT_INPUT_COMMAND, CONTEXT_MENU_COMMAND: types that carry someone's words."""

_FORWARD = 1  # message_reference.type for a forwarded message (not a reply)

ChannelParents = Mapping[str, str]


def display_name(user: Mapping[str, Any], member: Mapping[str, Any] | None = None) -> str | None:
    """member nick > user global_name > username."""
    for candidate in (
        (member or {}).get("nick"),
        user.get("global_name"),
        user.get("username"),
    ):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()[:256]
    return None


def _guild(d: Mapping[str, Any], guild_id: str | None, where: str) -> str | None:
    return opt_str(d, "guild_id", where) or guild_id


def _place(
    guild: str, channel_id: str, channel_parent: ChannelParents | None
) -> tuple[Scope, str | None]:
    parent = (channel_parent or {}).get(channel_id)
    if parent:
        scope = build(Scope, "discord scope", platform=PLATFORM, workspace=guild, channel=parent)
        return scope, channel_id
    scope = build(Scope, "discord scope", platform=PLATFORM, workspace=guild, channel=channel_id)
    return scope, None


def place(
    guild: str, channel_id: str, channel_parent: ChannelParents | None
) -> tuple[Scope, str | None]:
    """(scope, thread id) of a message posted in `channel_id`: a thread's parent channel
    and the thread, or the channel itself and None."""
    return _place(guild, channel_id, channel_parent)


def user_ids(items: Any, where: str) -> list[str]:
    """The user ids of a ``mentions`` list (user objects or bare ids)."""
    return _user_ids(items, where)


def _user_ids(items: Any, where: str) -> list[str]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise PayloadError(f"{where}: mentions must be a list")
    out: list[str] = []
    for item in items:
        if isinstance(item, Mapping):
            out.append(req_str(item, "id", where))
        elif isinstance(item, str | int) and not isinstance(item, bool):
            out.append(str(item))
        else:
            raise PayloadError(f"{where}: bad mention entry {type(item).__name__}")
    return out


def _message_head(
    d: Mapping[str, Any], guild_id: str | None, where: str
) -> tuple[str, str, str] | None:
    """(message id, channel id, guild id) of a message payload; None outside a guild."""
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    message_id = req_str(d, "id", where)
    channel_id = req_str(d, "channel_id", where)
    guild = _guild(d, guild_id, where)
    if guild is None:
        return None
    return message_id, channel_id, guild


def message_create(
    d: Mapping[str, Any],
    *,
    guild_id: str | None = None,
    channel_parent: ChannelParents | None = None,
) -> MessageEvent | None:
    """MESSAGE_CREATE → MessageEvent; None for DMs and system message types."""
    where = "discord MESSAGE_CREATE"
    head = _message_head(d, guild_id, where)
    if head is None:
        return None
    message_id, channel_id, guild = head
    kind = d.get("type", 0)
    if not isinstance(kind, int) or isinstance(kind, bool):
        raise PayloadError(f"{where}: type must be an integer")
    if kind not in MESSAGE_TYPES:
        log.debug("ignoring discord message type %s", kind)
        return None
    author = req_dict(d, "author", where)
    speaker_id = req_str(author, "id", where)
    member = d.get("member") if isinstance(d.get("member"), Mapping) else None
    text = check_text(d.get("content") if d.get("content") is not None else "", where)
    when = parse_iso(d.get("timestamp"), where)

    reply_to: str | None = None
    addressees = _user_ids(d.get("mentions"), where)
    ref = d.get("message_reference")
    if isinstance(ref, Mapping) and ref.get("type", 0) != _FORWARD:
        reply_to = opt_str(ref, "message_id", where)
        referenced = d.get("referenced_message")
        if isinstance(referenced, Mapping) and isinstance(referenced.get("author"), Mapping):
            ref_author = opt_str(referenced["author"], "id", where)
            if ref_author:
                addressees.append(ref_author)
    addressees = [a for a in dict.fromkeys(addressees) if a != speaker_id]

    scope, thread_id = _place(guild, channel_id, channel_parent)
    return build(
        MessageEvent,
        where,
        scope=scope,
        message_id=message_id,
        speaker_id=speaker_id,
        speaker_name=display_name(author, member) or speaker_id,
        text=text,
        ts=when,
        thread_id=thread_id,
        reply_to=reply_to,
        addressees=tuple(addressees),
        speaker_is_bot=bool(author.get("bot")) or d.get("webhook_id") is not None,
    )


def message_update(
    d: Mapping[str, Any],
    *,
    guild_id: str | None = None,
    channel_parent: ChannelParents | None = None,
    previous_content: str | None = None,
) -> EditEvent | None:
    """MESSAGE_UPDATE → EditEvent when the content changed.

    The raw event may be partial (no author). It counts as an edit only when it
    carries ``content`` and a non-null ``edited_timestamp`` — embed unfurls
    arrive with ``edited_timestamp: null`` — and, when the adapter knows the
    cached `previous_content`, only if the text differs.
    """
    where = "discord MESSAGE_UPDATE"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    message_id = req_str(d, "id", where)
    channel_id = req_str(d, "channel_id", where)
    guild = _guild(d, guild_id, where)
    if guild is None or "content" not in d:
        return None
    text = check_text(d["content"] if d["content"] is not None else "", where)
    edited = d.get("edited_timestamp")
    if edited is None:
        return None
    if previous_content is not None and previous_content == text:
        return None
    scope, _thread = _place(guild, channel_id, channel_parent)
    author = d.get("author")
    return build(
        EditEvent,
        where,
        scope=scope,
        message_id=message_id,
        text=text,
        edited_at=parse_iso(edited, where),
        author_id=opt_str(author, "id", where) if isinstance(author, Mapping) else None,
    )


def message_delete(
    d: Mapping[str, Any],
    *,
    guild_id: str | None = None,
    channel_parent: ChannelParents | None = None,
) -> DeleteEvent | None:
    """MESSAGE_DELETE → DeleteEvent (None in DMs)."""
    where = "discord MESSAGE_DELETE"
    head = _message_head(d, guild_id, where)
    if head is None:
        return None
    message_id, channel_id, guild = head
    scope, _thread = _place(guild, channel_id, channel_parent)
    return build(DeleteEvent, where, scope=scope, message_id=message_id)


def message_delete_bulk(
    d: Mapping[str, Any],
    *,
    guild_id: str | None = None,
    channel_parent: ChannelParents | None = None,
) -> list[DeleteEvent]:
    """MESSAGE_DELETE_BULK → one DeleteEvent per id."""
    where = "discord MESSAGE_DELETE_BULK"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    ids = d.get("ids")
    if not isinstance(ids, list):
        raise PayloadError(f"{where}: field 'ids' must be a list")
    channel_id = req_str(d, "channel_id", where)
    guild = _guild(d, guild_id, where)
    if guild is None:
        return []
    scope, _thread = _place(guild, channel_id, channel_parent)
    return [
        build(DeleteEvent, where, scope=scope, message_id=str(i))
        for i in ids
        if isinstance(i, str | int) and not isinstance(i, bool)
    ]


def _member_event(d: Mapping[str, Any], action: RosterAction, where: str) -> RosterEvent:
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    guild = req_str(d, "guild_id", where)
    user = req_dict(d, "user", where)
    user_id = req_str(user, "id", where)
    fields: dict[str, Any] = {}
    if action == RosterAction.JOIN and d.get("joined_at"):
        fields["at"] = parse_iso(d["joined_at"], where)
    return build(
        RosterEvent,
        where,
        scope=build(Scope, where, platform=PLATFORM, workspace=guild, channel=GUILD_CHANNEL),
        action=action,
        user_id=user_id,
        name=None if action == RosterAction.LEAVE else display_name(user, d),
        is_bot=bool(user.get("bot")),
        **fields,
    )


def member_add(d: Mapping[str, Any]) -> RosterEvent:
    """GUILD_MEMBER_ADD → JOIN in the guild scope (channel "*")."""
    return _member_event(d, RosterAction.JOIN, "discord GUILD_MEMBER_ADD")


def member_remove(d: Mapping[str, Any]) -> RosterEvent:
    """GUILD_MEMBER_REMOVE → LEAVE in the guild scope."""
    return _member_event(d, RosterAction.LEAVE, "discord GUILD_MEMBER_REMOVE")


def member_update(d: Mapping[str, Any]) -> RosterEvent:
    """GUILD_MEMBER_UPDATE → RENAME with the current display name.

    The gateway does not say what changed (roles, avatar, nick…); the roster
    treats a RENAME to the same name as a no-op.
    """
    return _member_event(d, RosterAction.RENAME, "discord GUILD_MEMBER_UPDATE")


def interaction_recall(
    d: Mapping[str, Any], *, channel_parent: ChannelParents | None = None
) -> CommandInvocation | None:
    """INTERACTION_CREATE for the ``/recall`` application command → CommandInvocation.

    None for other interaction types, other commands and DMs. ``question``
    becomes the text; other options are copied into ``options`` as strings, as
    are ``interaction_id``/``application_id`` (the token is left out: the adapter
    answers through discord.py's Interaction object). A thread invocation is
    scoped to the parent channel with ``options["thread_id"]``.
    """
    where = "discord INTERACTION_CREATE"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    if d.get("type") != 2:
        return None
    data = req_dict(d, "data", where)
    if data.get("name") != "recall":
        return None
    text = ""
    options: dict[str, str] = {}
    raw_options = data.get("options") or []
    if not isinstance(raw_options, list):
        raise PayloadError(f"{where}: data.options must be a list")
    for opt in raw_options:
        if not isinstance(opt, Mapping):
            raise PayloadError(f"{where}: bad option entry")
        name = req_str(opt, "name", where)
        value = opt.get("value")
        if value is None:
            continue
        if name == "question":
            text = check_text(value, where) if isinstance(value, str) else str(value)
        else:
            options[name] = str(value)
    return interaction_invocation(
        d, command="recall", text=text, options=options, channel_parent=channel_parent
    )


def interaction_invocation(
    d: Mapping[str, Any],
    *,
    command: str,
    text: str,
    options: Mapping[str, str] | None = None,
    channel_parent: ChannelParents | None = None,
) -> CommandInvocation | None:
    """Any guild interaction (command or button click) → CommandInvocation; None in DMs.

    The invoker, channel and thread come from the payload; `text` and `options` are the
    caller's reading of ``data``. ``interaction_id``/``application_id`` go to options.
    """
    where = "discord INTERACTION_CREATE"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    interaction_id = req_str(d, "id", where)
    guild = opt_str(d, "guild_id", where)
    if guild is None:
        return None
    raw_channel = d.get("channel")
    channel: Mapping[str, Any] = raw_channel if isinstance(raw_channel, Mapping) else {}
    channel_id = opt_str(d, "channel_id", where) or req_str(channel, "id", where)

    raw_member = d.get("member")
    member: Mapping[str, Any] | None = raw_member if isinstance(raw_member, Mapping) else None
    user = req_dict(member, "user", where) if member is not None else req_dict(d, "user", where)
    user_id = req_str(user, "id", where)

    out: dict[str, str] = {"interaction_id": interaction_id, **(options or {})}
    app = opt_str(d, "application_id", where)
    if app:
        out["application_id"] = app
    parent = opt_str(channel, "parent_id", where) if channel.get("type") in THREAD_TYPES else None
    parent = parent or (channel_parent or {}).get(channel_id)
    if parent:
        out["thread_id"] = channel_id
        channel_id = parent
    return build(
        CommandInvocation,
        where,
        scope=build(Scope, where, platform=PLATFORM, workspace=guild, channel=channel_id),
        command=command,
        user_id=user_id,
        user_name=display_name(user, member),
        text=text.strip(),
        options=out,
        locale=opt_str(d, "locale", where),
    )
