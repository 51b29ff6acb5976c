"""The application commands on Discord: the tree, its registration, and `/memory`'s groups.

`build_tree` builds every command of `bot.commands.COMMANDS`: ``/recall`` from its
platform-neutral spec (`build_command`), ``/memory`` as the two groups below. Registration
(tree sync) happens only in `sync_commands` (``speakermem discord-sync``), never on start:
Discord rate-limits it.

Layout, and why: Discord applies ``default_member_permissions`` to a whole top-level
command, never to one subcommand, and members need ``mine``, ``opt-out``, ``opt-in`` and
``forget-me``. So the member subcommands live in ``/memory`` (open to everyone) and the
admin ones in ``/memory-admin``, whose default permission is Manage Server: Discord hides
it from members in the command picker. That is a convenience only. A server can override
it under Server Settings → Integrations, so the adapter checks admin rights on the server
(owner, Administrator or Manage Server from the member's roles) at every call and at
every button click.

Both groups turn into one text line for `Dispatcher.memory_command` ("forget user <@123>",
"channel off purge"), the same line Slack's ``/memory`` and the CLI parse, so there is
one command set. The option values are read from the raw interaction payload by
`memory_line` (pure, tested with literal dicts); discord.py's callbacks only forward.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import discord
from discord import app_commands

from speakermem.bot.commands import (
    ASK_ABOUT_MESSAGE,
    COMMANDS,
    MEMORY,
    MEMORY_SUBCOMMAND_BY_NAME,
    MEMORY_SUBCOMMANDS,
    CommandSpec,
)
from speakermem.bot.settings import Settings
from speakermem.integrations.discord.connection import discord_endpoints, discord_token
from speakermem.integrations.discord.permissions import MANAGE_GUILD
from speakermem.integrations.payload import PayloadError, req_dict, req_str

__all__ = [
    "ADMIN_GROUP",
    "CONFIRM_PREFIX",
    "CONTENT_LIMIT",
    "MEMBER_GROUP",
    "CommandHandler",
    "ContextHandler",
    "MemoryHandler",
    "build_command",
    "build_context_menu",
    "build_memory_groups",
    "build_tree",
    "confirm_custom_id",
    "discord_usage",
    "memory_line",
    "parse_confirm_custom_id",
    "reply_parts",
    "sync_commands",
]

log = logging.getLogger(__name__)

MEMBER_GROUP = MEMORY.name
ADMIN_GROUP = f"{MEMORY.name}-admin"
CONFIRM_PREFIX = "speakermem:"
"""custom_id prefix of the Confirm/Cancel buttons: ``speakermem:confirm:<token>``."""

MemoryHandler = Callable[[discord.Interaction], Awaitable[None]]
CommandHandler = Callable[[discord.Interaction, dict[str, Any]], Awaitable[None]]
ContextHandler = Callable[[discord.Interaction, discord.Message], Awaitable[None]]

_SUBCOMMAND_TYPES = (1, 2)
"""SUB_COMMAND, SUB_COMMAND_GROUP option types."""
_USER = 6
_BOOLEAN = 5
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_CONFIRM = re.compile(r"^speakermem:(confirm|cancel):([A-Za-z0-9_-]{8,64})$")

# How each subcommand's options become words of the text line, in this order. A boolean
# option contributes its name when true; a user option `<@id>`; anything else its value.
_PREFIX: dict[tuple[str, ...], str] = {
    ("export",): "export user",
    ("forget", "message"): "forget message",
    ("forget", "user"): "forget user",
}
_ORDER: dict[tuple[str, ...], tuple[str, ...]] = {
    ("channel",): ("state", "purge"),
    ("retention",): ("days", "scope"),
    ("alias",): ("action", "member", "name"),
    ("forget", "message"): ("link",),
    ("forget", "user"): ("member",),
    ("export",): ("member",),
    ("audit",): ("count",),
    ("opt-out",): ("forget",),
}
_CHOICES: dict[str, frozenset[str]] = {
    "state": frozenset({"on", "off"}),
    "scope": frozenset({"channel", "workspace"}),
    "action": frozenset({"add", "remove"}),
}
_ONE_WORD = frozenset({"days", "link"})
"""Options that must be a single word (a day count, a message link or id)."""


def _desc(name: str) -> str:
    return MEMORY_SUBCOMMAND_BY_NAME[name].description[:100]


def build_memory_groups(handler: MemoryHandler) -> list[app_commands.Group]:
    """``/memory`` (member subcommands) and ``/memory-admin`` (admin ones); see the module."""
    member = app_commands.Group(
        name=MEMBER_GROUP,
        description="What this bot remembers about you: see it, opt out, opt in, forget it.",
        guild_only=True,
    )
    admin = app_commands.Group(
        name=ADMIN_GROUP,
        description="Admins: memory on/off, retention, aliases, forget, export, status, audit.",
        guild_only=True,
        default_permissions=discord.Permissions(manage_guild=True),
    )
    forget = app_commands.Group(
        name="forget", description=_desc("forget"), parent=admin, guild_only=True
    )

    async def channel(
        interaction: discord.Interaction, state: Literal["on", "off"], purge: bool = False
    ) -> None:
        await handler(interaction)

    async def retention(
        interaction: discord.Interaction,
        days: app_commands.Range[str, 1, 8],
        scope: Literal["channel", "workspace"] = "channel",
    ) -> None:
        await handler(interaction)

    async def alias(
        interaction: discord.Interaction,
        action: Literal["add", "remove"],
        member: discord.Member,
        name: app_commands.Range[str, 1, 100],
    ) -> None:
        await handler(interaction)

    async def forget_message(
        interaction: discord.Interaction, link: app_commands.Range[str, 1, 300]
    ) -> None:
        await handler(interaction)

    async def forget_user(interaction: discord.Interaction, member: discord.User) -> None:
        await handler(interaction)

    async def export(interaction: discord.Interaction, member: discord.User) -> None:
        await handler(interaction)

    async def audit(
        interaction: discord.Interaction, count: app_commands.Range[int, 1, 50] | None = None
    ) -> None:
        await handler(interaction)

    async def opt_out(interaction: discord.Interaction, forget: bool = False) -> None:
        await handler(interaction)

    async def no_options(interaction: discord.Interaction) -> None:
        await handler(interaction)

    described: dict[str, tuple[Any, dict[str, str]]] = {
        "channel": (
            channel,
            {"state": "on or off", "purge": "with off: also forget what it holds"},
        ),
        "retention": (
            retention,
            {"days": "days to keep messages (e.g. 90), or off", "scope": "channel or workspace"},
        ),
        "alias": (
            alias,
            {"action": "add or remove", "member": "who", "name": "the other name"},
        ),
        "export": (export, {"member": "whose data"}),
        "audit": (audit, {"count": "how many actions (default 10)"}),
        "opt-out": (opt_out, {"forget": "also forget what you said before"}),
    }
    for spec in MEMORY_SUBCOMMANDS:
        if spec.name == "forget":
            continue  # a subcommand group of its own, below
        callback, params = described.get(spec.name, (no_options, {}))
        groups = (
            (member, admin) if spec.name == "help" else ((admin,) if spec.admin_only else (member,))
        )
        for group in groups:
            command: app_commands.Command[Any, Any, Any] = app_commands.Command(
                name=spec.name, description=_desc(spec.name), callback=callback
            )
            if params:
                command = app_commands.describe(**params)(command)
            group.add_command(command)
    forget.add_command(
        app_commands.describe(link="the message link (Copy Message Link) or its id")(
            app_commands.Command(
                name="message", description="Forget one message.", callback=forget_message
            )
        )
    )
    forget.add_command(
        app_commands.describe(member="whose messages")(
            app_commands.Command(
                name="user",
                description="Forget everything a member said, and what was derived.",
                callback=forget_user,
            )
        )
    )
    forget.add_command(
        app_commands.describe(member="who may be remembered again")(
            app_commands.Command(
                name="lift",
                description="Remember a forgotten member's new messages again.",
                callback=forget_user,
            )
        )
    )
    return [member, admin]


# --- the tree ----------------------------------------------------------------------------------


def build_command(
    spec: CommandSpec, handler: CommandHandler
) -> app_commands.Command[Any, Any, Any]:
    """An app command from a platform-neutral spec: string options, described and bounded."""

    async def callback(interaction: discord.Interaction, **options: Any) -> None:
        await handler(interaction, options)

    params = [
        inspect.Parameter(
            "interaction", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=discord.Interaction
        )
    ]
    for opt in sorted(spec.options, key=lambda o: not o.required):
        annotation: Any = app_commands.Range[str, 1, opt.max_length]
        params.append(
            inspect.Parameter(
                opt.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=annotation if opt.required else annotation | None,
                default=inspect.Parameter.empty if opt.required else None,
            )
        )
    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__name__ = callback.__qualname__ = spec.name.replace("-", "_")
    callback.__discord_app_commands_param_description__ = {  # type: ignore[attr-defined]
        o.name: o.description[:100] for o in spec.options
    }
    command: app_commands.Command[Any, Any, Any] = app_commands.Command(
        name=spec.name, description=spec.description, callback=callback
    )
    command.guild_only = True
    if spec.admin_only:
        command.default_permissions = discord.Permissions(MANAGE_GUILD)
    return command


def build_context_menu(handler: ContextHandler) -> app_commands.ContextMenu:
    """The message context-menu command "Ask SpeakerMem about this" (servers only)."""

    async def ask_about(interaction: discord.Interaction, message: discord.Message) -> None:
        await handler(interaction, message)

    menu = app_commands.ContextMenu(name=ASK_ABOUT_MESSAGE, callback=ask_about)
    menu.guild_only = True
    return menu


def build_tree(
    client: discord.Client,
    handlers: Mapping[str, CommandHandler],
    ask_about: ContextHandler | None = None,
) -> app_commands.CommandTree[Any]:
    tree: app_commands.CommandTree[Any] = app_commands.CommandTree(client)
    if ask_about is not None:
        tree.add_command(build_context_menu(ask_about))
    for spec in COMMANDS:
        handler = handlers.get(spec.name)
        if handler is None:
            continue
        if spec.name == MEMORY.name:
            # subcommands with typed options, in two groups (`build_memory_groups`)
            for group in build_memory_groups(_without_options(handler)):
                tree.add_command(group)
            continue
        tree.add_command(build_command(spec, handler))
    return tree


def _without_options(handler: CommandHandler) -> MemoryHandler:
    async def forward(interaction: discord.Interaction) -> None:
        await handler(interaction, {})

    return forward


async def sync_commands(settings: Settings, guild_id: str | None) -> list[str]:
    """Register the commands with Discord (global, or one guild for instant availability).

    Only REST is used: log in, PUT the command list, log out. Run it once after
    installing or upgrading, not on every start (Discord rate-limits command syncs).
    """
    token = discord_token(settings)

    async def unused(interaction: discord.Interaction, options: dict[str, Any]) -> None:
        raise RuntimeError("sync-only tree")  # pragma: no cover

    with discord_endpoints(settings):
        client = discord.Client(intents=discord.Intents.none())

        async def unused_menu(interaction: discord.Interaction, message: discord.Message) -> None:
            raise RuntimeError("sync-only tree")  # pragma: no cover

        tree = build_tree(client, {spec.name: unused for spec in COMMANDS}, unused_menu)
        async with client:
            await client.login(token)
            if guild_id:
                guild = discord.Object(int(guild_id))
                tree.copy_global_to(guild=guild)
                synced = await tree.sync(guild=guild)
            else:
                synced = await tree.sync()
    names = [c.name for c in synced]
    log.info("synced commands %s to %s", names, f"guild {guild_id}" if guild_id else "all guilds")
    return names


# --- pure: payload → text line -------------------------------------------------------------------


def _path_and_options(
    data: Mapping[str, Any], where: str
) -> tuple[tuple[str, ...], list[Mapping[str, Any]]]:
    path: list[str] = []
    options: Any = data.get("options") or []
    while True:
        if not isinstance(options, list):
            raise PayloadError(f"{where}: options must be a list")
        nested = [
            o for o in options if isinstance(o, Mapping) and o.get("type") in _SUBCOMMAND_TYPES
        ]
        if not nested:
            return tuple(path), [o for o in options if isinstance(o, Mapping)]
        if len(nested) != 1 or len(options) != 1:
            raise PayloadError(f"{where}: expected exactly one subcommand")
        path.append(req_str(nested[0], "name", where))
        options = nested[0].get("options") or []


def memory_line(data: Mapping[str, Any]) -> tuple[str, str]:
    """(group name, the `/memory` text line) from an INTERACTION_CREATE's ``data``.

    ``/memory-admin forget user member:@bob`` → ("memory-admin", "forget user <@123>").
    Choice values are checked against their choices and one-word options must be one
    word, so a crafted value cannot smuggle extra words into the line.
    """
    where = "discord /memory interaction"
    if not isinstance(data, Mapping):
        raise PayloadError(f"{where}: data must be an object")
    group = req_str(data, "name", where)
    if group not in (MEMBER_GROUP, ADMIN_GROUP):
        raise PayloadError(f"{where}: not a memory command ({group!r})")
    path, options = _path_and_options(data, where)
    if not path or path[0] not in MEMORY_SUBCOMMAND_BY_NAME:
        raise PayloadError(f"{where}: unknown subcommand {path!r}")
    values: dict[str, Mapping[str, Any]] = {}
    for given in options:
        values[req_str(given, "name", where)] = given
    words = [_PREFIX.get(path, " ".join(path))]
    for name in _ORDER.get(path, ()):
        opt = values.get(name)
        if opt is None or opt.get("value") is None:
            continue
        value = opt["value"]
        kind = opt.get("type")
        if kind == _BOOLEAN:
            if value is True:
                words.append(name)
            continue
        text = str(value).strip()
        if kind == _USER:
            if not text.isdigit():
                raise PayloadError(f"{where}: {name} is not a user id")
            words.append(f"<@{text}>")
            continue
        if name in _CHOICES and text not in _CHOICES[name]:
            raise PayloadError(f"{where}: {name} must be one of {sorted(_CHOICES[name])}")
        if name in _ONE_WORD and (not text or any(c.isspace() for c in text)):
            raise PayloadError(f"{where}: {name} must be one word")
        if name == "scope" and text == "channel":
            continue  # the default
        words.append(" ".join(text.split()))
    return group, " ".join(words)


_ADMIN_USAGE = re.compile(
    r"/memory (" + "|".join(re.escape(s.name) for s in MEMORY_SUBCOMMANDS if s.admin_only) + r")\b"
)


def discord_usage(text: str) -> str:
    """Replies name commands as Slack and the CLI spell them (`/memory forget …`); on
    Discord the admin ones live under `/memory-admin`."""
    return _ADMIN_USAGE.sub(lambda m: f"/{ADMIN_GROUP} {m.group(1)}", text)


# --- pure: confirmation buttons ------------------------------------------------------------------


def confirm_custom_id(token: str, *, accept: bool) -> str:
    """The button's custom_id; Discord allows 100 characters, tokens are short."""
    if not _TOKEN.match(token):
        raise ValueError("confirmation tokens are 8-64 URL-safe characters")
    return f"{CONFIRM_PREFIX}{'confirm' if accept else 'cancel'}:{token}"


