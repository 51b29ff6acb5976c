"""Slack payloads → platform-neutral events, as pure functions over dicts.

Kept free of slack-bolt/slack-sdk objects so every rule here is testable with a
literal dict and reused by the export importer.

Conventions (see SPEC §6 and the adapter brief):

- Scope is ``(slack, team_id, channel_id)``; a thread reply keeps its channel and
  sets ``thread_id = reply_to = thread_ts``. A thread's parent keeps
  ``thread_id=None`` because a live parent arrives before any thread exists, and
  the export must produce the same rows as the live feed.
- ``message_id`` is the message ``ts`` string, unchanged (it is also the key for
  edits, deletes and permalinks).
- Addressees: users ``<@U…>``-mentioned in the text, plus the thread parent's
  author (``parent_user_id``) for replies; the speaker is never their own addressee.
- Direct messages (``channel_type: "im"``, or a ``D…`` channel) are never events (None):
  they are questions to the bot (`ask_of`), never stored; group DMs are kept.
- Workspace-wide facts use the channel ``"*"``: ``user_change`` becomes a
  RENAME with scope ``(slack, team, "*")`` and the roster applies it to every
  channel of that team.

Return values: an event; None for payloads we deliberately ignore (unknown
subtypes, joins/leaves carried as messages, edits that do not change the text);
PayloadError for malformed ones (missing/mistyped fields, text over 40,000
characters, text that is not valid UTF-8).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from speakermem.bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    Event,
    MessageEvent,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.integrations.payload import PayloadError, build, check_text, opt_str, req_str
from speakermem.integrations.slack.message_text import compose_text

__all__ = [
    "MESSAGE_SUBTYPES",
    "PLATFORM",
    "WORKSPACE_CHANNEL",
    "PayloadError",
    "SlackAsk",
    "ask_of",
    "channel_privacy",
    "deleted_channel",
    "display_name",
    "is_direct",
    "mentioned_users",
    "message_event",
    "parse_ts",
    "translate_command",
    "translate_event",
]

log = logging.getLogger(__name__)

PLATFORM = "slack"
WORKSPACE_CHANNEL = "*"
"""Channel value of a scope that means 'every channel of this workspace'."""

MESSAGE_SUBTYPES = frozenset({None, "thread_broadcast", "bot_message", "me_message", "file_share"})
"""Message subtypes that carry a person's (or bot's) words; any other subtype is ignored."""

_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_TS = re.compile(r"^\d{1,12}(?:\.\d{1,9})?$")


def parse_ts(value: Any, where: str) -> datetime:
    """A Slack ``ts`` ("1700000000.000100") as aware UTC."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _TS.match(value):
        raise PayloadError(f"{where}: bad Slack timestamp {value!r}")
    return datetime.fromtimestamp(float(value), tz=UTC)


def display_name(user: Mapping[str, Any]) -> str | None:
    """profile.display_name > profile.real_name > real_name > name, from a user object."""
    profile = user.get("profile")
    candidates: list[Any] = []
    if isinstance(profile, Mapping):
        candidates += [profile.get("display_name"), profile.get("real_name")]
    candidates += [user.get("real_name"), user.get("name")]
    for c in candidates:
        if isinstance(c, str) and c.strip():
            return c.strip()[:256]
    return None


def mentioned_users(text: str) -> list[str]:
    """User ids of ``<@U123>`` / ``<@U123|name>`` mentions, in order, without repeats."""
    return list(dict.fromkeys(_MENTION.findall(text)))


def _team(body: Mapping[str, Any], event: Mapping[str, Any], team_id: str | None) -> str:
    for candidate in (
        team_id,
        body.get("team_id"),
        event.get("team"),
        event.get("user_team"),
        event.get("team_id"),
    ):
        if isinstance(candidate, str) and candidate.strip():
            return candidate
    raise PayloadError("slack event: no team id in the payload and none given")


def _scope(team: str, channel: str) -> Scope:
    return build(Scope, "slack scope", platform=PLATFORM, workspace=team, channel=channel)


