"""`speakermem discord invite-url`: the link that adds the bot to a server."""

from __future__ import annotations

import argparse
from typing import Any

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.discord.invite import (
    PERMISSIONS,
    SCOPES,
    application_id_from_token,
    invite_url,
)


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "discord",
        help="Discord setup: the invite URL (see also discord-sync)",
        description="Discord setup helpers that need no gateway connection.",
    )
    common(p)
    group = p.add_subparsers(dest="discord_command", metavar="SUBCOMMAND")
    group.required = True
    q = group.add_parser(
        "invite-url",
        help="print the OAuth2 URL that adds the bot with the scopes and permissions it needs",
        description=f"Print the OAuth2 authorize URL with scopes {' + '.join(SCOPES)} and "
        f"permissions {PERMISSIONS} (View Channels, Send Messages, Read Message History). "
        "The application id comes from --client-id, else from SPEAKERMEM_DISCORD_TOKEN.",
    )
    common(q)
    q.add_argument("--client-id", default=None, help="the application id (Developer Portal)")
    q.add_argument("--guild", default=None, metavar="ID", help="preselect this server")
    q.set_defaults(handler="speakermem.integrations.cli.commands_discord:cmd_invite_url")


async def cmd_invite_url(settings: Settings, args: argparse.Namespace) -> int:
    app_id = args.client_id
    if app_id is None and settings.discord_token is not None:
        app_id = application_id_from_token(settings.discord_token.get_secret_value())
    if not app_id:
        raise CliError(
            "no application id: pass --client-id (Developer Portal → General Information → "
            "Application ID) or set SPEAKERMEM_DISCORD_TOKEN"
        )
    if args.guild is not None and not str(args.guild).isdigit():
        raise CliError(f"--guild must be a numeric server id, not {args.guild!r}")
    try:
        print(invite_url(str(app_id), guild_id=args.guild))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return 0
