"""The Discord stand-in's guild: ids, permission bits, and the users, members, roles and
channels its gateway announces (`default_guild`); payloads in Discord's own shapes."""

from __future__ import annotations

from typing import Any

GUILD_ID = "700000000000000001"
APP_ID = "700000000000000900"
BOT_ID = APP_ID
OWNER_ID = "700000000000000301"
EVERYONE = GUILD_ID
ROLE_MEMBERS = "700000000000000401"
ROLE_ADMIN = "700000000000000402"
CATEGORY = "700000000000000010"
GENERAL = "700000000000000011"
SECRET = "700000000000000012"
THREAD = "700000000000000013"
DM_CHANNEL = "700000000000000099"
"""A direct message channel between a member and the bot."""
VIEW = 1 << 10
SEND = 1 << 11
HISTORY = 1 << 16
"""READ_MESSAGE_HISTORY: with VIEW, what reading a channel's memory needs."""
ADMINISTRATOR = 1 << 3
MANAGE_GUILD = 1 << 5


def user(uid: str, username: str, *, global_name: str | None = None, bot: bool = False) -> dict:
    """A user object as the gateway sends it."""
    return {
        "id": uid,
        "username": username,
        "discriminator": "0",
        "global_name": global_name,
        "avatar": None,
        "bot": bot,
        "public_flags": 0,
    }


def member(u: dict, *, nick: str | None = None, roles: list[str] | None = None) -> dict:
    """A member object; discord.py needs `flags`."""
    return {
        "user": u,
        "nick": nick,
        "roles": roles or [],
        "joined_at": "2024-01-01T00:00:00+00:00",
        "deaf": False,
        "mute": False,
        "flags": 0,
        "pending": False,
    }


def default_guild() -> dict[str, Any]:
    """A small guild: owner, two members, the bot; #general, #secret (admins only), a thread."""
    bot = user(BOT_ID, "speakermem", bot=True)
    members = [
        member(user(OWNER_ID, "olivia", global_name="Olivia"), roles=[ROLE_ADMIN]),
        member(user("700000000000000302", "alice", global_name="Alice"), nick="Ally"),
        member(user("700000000000000303", "bob"), roles=[ROLE_MEMBERS]),
        member(bot, roles=[ROLE_MEMBERS]),
    ]
    role = {"color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0}
    channel = {"guild_id": GUILD_ID, "nsfw": False, "rate_limit_per_user": 0}
    return {
        "id": GUILD_ID,
        "name": "Stand-in Guild",
        "owner_id": OWNER_ID,
        "unavailable": False,
        "member_count": len(members),
        "large": False,
        "features": [],
        "roles": [
            {
                **role,
                "id": EVERYONE,
                "name": "@everyone",
                "position": 0,
                "permissions": str(VIEW | HISTORY | SEND),
            },
            {**role, "id": ROLE_MEMBERS, "name": "members", "position": 1, "permissions": "0"},
            {
                **role,
                "id": ROLE_ADMIN,
                "name": "admins",
                "position": 2,
                "permissions": str(ADMINISTRATOR),
            },
        ],
        "channels": [
            {
                **channel,
                "id": CATEGORY,
                "type": 4,
                "name": "Text",
                "position": 0,
                "permission_overwrites": [],
            },
            {
                **channel,
                "id": GENERAL,
                "type": 0,
                "name": "general",
                "position": 1,
                "parent_id": CATEGORY,
                "permission_overwrites": [],
            },
            {
                **channel,
                "id": SECRET,
                "type": 0,
                "name": "secret",
                "position": 2,
                "parent_id": CATEGORY,
                "permission_overwrites": [
                    {"id": EVERYONE, "type": 0, "allow": "0", "deny": str(VIEW)},
                    {"id": ROLE_MEMBERS, "type": 0, "allow": str(VIEW), "deny": "0"},
                ],
            },
        ],
        "threads": [
            {
                "id": THREAD,
                "guild_id": GUILD_ID,
                "type": 11,
                "name": "trip planning",
                "parent_id": GENERAL,
                "owner_id": "700000000000000302",
                "member_count": 2,
                "message_count": 0,
                "rate_limit_per_user": 0,
                "flags": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": "2024-01-01T00:00:00+00:00",
                    "locked": False,
                },
            },
        ],
        "members": members,
        "presences": [],
        "voice_states": [],
        "emojis": [],
        "stickers": [],
    }
