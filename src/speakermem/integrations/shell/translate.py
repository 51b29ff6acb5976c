"""Shell lines -> typed commands and platform-neutral events (pure: no I/O, no clock).

The shell is a chat platform whose "payloads" are lines typed in a terminal. This module
does for them what `integrations/{slack,discord}/translate.py` do for webhooks: parse and
validate, then build the same `bot.events` models the other adapters build.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from speakermem.bot.events import CommandInvocation, MessageEvent, RosterAction, RosterEvent, Scope

PLATFORM = "shell"
DEFAULT_WORKSPACE = "local"
DEFAULT_CHANNEL = "general"
DEFAULT_SPEAKER = "you"

Kind = Literal[
    "say", "as", "channel", "join", "invite", "recall", "memory", "who", "help", "quit", "empty"
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_COMMANDS: dict[str, Kind] = {
    "as": "as",
    "channel": "channel",
    "join": "join",
    "invite": "invite",
    "recall": "recall",
    "memory": "memory",
    "who": "who",
    "help": "help",
    "quit": "quit",
    "exit": "quit",
}

HELP = """\
/as NAME              speak as NAME (a display name, alias or id; new names are created)
/channel #NAME        switch channel; `/channel #NAME private` creates a private channel
/join                 join the current channel as the current speaker
/invite NAME          add NAME to the current channel (needed for a private channel)
/recall QUESTION      ask what this channel remembers, as the current speaker
/memory [COMMAND]     governance: status, mine, forget ..., alias ..., help (you are admin)
/who                  the current channel's roster
/help, /quit          this list; leave (Ctrl-D works too)
anything else         a message from the current speaker in the current channel"""


class ShellError(ValueError):
    """A line that does not parse; the message says what was expected."""


class ShellLine(BaseModel):
    """One typed line, parsed."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    arg: str = ""
    private: bool = False


def parse_line(line: str) -> ShellLine:
    """Split a line into a command and its argument; anything not starting with '/' is a post."""
    text = line.rstrip("\r\n")
    stripped = text.strip()
    if not stripped:
        return ShellLine(kind="empty")
    if not stripped.startswith("/") or stripped.startswith("//"):
        # '//' escapes a message that starts with a slash
        return ShellLine(kind="say", arg=stripped[1:] if stripped.startswith("//") else text)
    head, _, rest = stripped[1:].partition(" ")
    kind = _COMMANDS.get(head.lower())
    if kind is None:
        raise ShellError(f"unknown command /{head}; /help lists them (start with // to post it)")
    rest = rest.strip()
    if kind in ("as", "invite"):
        return ShellLine(kind=kind, arg=person_name(rest))
    if kind == "channel":
        words = rest.split()
        if not words or len(words) > 2 or (len(words) == 2 and words[1].lower() != "private"):
            raise ShellError("usage: /channel #name [private]")
        return ShellLine(kind="channel", arg=channel_name(words[0]), private=len(words) == 2)
    if kind == "recall" and not rest:
        raise ShellError("usage: /recall what did we decide about the launch?")
    return ShellLine(kind=kind, arg=rest)


def channel_name(raw: str) -> str:
    name = raw.strip().lstrip("#").lower()
    if not _NAME.match(name):
        raise ShellError(f"a channel name is letters, digits, '-', '_' or '.', not {raw!r}")
    return name


def person_name(raw: str) -> str:
    name = raw.strip().lstrip("@")
    if not _NAME.match(name):
        raise ShellError(f"a name is one word of letters, digits, '-', '_' or '.', not {raw!r}")
    return name


def new_user(name: str) -> tuple[str, str]:
    """(user id, display name) for a name seen for the first time: 'alice' -> ('alice', 'Alice')."""
    display = name[0].upper() + name[1:] if name.islower() else name
    return name.lower(), display


def scope_of(workspace: str, channel: str) -> Scope:
    return Scope(platform=PLATFORM, workspace=workspace, channel=channel)


def message_event(
    scope: Scope, message_id: str, user_id: str, user_name: str, text: str, at: datetime
) -> MessageEvent:
    return MessageEvent(
        scope=scope,
        message_id=message_id,
        speaker_id=user_id,
        speaker_name=user_name,
        text=text,
        ts=at,
    )


def join_event(scope: Scope, user_id: str, user_name: str, at: datetime) -> RosterEvent:
    return RosterEvent(
        scope=scope, action=RosterAction.JOIN, user_id=user_id, name=user_name, at=at
    )


def command(
    scope: Scope, name: str, user_id: str, user_name: str, text: str, *, admin: bool
) -> CommandInvocation:
    """The invocation a slash command becomes; the local operator of the shell is admin."""
    return CommandInvocation(
        scope=scope,
        command=name,
        user_id=user_id,
        user_name=user_name,
        text=text,
        options={"question": text} if name == "recall" else {},
        is_admin=admin,
    )
