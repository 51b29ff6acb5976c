"""The OAuth2 URL that adds the bot to a server, with the scopes and permissions it needs (pure)."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import urlencode

SCOPES = ("bot", "applications.commands")
"""`bot` joins the bot user; `applications.commands` lets `/recall` and `/memory` register."""

VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
READ_MESSAGE_HISTORY = 1 << 16
PERMISSIONS = VIEW_CHANNEL | SEND_MESSAGES | READ_MESSAGE_HISTORY
"""View Channels, Send Messages, Read Message History: 68608. Nothing else is asked for."""

AUTHORIZE_URL = "https://discord.com/oauth2/authorize"


def application_id_from_token(token: str) -> str | None:
    """A bot token's first part is the bot's user id in base64, which is the application id."""
    head = token.strip().split(".", 1)[0]
    if not head:
        return None
    try:
        decoded = base64.b64decode(head + "=" * (-len(head) % 4), validate=False).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return decoded if decoded.isdigit() and 15 <= len(decoded) <= 21 else None


def invite_url(application_id: str, *, guild_id: str | None = None) -> str:
    if not application_id.isdigit():
        raise ValueError(f"a Discord application id is a number, not {application_id!r}")
    params = {
        "client_id": application_id,
        "scope": " ".join(SCOPES),
        "permissions": str(PERMISSIONS),
    }
    if guild_id:
        params |= {"guild_id": guild_id, "disable_guild_select": "true"}
    return f"{AUTHORIZE_URL}?{urlencode(params)}"
