"""`/memory` commands: the reply models, a pure parser for the subcommand line, confirm tokens.

Adapters hand the line after `/memory` to `Dispatcher.memory_command`; this module turns it
into a typed command (or a syntax error that says what was expected) without touching the
store. Who may run what is in `bot.commands.MEMORY_SUBCOMMANDS`, the one table adapters read.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ConfigDict, Field

from speakermem.bot.commands import MEMORY_SUBCOMMAND_BY_NAME, MEMORY_SUBCOMMANDS, MemorySubcommand

CONFIRM_TTL_S = 600.0
"""How long a confirmation button stays valid."""


# ---- replies ----------------------------------------------------------------------------


class ConfirmPrompt(BaseModel):
    """A pending destructive action: the adapter shows two buttons carrying the token."""

    model_config = ConfigDict(frozen=True)

    token: str
    summary: str
    confirm_label: str = "Confirm"
    cancel_label: str = "Cancel"


class CommandReply(BaseModel):
    """What a `/memory` command answers; adapters render it (always ephemeral by default)."""

    text: str
    ephemeral: bool = True
    refused: bool = False
    confirm: ConfirmPrompt | None = None
    data: dict[str, Any] | None = Field(default=None)
    """JSON such as an export or a receipt, for adapters that attach a file."""


# ---- references -------------------------------------------------------------------------


class UserRef(BaseModel):
    """A user as typed: an id (from a mention or raw) or a name/alias to resolve."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["id", "name"]
    value: str
    label: str | None = None
    """The display name a Slack mention carried (`<@U1|bob>`), for messages."""

    def __str__(self) -> str:
        return self.label or self.value


class MessageRef(BaseModel):
    """A message named by a platform link or by id (then: in the channel where it was asked)."""

    model_config = ConfigDict(frozen=True)

    message_id: str
    channel: str | None = None
    workspace: str | None = None
    platform: str | None = None


_MENTION = re.compile(r"^<@!?([A-Za-z0-9_.-]+)(?:\|([^>]*))?>$")
_RAW_ID = re.compile(r"^(?:[UW][A-Z0-9]{6,}|\d{5,})$")
_DISCORD_LINK = re.compile(
    r"^https?://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/channels/(\d+|@me)/(\d+)/(\d+)/?$"
)
_SLACK_TS = re.compile(r"^p(\d{10})(\d{6})$")


def parse_user_ref(text: str) -> UserRef:
    """`<@U123>`, `<@U123|name>`, `<@!123>`, a raw id, or a display name / alias."""
    raw = text.strip()
    if not raw:
        raise CommandSyntaxError("name a member: a mention like @bob, an id, or a name")
    m = _MENTION.match(raw)
    if m:
        return UserRef(kind="id", value=m.group(1), label=(m.group(2) or None))
    if _RAW_ID.match(raw):
        return UserRef(kind="id", value=raw)
    name = raw[1:] if raw.startswith("@") and len(raw) > 1 else raw
    return UserRef(kind="name", value=name)


def parse_message_ref(text: str) -> MessageRef:
    """A Discord jump link, a Slack permalink (`.../archives/C1/p1700000000123456`), or an id."""
    raw = text.strip().strip("<>")
    if not raw:
        raise CommandSyntaxError("name the message: paste its link (Copy Link) or its id")
    m = _DISCORD_LINK.match(raw)
    if m:
        guild = None if m.group(1) == "@me" else m.group(1)
        return MessageRef(
            message_id=m.group(3), channel=m.group(2), workspace=guild, platform="discord"
        )
    if raw.startswith(("http://", "https://")):
        url = urlparse(raw)
        parts = [p for p in url.path.split("/") if p]
        if (
            url.hostname
            and url.hostname.endswith("slack.com")
            and len(parts) >= 3
            and parts[0] == "archives"
        ):
            ts = _SLACK_TS.match(parts[2])
            if ts:
                query = parse_qs(url.query)
                channel = (query.get("cid") or [parts[1]])[0]
                return MessageRef(
                    message_id=f"{ts.group(1)}.{ts.group(2)}", channel=channel, platform="slack"
                )
        raise CommandSyntaxError(
            f"I cannot read that link ({raw[:80]}): use a Discord message link, a Slack "
            "permalink, or the message id"
        )
    if any(ch.isspace() for ch in raw):
        raise CommandSyntaxError("a message id has no spaces")
    return MessageRef(message_id=raw)


# ---- typed commands ---------------------------------------------------------------------


class CommandSyntaxError(ValueError):
    """The subcommand line does not parse; the message says what was expected."""


@dataclass(frozen=True)
class ChannelSwitch:
    on: bool
    purge: bool = False
    name: str = "channel"


