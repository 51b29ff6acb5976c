"""Who may read a Discord channel: the permission computation, from raw gateway payloads.

Pure functions over dicts and small frozen models (no client), so every rule is tested with
literal payloads; the guild state (`integrations.discord.guild_state`) keeps the models
current and the command handlers ask them at every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from speakermem.integrations.payload import PayloadError, req_str

__all__ = [
    "ADMINISTRATOR",
    "CATEGORY",
    "MANAGE_GUILD",
    "READ_CHANNEL",
    "READ_MESSAGE_HISTORY",
    "THREAD_TYPES",
    "VIEW_CHANNEL",
    "ChannelPerms",
    "GuildPerms",
    "Overwrite",
    "can_read_channel",
    "is_guild_admin",
    "member_channel_permissions",
    "member_roles",
    "permission_bits",
    "perms_from_guild_create",
    "readable_channels",
]

VIEW_CHANNEL = 1 << 10
READ_MESSAGE_HISTORY = 1 << 16
READ_CHANNEL = VIEW_CHANNEL | READ_MESSAGE_HISTORY
"""Reading a channel's memory needs both: seeing the channel and reading its past."""
ADMINISTRATOR = 1 << 3
MANAGE_GUILD = 1 << 5

THREAD_TYPES = frozenset({10, 11, 12})
"""ANNOUNCEMENT_THREAD, PUBLIC_THREAD, PRIVATE_THREAD."""
CATEGORY = 4
"""The channel type of a category (it holds channels, never messages)."""


class Overwrite(BaseModel):
    """One channel permission overwrite: type 0 = role, 1 = member."""

    model_config = ConfigDict(frozen=True)

    id: str
    type: Literal[0, 1]
    allow: int = 0
    deny: int = 0


class GuildPerms(BaseModel):
    """What the permission computation needs from a guild: owner and role permissions."""

    model_config = ConfigDict(frozen=True)

    guild_id: str
    owner_id: str
    roles: dict[str, int] = Field(default_factory=dict)
    """role id → permission bits; the @everyone role's id is the guild id."""


class ChannelPerms(BaseModel):
    """A channel's overwrites. Threads carry their parent's overwrites and `parent_id`."""

    model_config = ConfigDict(frozen=True)

    channel_id: str
    overwrites: list[Overwrite] = Field(default_factory=list)
    parent_id: str | None = None
    type: int | None = None
    """Discord channel type (4 = category), when known."""


def can_read_channel(
    member_roles: set[str] | frozenset[str],
    member_id: str,
    guild: GuildPerms,
    channel: ChannelPerms,
) -> bool:
    """Whether a member may read a channel's history: VIEW_CHANNEL and READ_MESSAGE_HISTORY.

    Discord's computation: base = @everyone | the member's roles; owner or
    ADMINISTRATOR sees all; then the @everyone overwrite, the union of role
    overwrites (deny then allow), and the member overwrite (deny then allow). A
    member who can see a channel but not its history sees nothing said before they
    looked, so neither may its memory. For a thread pass its parent's overwrites
    (as `perms_from_guild_create` does); private-thread membership is not modelled.
    """
    if member_id == guild.owner_id:
        return True
    perms = guild.roles.get(guild.guild_id, 0)
    for role in member_roles:
        perms |= guild.roles.get(role, 0)
    if perms & ADMINISTRATOR:
        return True

    everyone = [o for o in channel.overwrites if o.type == 0 and o.id == guild.guild_id]
    for o in everyone:
        perms &= ~o.deny
        perms |= o.allow
    allow = deny = 0
    for o in channel.overwrites:
        if o.type == 0 and o.id != guild.guild_id and o.id in member_roles:
            allow |= o.allow
            deny |= o.deny
    perms &= ~deny
    perms |= allow
    for o in channel.overwrites:
        if o.type == 1 and o.id == member_id:
            perms &= ~o.deny
            perms |= o.allow
    return perms & READ_CHANNEL == READ_CHANNEL