def _speaker_name(
    msg: Mapping[str, Any],
    speaker_id: str,
    user_names: Mapping[str, str],
    is_bot: bool,
    *,
    app_post: bool = False,
) -> str:
    """The name the workspace knows, else the payload's; for an app's post without a user
    (`app_post`), the name it posted under (``username``, ``bot_profile``) comes first and
    the workspace's name for its bot id (users.json in exports) second."""
    posted: list[Any] = []
    if is_bot:
        profile = msg.get("bot_profile")
        posted = [
            msg.get("username"),
            profile.get("name") if isinstance(profile, Mapping) else None,
        ]
    known = user_names.get(speaker_id)
    candidates = [*posted, known] if app_post else [known, *posted]
    user_profile = msg.get("user_profile")
    if isinstance(user_profile, Mapping):
        candidates.insert(
            1 if not app_post else len(candidates),
            display_name({"profile": user_profile, "name": user_profile.get("name")}),
        )
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()[:256]
    return speaker_id


def _message_text(msg: Mapping[str, Any], where: str, *, from_app: bool = False) -> str:
    text = check_text(msg.get("text", "") if msg.get("text") is not None else "", where)
    return check_text(compose_text(msg, text, from_app=from_app), where)


def message_event(
    msg: Mapping[str, Any],
    *,
    team: str,
    channel: str,
    user_names: Mapping[str, str],
    parent_authors: Mapping[str, str] | None = None,
    user_bots: Collection[str] | None = None,
) -> MessageEvent:
    """One Slack message object (live event or export line) → MessageEvent.

    `parent_authors` maps a thread's ts to its author, for payloads that lack
    ``parent_user_id`` (older exports). `user_bots` (an export's users.json) says which
    user ids are bots: then a message with a ``user`` is a bot's only when that user is
    one, so a person posting through an app (``/giphy``: ``user`` and ``bot_id``) stays a
    person. Without it (the live feed) any ``bot_id`` marks a bot.
    """
    where = f"slack message in {channel}"
    ts = req_str(msg, "ts", where)
    when = parse_ts(ts, where)
    subtype = msg.get("subtype")
    bot_id = opt_str(msg, "bot_id", where)
    user = opt_str(msg, "user", where)
    if user and user_bots is not None:
        is_bot = user in user_bots
    else:
        is_bot = subtype == "bot_message" or bot_id is not None
    speaker_id = user or bot_id
    if not speaker_id:
        raise PayloadError(f"{where}: message {ts} has neither 'user' nor 'bot_id'")
    text = _message_text(msg, where, from_app=is_bot or bot_id is not None)

    thread_ts = opt_str(msg, "thread_ts", where)
    thread_id = reply_to = None
    parent_author: str | None = None
    if thread_ts and thread_ts != ts:
        parse_ts(thread_ts, where)
        thread_id = reply_to = thread_ts
        parent_author = opt_str(msg, "parent_user_id", where) or (parent_authors or {}).get(
            thread_ts
        )
    addressees = [u for u in mentioned_users(text) if u != speaker_id]
    if parent_author and parent_author != speaker_id and parent_author not in addressees:
        addressees.append(parent_author)

    return build(
        MessageEvent,
        where,
        scope=_scope(team, channel),
        message_id=ts,
        speaker_id=speaker_id,
        speaker_name=_speaker_name(
            msg, speaker_id, user_names, is_bot, app_post=is_bot and not user
        ),
        text=text,
        ts=when,
        thread_id=thread_id,
        reply_to=reply_to,
        addressees=tuple(addressees),
        speaker_is_bot=is_bot,
    )


def _event_time(body: Mapping[str, Any], event: Mapping[str, Any]) -> datetime:
    for key in ("event_ts", "ts"):
        value = event.get(key)
        if isinstance(value, str) and _TS.match(value):
            return parse_ts(value, "slack event")
    value = body.get("event_time")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    return datetime.now(UTC)