@dataclass(frozen=True)
class RetentionSet:
    days: int | None
    """None = off (keep forever)."""
    workspace: bool = False
    name: str = "retention"


@dataclass(frozen=True)
class AliasChange:
    add: bool
    user: UserRef
    alias: str
    name: str = "alias"


@dataclass(frozen=True)
class ForgetMessage:
    ref: MessageRef
    name: str = "forget"


@dataclass(frozen=True)
class ForgetUser:
    user: UserRef
    name: str = "forget"


@dataclass(frozen=True)
class ForgetLift:
    """Let a forgotten member be remembered again (their new messages; the old stay gone)."""

    user: UserRef
    name: str = "forget"


@dataclass(frozen=True)
class ExportUser:
    user: UserRef
    name: str = "export"


@dataclass(frozen=True)
class Status:
    name: str = "status"


@dataclass(frozen=True)
class Audit:
    limit: int = 10
    name: str = "audit"


@dataclass(frozen=True)
class Mine:
    name: str = "mine"


@dataclass(frozen=True)
class OptOut:
    forget: bool = False
    name: str = "opt-out"


@dataclass(frozen=True)
class OptIn:
    name: str = "opt-in"


@dataclass(frozen=True)
class ForgetMe:
    name: str = "forget-me"


@dataclass(frozen=True)
class Help:
    topic: str | None = None
    name: str = "help"


MemoryCommand = (
    ChannelSwitch
    | RetentionSet
    | AliasChange
    | ForgetMessage
    | ForgetUser
    | ForgetLift
    | ExportUser
    | Status
    | Audit
    | Mine
    | OptOut
    | OptIn
    | ForgetMe
    | Help
)

MAX_RETENTION_DAYS = 36_500


def spec_of(command: MemoryCommand) -> MemorySubcommand:
    return MEMORY_SUBCOMMAND_BY_NAME[command.name]


def is_admin_only(command: MemoryCommand) -> bool:
    return spec_of(command).admin_only


def is_destructive(command: MemoryCommand) -> bool:
    """Whether this command, with these arguments, removes data (then it asks first)."""
    if isinstance(command, ChannelSwitch):
        return command.purge
    if isinstance(command, OptOut):
        return command.forget
    return isinstance(command, ForgetMessage | ForgetUser | ForgetMe)


def _usage(name: str) -> str:
    spec = MEMORY_SUBCOMMAND_BY_NAME[name]
    return f"`/memory {spec.name}{' ' + spec.args if spec.args else ''}`"


def parse_memory_command(text: str) -> MemoryCommand:
    """The typed command for a `/memory` line; raises CommandSyntaxError with the usage."""
    words = text.strip().split()
    if not words:
        return Help()
    head, rest = words[0].lower(), words[1:]
    lowered = [w.lower() for w in rest]
    if head in ("help", "?", "-h", "--help"):
        return Help(topic=lowered[0] if lowered else None)
    if head == "channel":
        if not rest or lowered[0] not in ("on", "off", "enable", "disable"):
            raise CommandSyntaxError(f"say on or off: {_usage('channel')}")
        on = lowered[0] in ("on", "enable")
        extra = lowered[1:]
        if extra not in ([], ["purge"]) or (on and extra):
            raise CommandSyntaxError(f"only `off` takes `purge`: {_usage('channel')}")
        return ChannelSwitch(on=on, purge=bool(extra))
    if head == "retention":
        if not rest:
            raise CommandSyntaxError(f"give a number of days or off: {_usage('retention')}")
        workspace = False
        extra = lowered[1:]
        if extra in (["workspace"], ["server"], ["all"]):
            workspace = True
        elif extra not in ([], ["channel"]):
            raise CommandSyntaxError(f"unexpected {' '.join(rest[1:])!r}: {_usage('retention')}")
        value = lowered[0]
        if value in ("off", "none", "forever"):
            return RetentionSet(days=None, workspace=workspace)
        days_text = value[:-1] if value.endswith("d") else value
        if not days_text.isdigit():
            raise CommandSyntaxError(f"{rest[0]!r} is not a number of days: {_usage('retention')}")
        days = int(days_text)
        if not 1 <= days <= MAX_RETENTION_DAYS:
            raise CommandSyntaxError(f"retention is 1 to {MAX_RETENTION_DAYS} days, or off")
        return RetentionSet(days=days, workspace=workspace)
    if head == "alias":
        if len(rest) < 3 or lowered[0] not in ("add", "remove", "rm", "del", "delete"):
            raise CommandSyntaxError(f"{_usage('alias')}, e.g. `/memory alias add @bob Bobby`")
        alias = " ".join(rest[2:]).strip()
        if len(alias) > 100:
            raise CommandSyntaxError("an alias is at most 100 characters")
        return AliasChange(add=lowered[0] == "add", user=parse_user_ref(rest[1]), alias=alias)
    if head == "forget":
        if not rest or lowered[0] not in ("message", "msg", "user", "member", "lift"):
            raise CommandSyntaxError(f"forget what? {_usage('forget')}")
        target = " ".join(rest[1:])
        if lowered[0] == "lift":
            return ForgetLift(user=parse_user_ref(target))
        if lowered[0] in ("message", "msg"):
            if len(rest) != 2:
                raise CommandSyntaxError("forget one message: `/memory forget message <link>`")
            return ForgetMessage(ref=parse_message_ref(rest[1]))
        return ForgetUser(user=parse_user_ref(target))
    if head == "export":
        if not rest or lowered[0] not in ("user", "member"):
            raise CommandSyntaxError(f"{_usage('export')}")
        return ExportUser(user=parse_user_ref(" ".join(rest[1:])))
    if head == "status":
        _no_args(head, rest)
        return Status()
    if head == "audit":
        if rest:
            if len(rest) != 1 or not rest[0].isdigit() or not 1 <= int(rest[0]) <= 50:
                raise CommandSyntaxError("`/memory audit [N]` shows the last N (1-50) actions")
            return Audit(limit=int(rest[0]))
        return Audit()
    if head == "mine":
        _no_args(head, rest)
        return Mine()
    if head in ("opt-out", "optout"):
        if lowered not in ([], ["forget"]):
            raise CommandSyntaxError(f"{_usage('opt-out')}")
        return OptOut(forget=bool(lowered))
    if head in ("opt-in", "optin"):
        _no_args("opt-in", rest)
        return OptIn()
    if head in ("forget-me", "forgetme"):
        _no_args("forget-me", rest)
        return ForgetMe()
    known = ", ".join(s.name for s in MEMORY_SUBCOMMANDS)
    raise CommandSyntaxError(f"unknown subcommand {words[0]!r}; try one of: {known}")


