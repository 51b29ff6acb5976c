"""Platform-neutral events: the one vocabulary adapters translate payloads into.

Message, edit, delete and roster events are the memory core's own input models;
a command invocation is the bot layer's addition. Adapters produce these in pure
functions; `bot.dispatch` consumes them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from speakermem.bot.asks import Via
from speakermem.memory.models import (
    DeleteEvent,
    EditEvent,
    MessageEvent,
    RosterAction,
    RosterEvent,
    Scope,
)

__all__ = [
    "CommandInvocation",
    "DeleteEvent",
    "EditEvent",
    "Event",
    "MessageEvent",
    "RosterAction",
    "RosterEvent",
    "Scope",
]


class CommandInvocation(BaseModel):
    """A slash command as the platform delivered it, before any work is done."""

    model_config = ConfigDict(frozen=True)

    scope: Scope
    command: str = Field(min_length=1, max_length=64)
    user_id: str = Field(min_length=1, max_length=256)
    user_name: str | None = None
    text: str = Field(default="", max_length=20_000)
    options: dict[str, str] = Field(default_factory=dict)
    readable_channels: tuple[str, ...] | None = None
    """Channels the invoker may read, when the platform says so; None = use the roster."""
    is_admin: bool = False
    """Set by the adapter from server-side facts at every call (roles, workspace admin flags,
    the admin list setting); the default denies admin commands."""
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    via: Via = "command"
    """How the question arrived (`bot.asks`): anything but the slash command is rate-limited
    per member; "dm" draws on every readable channel."""
    readable_scopes: tuple[Scope, ...] | None = None
    """For a direct message on a platform with several workspaces (Discord guilds): every
    channel the invoker may read, across them; wins over `readable_channels`."""
    locale: str | None = Field(default=None, max_length=35)
    """The invoker's language as the platform tells it ("zh-CN", "ja-JP"); None: unknown."""


Event = MessageEvent | EditEvent | DeleteEvent | RosterEvent | CommandInvocation