def is_guild_admin(
    member_roles: set[str] | frozenset[str], member_id: str, guild: GuildPerms
) -> bool:
    """Owner, or a role (with @everyone) granting Administrator or Manage Server.

    Computed from the guild's role permissions as the bot last saw them, never from
    what the client claims; both are guild-wide (channel overwrites cannot grant them).
    """
    if member_id == guild.owner_id:
        return True
    perms = guild.roles.get(guild.guild_id, 0)
    for role in member_roles:
        perms |= guild.roles.get(role, 0)
    return bool(perms & (ADMINISTRATOR | MANAGE_GUILD))


def member_roles(member: Mapping[str, Any]) -> set[str]:
    """Role ids from a member payload (``roles`` is a list of id strings)."""
    roles = member.get("roles") or []
    if not isinstance(roles, list):
        raise PayloadError("discord member: roles must be a list")
    return {str(r) for r in roles}


def member_channel_permissions(d: Mapping[str, Any]) -> int | None:
    """The invoker's permissions in the channel as Discord computed them for this
    interaction (``member.permissions``), or None when the payload lacks them."""
    member = d.get("member")
    raw = member.get("permissions") if isinstance(member, Mapping) else None
    if raw is None:
        return None
    return permission_bits(raw, "discord interaction member.permissions")


def permission_bits(value: Any, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{where}: permission bits must be an integer string") from exc


def _channel_perms(ch: Mapping[str, Any], where: str) -> ChannelPerms:
    overwrites: list[Overwrite] = []
    for o in ch.get("permission_overwrites") or []:
        if not isinstance(o, Mapping):
            raise PayloadError(f"{where}: bad permission overwrite")
        otype = o.get("type")
        if otype in ("role", "member"):  # very old API versions used strings
            otype = 0 if otype == "role" else 1
        if otype not in (0, 1):
            raise PayloadError(f"{where}: overwrite type must be 0 or 1")
        overwrites.append(
            Overwrite(
                id=req_str(o, "id", where),
                type=otype,
                allow=permission_bits(o.get("allow", 0), where),
                deny=permission_bits(o.get("deny", 0), where),
            )
        )
    kind = ch.get("type")
    return ChannelPerms(
        channel_id=req_str(ch, "id", where),
        overwrites=overwrites,
        type=kind if isinstance(kind, int) and not isinstance(kind, bool) else None,
    )


def perms_from_guild_create(
    d: Mapping[str, Any],
) -> tuple[GuildPerms, dict[str, ChannelPerms]]:
    """GUILD_CREATE → (guild perms, channel id → ChannelPerms), threads included.

    Threads (from ``threads``, or thread-typed ``channels``) copy their parent's
    overwrites so a reader of the parent reads the thread.
    """
    where = "discord GUILD_CREATE"
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    guild_id = req_str(d, "id", where)
    roles: dict[str, int] = {}
    for r in d.get("roles") or []:
        if not isinstance(r, Mapping):
            raise PayloadError(f"{where}: bad role entry")
        roles[req_str(r, "id", where)] = permission_bits(r.get("permissions", 0), where)
    guild = GuildPerms(guild_id=guild_id, owner_id=req_str(d, "owner_id", where), roles=roles)

    channels: dict[str, ChannelPerms] = {}
    threads: list[Mapping[str, Any]] = []
    for ch in list(d.get("channels") or []) + list(d.get("threads") or []):
        if not isinstance(ch, Mapping):
            raise PayloadError(f"{where}: bad channel entry")
        if ch.get("type") in THREAD_TYPES:
            threads.append(ch)
        else:
            perms = _channel_perms(ch, where)
            channels[perms.channel_id] = perms
    for th in threads:
        thread_id = req_str(th, "id", where)
        parent_id = req_str(th, "parent_id", where)
        parent = channels.get(parent_id)
        channels[thread_id] = ChannelPerms(
            channel_id=thread_id,
            overwrites=list(parent.overwrites) if parent else [],
            parent_id=parent_id,
            type=th.get("type"),
        )
    return guild, channels


def readable_channels(
    roles: set[str],
    member_id: str,
    guild: GuildPerms,
    channels: Iterable[ChannelPerms],
) -> tuple[str, ...]:
    """Ids of the channels (not threads, not categories) a member can read."""
    return tuple(
        ch.channel_id
        for ch in channels
        if ch.parent_id is None
        and ch.type != CATEGORY
        and can_read_channel(roles, member_id, guild, ch)
    )