def _translate_message(
    body: Mapping[str, Any], event: Mapping[str, Any], team_id: str | None, names: Mapping
) -> Event | None:
    where = "slack message event"
    subtype = event.get("subtype")
    if subtype is not None and not isinstance(subtype, str):
        raise PayloadError(f"{where}: subtype must be a string")
    channel = req_str(event, "channel", where)

    if is_direct(event):
        return None  # direct messages: questions to the bot, never group conversation
    if subtype == "message_changed":
        new = event.get("message")
        if not isinstance(new, Mapping):
            raise PayloadError(f"{where}: message_changed without a 'message' object")
        team = _team(body, {**event, **new}, team_id)
        message_id = req_str(new, "ts", where)
        parse_ts(message_id, where)
        if new.get("subtype") == "tombstone":
            # A thread parent deleted while replies remain: Slack edits it into a tombstone.
            return build(DeleteEvent, where, scope=_scope(team, channel), message_id=message_id)
        text = _message_text(new, where)
        previous = event.get("previous_message")
        if isinstance(previous, Mapping) and previous.get("text") == new.get("text"):
            return None  # unfurls, reactions, reply counts: not a content change
        edited = new.get("edited")
        edited_ts = edited.get("ts") if isinstance(edited, Mapping) else None
        edited_at = parse_ts(edited_ts, where) if edited_ts else _event_time(body, event)
        return build(
            EditEvent,
            where,
            scope=_scope(team, channel),
            message_id=message_id,
            text=text,
            edited_at=edited_at,
            author_id=opt_str(new, "user", where),
        )

    team = _team(body, event, team_id)
    if subtype == "message_deleted":
        message_id = req_str(event, "deleted_ts", where)
        parse_ts(message_id, where)
        return build(DeleteEvent, where, scope=_scope(team, channel), message_id=message_id)
    if subtype not in MESSAGE_SUBTYPES:
        log.debug("ignoring slack message subtype %s", subtype)
        return None
    return message_event(event, team=team, channel=channel, user_names=names)


def is_direct(event: Mapping[str, Any]) -> bool:
    """A one-to-one direct message: ``channel_type: "im"``, or a ``D…`` channel id (the
    kind Slack gives direct messages) when the type is missing. Never stored."""
    channel = event.get("channel")
    return event.get("channel_type") == "im" or (
        isinstance(channel, str) and channel.startswith("D")
    )


class SlackAsk(BaseModel):
    """A question to the bot: a mention in a channel or thread, or a direct message."""

    model_config = ConfigDict(frozen=True)

    team: str
    channel: str
    user: str
    text: str
    ts: str
    thread_ts: str | None = None
    """The thread the question was asked in (None: at the top level)."""
    direct: bool = False


def ask_of(
    body: Mapping[str, Any], *, bot_user_id: str | None, bot_id: str | None
) -> SlackAsk | None:
    """The question in an ``app_mention`` event, or in a person's direct message to the bot
    (``message`` in an ``im``); None for every other event (they go to `translate_event`).

    A mention inside a direct message is answered once, as the direct message; edits,
    deletions, bots (the bot's own replies included) and empty texts ask nothing."""
    if not isinstance(body, Mapping):
        raise PayloadError(f"slack event: expected an object, got {type(body).__name__}")
    event = body.get("event", body)
    if not isinstance(event, Mapping):
        raise PayloadError("slack event: field 'event' must be an object")
    kind = event.get("type")
    direct = kind == "message" and is_direct(event)
    if kind == "app_mention":
        if is_direct(event):
            return None
    elif not direct:
        return None
    where = f"slack {kind} event"
    if event.get("subtype") is not None or event.get("bot_id") is not None:
        return None  # edits, deletions, joins, and every bot (the bot's own replies too)
    user = opt_str(event, "user", where)
    if not user or user == bot_user_id or (bot_id and user == bot_id):
        return None
    ts = req_str(event, "ts", where)
    parse_ts(ts, where)
    thread_ts = opt_str(event, "thread_ts", where)
    if thread_ts:
        parse_ts(thread_ts, where)
    return build(
        SlackAsk,
        where,
        team=_team(body, event, None),
        channel=req_str(event, "channel", where),
        user=user,
        text=check_text(event.get("text") or "", where),
        ts=ts,
        thread_ts=thread_ts,
        direct=direct,
    )