def parse_confirm_custom_id(d: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(token, accept) for a click on one of our buttons (INTERACTION_CREATE type 3), else None."""
    if not isinstance(d, Mapping) or d.get("type") != 3:
        return None
    data = req_dict(d, "data", "discord component interaction")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str):
        return None
    m = _CONFIRM.match(custom_id)
    if m is None:
        return None
    return m.group(2), m.group(1) == "confirm"


# --- pure: CommandReply → message parts ----------------------------------------------------------

CONTENT_LIMIT = 2000
"""Characters in a message's content."""


def reply_parts(
    text: str, data: Mapping[str, Any] | None, *, subcommand: str, attachment_limit: int
) -> tuple[str, tuple[str, bytes] | None]:
    """(content, attachment) for a `/memory` reply.

    JSON data (an export, a receipt) goes out as a file when it fits the interaction's
    attachment limit; a text over 2,000 characters is cut and sent whole as a file.
    """
    content = discord_usage(text.strip() or "(nothing to say)")
    attachment: tuple[str, bytes] | None = None
    if data is not None:
        raw = json.dumps(data, ensure_ascii=False, indent=2, default=str).encode()
        if len(raw) <= attachment_limit:
            attachment = (f"speakermem-{subcommand}.json", raw)
        else:
            content += (
                f"\n(The JSON is {len(raw):,} bytes, over this server's upload limit; run "
                "`speakermem export user` on the bot's machine for the full file.)"
            )
    if len(content) > CONTENT_LIMIT:
        if attachment is None and len(content.encode()) <= attachment_limit:
            attachment = (f"speakermem-{subcommand}.txt", content.encode())
            note = "\n… (cut here; the whole reply is attached)"
        else:
            note = "\n… (cut here)"
        content = content[: CONTENT_LIMIT - len(note)] + note
    return content, attachment