def _no_args(name: str, rest: list[str]) -> None:
    if rest:
        raise CommandSyntaxError(f"{_usage(name)} takes no arguments")


def help_text(*, is_admin: bool) -> str:
    """The command list a user may run (admins see theirs too)."""
    lines = ["*Memory commands*"]
    for spec in MEMORY_SUBCOMMANDS:
        if spec.admin_only and not is_admin:
            continue
        usage = f"/memory {spec.name}{' ' + spec.args if spec.args else ''}"
        tag = " (admin)" if spec.admin_only else ""
        lines.append(f"• `{usage}`{tag}: {spec.description}")
    if not is_admin:
        lines.append(
            "Admin commands (channel, retention, forget, export, status, audit) are "
            "for workspace admins."
        )
    return "\n".join(lines)


# ---- confirmation tokens ----------------------------------------------------------------


@dataclass
class PendingAction:
    """A destructive command waiting for its confirm button."""

    token: str
    user_id: str
    platform: str
    workspace: str
    command: MemoryCommand
    context: dict[str, Any]
    admin_required: bool
    expires_at: float


@dataclass
class PendingActions:
    """Single-use, user-bound, expiring confirmation tokens (in memory: a restart cancels)."""

    ttl_s: float = CONFIRM_TTL_S
    _items: dict[str, PendingAction] = field(default_factory=dict)

    def add(
        self,
        *,
        user_id: str,
        platform: str,
        workspace: str,
        command: MemoryCommand,
        context: dict[str, Any],
        admin_required: bool,
        now: float | None = None,
    ) -> PendingAction:
        now = time.time() if now is None else now
        self._expire(now)
        action = PendingAction(
            token=secrets.token_urlsafe(16),
            user_id=user_id,
            platform=platform,
            workspace=workspace,
            command=command,
            context=context,
            admin_required=admin_required,
            expires_at=now + self.ttl_s,
        )
        self._items[action.token] = action
        return action

    def take(self, token: str, *, user_id: str, now: float | None = None) -> PendingAction | str:
        """The action for this token, removed (single use), or why it cannot run.

        A token pressed by someone other than its requester stays valid for the requester.
        """
        now = time.time() if now is None else now
        self._expire(now)
        action = self._items.get(token)
        if action is None:
            return "this confirmation has expired or was already used; run the command again"
        if action.user_id != user_id:
            return "only the person who ran the command can confirm it"
        del self._items[token]
        return action

    def _expire(self, now: float) -> None:
        for token in [t for t, a in self._items.items() if a.expires_at <= now]:
            del self._items[token]

    def __len__(self) -> int:
        return len(self._items)