def translate_event(
    body: Mapping[str, Any],
    *,
    team_id: str | None = None,
    user_names: Mapping[str, str] | None = None,
) -> Event | None:
    """An Events API body (``event_callback``) or its inner ``event`` → one event or None.

    `team_id` overrides the team found in the payload; `user_names` maps user
    ids to display names the adapter already knows (else the payload's
    ``user_profile`` or the bare id is used).
    """
    if not isinstance(body, Mapping):
        raise PayloadError(f"slack event: expected an object, got {type(body).__name__}")
    names = user_names or {}
    if "event" in body:
        event = body["event"]
        if not isinstance(event, Mapping):
            raise PayloadError("slack event: field 'event' must be an object")
    else:
        event = body
    kind = event.get("type")
    if not isinstance(kind, str):
        raise PayloadError("slack event: field 'type' must be a string")

    if kind == "message":
        return _translate_message(body, event, team_id, names)

    if kind in ("member_joined_channel", "member_left_channel"):
        where = f"slack {kind}"
        user = req_str(event, "user", where)
        channel = req_str(event, "channel", where)
        joined = kind == "member_joined_channel"
        name = names.get(user) if joined else None
        return build(
            RosterEvent,
            where,
            scope=_scope(_team(body, event, team_id), channel),
            action=RosterAction.JOIN if joined else RosterAction.LEAVE,
            user_id=user,
            name=name,
            at=_event_time(body, event),
        )

    if kind == "user_change":
        where = "slack user_change"
        user = event.get("user")
        if not isinstance(user, Mapping):
            raise PayloadError(f"{where}: field 'user' must be an object")
        user_id = req_str(user, "id", where)
        name = display_name(user)
        if name is None:
            return None
        team = team_id or opt_str(user, "team_id", where) or _team(body, event, None)
        return build(
            RosterEvent,
            where,
            scope=_scope(team, WORKSPACE_CHANNEL),
            action=RosterAction.RENAME,
            user_id=user_id,
            name=name,
            is_bot=bool(user.get("is_bot")),
            at=_event_time(body, event),
        )

    log.debug("ignoring slack event type %s", kind)
    return None


CHANNEL_DELETED_EVENTS = frozenset({"channel_deleted", "group_deleted"})
"""A public (scope channels:read) or private (groups:read) channel was deleted."""


def deleted_channel(body: Mapping[str, Any], *, team_id: str | None = None) -> Scope | None:
    """The channel a ``channel_deleted`` / ``group_deleted`` event names; None for any other
    event. These are no `Event`: the adapter has everything the channel held forgotten."""
    if not isinstance(body, Mapping):
        raise PayloadError(f"slack event: expected an object, got {type(body).__name__}")
    event = body.get("event", body)
    if not isinstance(event, Mapping) or event.get("type") not in CHANNEL_DELETED_EVENTS:
        return None
    where = f"slack {event.get('type')}"
    channel = req_str(event, "channel", where)
    return _scope(_team(body, event, team_id), channel)


_PRIVATE_TYPES = frozenset({"group", "mpim", "im", "G", "D"})
_PUBLIC_TYPES = frozenset({"channel", "C"})


def channel_privacy(body: Mapping[str, Any]) -> bool | None:
    """Whether the event's channel is private, from its ``channel_type``; None when absent.

    Message events say "channel" (public), "group" (private), "mpim" or "im"; member
    events say "C" or "G". An unknown value says nothing (the store keeps its default,
    which is private).
    """
    event = body.get("event") if isinstance(body.get("event"), Mapping) else body
    kind = event.get("channel_type") if isinstance(event, Mapping) else None
    if kind in _PRIVATE_TYPES:
        return True
    if kind in _PUBLIC_TYPES:
        return False
    return None


_COMMAND_OPTION_KEYS = (
    "response_url",
    "trigger_id",
    "team_domain",
    "channel_name",
    "enterprise_id",
    "api_app_id",
)


def translate_command(form: Mapping[str, str]) -> CommandInvocation:
    """A slash-command form payload → CommandInvocation.

    The command name loses its leading slash ("/recall" → "recall") so Slack and
    Discord invocations compare equal; ``response_url`` and ``trigger_id`` go to
    ``options`` for the adapter's deferred answer.
    """
    where = "slack slash command"
    if not isinstance(form, Mapping):
        raise PayloadError(f"{where}: expected a form mapping, got {type(form).__name__}")
    command = req_str(form, "command", where).strip().lstrip("/")
    if not command:
        raise PayloadError(f"{where}: empty command name")
    user_id = req_str(form, "user_id", where)
    channel_id = req_str(form, "channel_id", where)
    team_id = req_str(form, "team_id", where)
    text = form.get("text") or ""
    if not isinstance(text, str):
        raise PayloadError(f"{where}: text must be a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(f"{where}: text is not valid UTF-8") from exc
    options = {k: form[k] for k in _COMMAND_OPTION_KEYS if isinstance(form.get(k), str) and form[k]}
    return build(
        CommandInvocation,
        where,
        scope=_scope(team_id, channel_id),
        command=command,
        user_id=user_id,
        user_name=opt_str(form, "user_name", where),
        text=text.strip(),
        options=options,
    )
