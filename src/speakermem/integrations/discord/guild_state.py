"""Guild state: who can read which channel, kept from raw gateway payloads (no client).

As discord.py's ``ConnectionState`` parses each dispatch into its cache, `GuildRoster` turns
the guild, role, channel, thread and member dispatches into `GuildState` and answers with a
`GuildChange`: the channel metadata to record, what was deleted on Discord, and the
`RosterEvent`s that bring the store's roster to who can read each text channel now. It does
no I/O, so every permission rule is tested with literal payloads; the adapter applies the
change (integrations/discord/adapter.py).

The roster of a text channel is the set of guild members who can view it, computed from
roles, channel overwrites and member roles (`translate.readable_channels`). It is
reconciled on GUILD_CREATE and kept live from member add/remove/update (role changes),
channel create/update/delete (overwrites) and role changes. `granted` remembers which user
ids the roster holds per channel (as far as this process wrote it), so each change sends
only the JOINs and LEAVEs it causes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from speakermem.bot.events import RosterAction, RosterEvent, Scope
from speakermem.integrations.discord import translate as tr
from speakermem.integrations.discord.members import PermissionCache
from speakermem.integrations.discord.permissions import CATEGORY
from speakermem.integrations.payload import PayloadError, opt_str, req_dict, req_str

__all__ = [
    "PRIVATE_THREAD",
    "ChannelDeleted",
    "ChannelMeta",
    "Deletion",
    "GuildChange",
    "GuildLeft",
    "GuildRoster",
    "GuildState",
    "MemberInfo",
    "ThreadDeleted",
]

log = logging.getLogger(__name__)

PRIVATE_THREAD = 12
"""The channel type of a private thread (its messages are not stored)."""


def scope_of(guild_id: str, channel: str) -> Scope:
    return Scope(platform=tr.PLATFORM, workspace=guild_id, channel=channel)


@dataclass(frozen=True)
class MemberInfo:
    roles: frozenset[str]
    name: str | None
    is_bot: bool


@dataclass
class GuildState:
    """What the permission computation needs, kept from raw gateway payloads."""

    perms: tr.GuildPerms
    channels: dict[str, tr.ChannelPerms] = field(default_factory=dict)
    """Text-ish channels and categories (no threads)."""
    names: dict[str, str] = field(default_factory=dict)
    threads: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    """thread id → (parent channel id, thread type)."""
    members: dict[str, MemberInfo] = field(default_factory=dict)
    member_count: int = 0

    @classmethod
    def from_guild_create(cls, d: Mapping[str, Any]) -> GuildState:
        perms, channels = tr.perms_from_guild_create(d)
        state = cls(perms=perms)
        for ch in [*(d.get("channels") or []), *(d.get("threads") or [])]:
            state.put_channel(ch, channels)
        for m in d.get("members") or []:
            state.put_member(m)
        count = d.get("member_count")
        state.member_count = count if isinstance(count, int) else len(state.members)
        return state

    @property
    def guild_id(self) -> str:
        return self.perms.guild_id

    @property
    def complete(self) -> bool:
        """Whether every member is known (large guilds arrive in chunks)."""
        return len(self.members) >= self.member_count

    def parse_channel(self, ch: Mapping[str, Any]) -> tr.ChannelPerms:
        fake = {"id": self.guild_id, "owner_id": self.perms.owner_id, "channels": [ch]}
        _perms, parsed = tr.perms_from_guild_create(fake)
        return parsed[req_str(ch, "id", "discord channel")]

    def put_channel(
        self, ch: Mapping[str, Any], parsed: Mapping[str, tr.ChannelPerms] | None = None
    ) -> str:
        if not isinstance(ch, Mapping):
            raise PayloadError("discord channel: expected an object")
        cid = req_str(ch, "id", "discord channel")
        kind = ch.get("type")
        if kind in tr.THREAD_TYPES:
            parent = req_str(ch, "parent_id", "discord thread")
            self.threads[cid] = (parent, kind if isinstance(kind, int) else None)
            return cid
        self.channels[cid] = parsed[cid] if parsed and cid in parsed else self.parse_channel(ch)
        name = ch.get("name")
        if isinstance(name, str) and name:
            self.names[cid] = name
        return cid

    def put_member(self, m: Mapping[str, Any]) -> str:
        if not isinstance(m, Mapping):
            raise PayloadError("discord member: expected an object")
        user = req_dict(m, "user", "discord member")
        uid = req_str(user, "id", "discord member")
        self.members[uid] = MemberInfo(
            roles=frozenset(tr.member_roles(m)),
            name=tr.display_name(user, m),
            is_bot=bool(user.get("bot")),
        )
        return uid

    def text_channels(self) -> list[str]:
        return [cid for cid, ch in self.channels.items() if ch.type != CATEGORY]

    def can_read(self, uid: str, channel_id: str, roles: Iterable[str] | None = None) -> bool:
        ch = self.channels.get(channel_id)
        if ch is None:
            return False
        if roles is None:
            info = self.members.get(uid)
            if info is None:
                return False
            roles = info.roles
        return tr.can_read_channel(set(roles), uid, self.perms, ch)

    def readable(self, uid: str, roles: Iterable[str] | None = None) -> tuple[str, ...]:
        """The text channels `uid` can read, with `roles` or (None) the roles known for them;
        an unknown member reads nothing (fail closed)."""
        if roles is None:
            info = self.members.get(uid)
            if info is None:
                return ()
            roles = info.roles
        return tr.readable_channels(set(roles), uid, self.perms, self.channels.values())

    def is_private(self, channel_id: str) -> bool:
        """Private = @everyone cannot view it."""
        ch = self.channels.get(channel_id)
        return ch is not None and not tr.can_read_channel(set(), "", self.perms, ch)

    def parents(self) -> dict[str, str]:
        return {tid: parent for tid, (parent, _kind) in self.threads.items()}


# --- what a dispatch changes -------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelMeta:
    """A text channel's name and privacy, to record in the store."""

    scope: Scope
    name: str | None
    is_private: bool


@dataclass(frozen=True)
class GuildLeft:
    """The bot was removed from the guild, or the guild was deleted."""

    guild_id: str


@dataclass(frozen=True)
class ChannelDeleted:
    scope: Scope


@dataclass(frozen=True)
class ThreadDeleted:
    scope: Scope
    """The thread's parent channel; without a parent, the thread as a channel of its own."""
    thread_id: str


Deletion = GuildLeft | ChannelDeleted | ThreadDeleted
"""Something deleted on Discord whose memory is forgotten (memory/governance/deletions.py)."""


@dataclass
class GuildChange:
    """What one dispatch changes, applied in this order: deletions, channel metadata, roster
    events (each in the order given)."""

    deletions: list[Deletion] = field(default_factory=list)
    channels: list[ChannelMeta] = field(default_factory=list)
    roster: list[RosterEvent] = field(default_factory=list)


# --- the roster, kept from guild dispatches ----------------------------------------------------


class GuildRoster:
    """Guild states by id, the roster written per channel, and cached read permissions."""

    def __init__(self) -> None:
        self.guilds: dict[str, GuildState] = {}
        self.granted: dict[str, dict[str, set[str]]] = {}
        """guild → channel → user ids the store's roster holds (as far as we wrote it)."""
        self.permissions = PermissionCache()
        """Readable channels per (member, roles), dropped on permission changes."""
        self._parsers: dict[str, Callable[[dict[str, Any]], GuildChange]] = {
            "GUILD_UPDATE": self.guild_update,
            "GUILD_DELETE": self.guild_delete,
            "GUILD_ROLE_CREATE": self.role_update,
            "GUILD_ROLE_UPDATE": self.role_update,
            "GUILD_ROLE_DELETE": self.role_delete,
            "CHANNEL_CREATE": self.channel_update,
            "CHANNEL_UPDATE": self.channel_update,
            "CHANNEL_DELETE": self.channel_delete,
            "THREAD_CREATE": self.thread_update,
            "THREAD_UPDATE": self.thread_update,
            "THREAD_DELETE": self.thread_delete,
            "THREAD_LIST_SYNC": self.thread_list_sync,
            "GUILD_MEMBER_ADD": self.member_add,
            "GUILD_MEMBER_REMOVE": self.member_remove,
            "GUILD_MEMBER_UPDATE": self.member_update,
            "GUILD_MEMBERS_CHUNK": self.members_chunk,
        }

    def parse(self, event: str, d: dict[str, Any]) -> GuildChange:
        """Any guild dispatch but GUILD_CREATE (two steps: `add_guild`, then `seed`)."""
        return self._parsers[event](d)

    def _state(self, d: Mapping[str, Any], where: str) -> GuildState | None:
        gid = opt_str(d, "guild_id", where)
        state = self.guilds.get(gid) if gid else None
        if state is None:
            log.debug("%s for unknown guild %s; ignored", where, gid)
        return state

    def channel_meta(self, state: GuildState, cid: str) -> list[ChannelMeta]:
        """The metadata to record for `cid` (none for a category or an unknown channel)."""
        ch = state.channels.get(cid)
        if ch is None or ch.type == CATEGORY:
            return []
        scope = scope_of(state.guild_id, cid)
        return [ChannelMeta(scope, state.names.get(cid), state.is_private(cid))]

    def reconcile(
        self,
        state: GuildState,
        *,
        channels: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
        leaves: bool = True,
    ) -> list[RosterEvent]:
        """The JOINs and LEAVEs that bring the roster of `channels` × `users` (default all) to
        who can read; `granted` is updated as if they were applied."""
        if users is None:  # a role, overwrite or guild change: any cached answer may be stale
            self.permissions.invalidate_guild(state.guild_id)
        else:
            users = list(users)
            for uid in users:
                self.permissions.invalidate_member(state.guild_id, uid)
        granted = self.granted.setdefault(state.guild_id, {})
        targets = list(channels) if channels is not None else state.text_channels()
        only = set(users) if users is not None else None
        events: list[RosterEvent] = []
        for cid in targets:
            have = granted.setdefault(cid, set())
            pool = only if only is not None else set(state.members) | have
            want = {u for u in pool if u in state.members and state.can_read(u, cid)}
            current = have & pool
            scope = scope_of(state.guild_id, cid)
            for uid in sorted(want - current):
                info = state.members[uid]
                events.append(
                    RosterEvent(
                        scope=scope,
                        action=RosterAction.JOIN,
                        user_id=uid,
                        name=info.name,
                        is_bot=info.is_bot,
                    )
                )
                have.add(uid)
            if leaves:
                for uid in sorted(current - want):
                    events.append(RosterEvent(scope=scope, action=RosterAction.LEAVE, user_id=uid))
                    have.discard(uid)
        return events

    # ---- guilds -----------------------------------------------------------------------------

    def add_guild(self, d: Mapping[str, Any]) -> GuildState | None:
        """GUILD_CREATE, step one: the guild's state (None while it is unavailable). The
        adapter then records `channel_meta` of each text channel, reads who the store's
        roster holds, and calls `seed`."""
        if d.get("unavailable"):
            return None
        state = GuildState.from_guild_create(d)
        self.guilds[state.guild_id] = state
        return state

    def seed(self, state: GuildState, held: dict[str, set[str]]) -> list[RosterEvent]:
        """GUILD_CREATE, step two: from what the roster holds (`held`, channel → user ids)
        to who can read now; leaves only once every member is known."""
        self.granted[state.guild_id] = held
        return self.reconcile(state, leaves=state.complete)

    def guild_update(self, d: dict[str, Any]) -> GuildChange:
        state = self.guilds.get(req_str(d, "id", "discord GUILD_UPDATE"))
        if state is None:
            return GuildChange()
        perms, _ = tr.perms_from_guild_create({**d, "channels": [], "threads": []})
        if not d.get("roles"):
            perms = perms.model_copy(update={"roles": state.perms.roles})
        state.perms = perms
        return GuildChange(roster=self.reconcile(state, leaves=state.complete))

    def guild_delete(self, d: dict[str, Any]) -> GuildChange:
        """Removed from the guild (kicked, or it was deleted): what it held is forgotten.
        ``unavailable: true`` is an outage of the guild, not a deletion: nothing changes."""
        if d.get("unavailable"):
            return GuildChange()
        gid = req_str(d, "id", "discord GUILD_DELETE")
        self.guilds.pop(gid, None)
        self.granted.pop(gid, None)
        log.info("discord: removed from guild %s", gid)
        return GuildChange(deletions=[GuildLeft(gid)])

    def role_update(self, d: dict[str, Any]) -> GuildChange:
        """GUILD_ROLE_CREATE and GUILD_ROLE_UPDATE."""
        state = self._state(d, "discord GUILD_ROLE")
        if state is None:
            return GuildChange()
        role = req_dict(d, "role", "discord GUILD_ROLE")
        rid = req_str(role, "id", "discord GUILD_ROLE")
        try:
            bits = int(role.get("permissions", 0))
        except (TypeError, ValueError) as exc:
            raise PayloadError("discord GUILD_ROLE: bad permissions") from exc
        state.perms = state.perms.model_copy(update={"roles": {**state.perms.roles, rid: bits}})
        return GuildChange(roster=self.reconcile(state, leaves=state.complete))

    def role_delete(self, d: dict[str, Any]) -> GuildChange:
        state = self._state(d, "discord GUILD_ROLE_DELETE")
        if state is None:
            return GuildChange()
        rid = req_str(d, "role_id", "discord GUILD_ROLE_DELETE")
        roles = {k: v for k, v in state.perms.roles.items() if k != rid}
        state.perms = state.perms.model_copy(update={"roles": roles})
        return GuildChange(roster=self.reconcile(state, leaves=state.complete))

    # ---- channels and threads ---------------------------------------------------------------

    def channel_update(self, d: dict[str, Any]) -> GuildChange:
        """CHANNEL_CREATE and CHANNEL_UPDATE (a thread-typed one is kept as a thread)."""
        state = self._state(d, "discord CHANNEL")
        if state is None:
            return GuildChange()
        cid = state.put_channel(d)
        if cid in state.threads:
            return GuildChange()
        change = GuildChange(channels=self.channel_meta(state, cid))
        # a category's overwrites do not reach its channels until they are synced (their
        # own CHANNEL_UPDATE arrives then), so only this channel needs recomputing
        if state.channels[cid].type != CATEGORY:
            change.roster = self.reconcile(state, channels=[cid], leaves=state.complete)
        return change

    def channel_delete(self, d: dict[str, Any]) -> GuildChange:
        """A deleted channel: everything it held is forgotten (its threads' replies are
        stored in it), then it leaves the roster."""
        cid = req_str(d, "id", "discord CHANNEL_DELETE")
        gid = opt_str(d, "guild_id", "discord CHANNEL_DELETE")
        change = GuildChange()
        if gid:
            change.deletions.append(ChannelDeleted(scope_of(gid, cid)))
        state = self._state(d, "discord CHANNEL_DELETE")
        if state is None:
            return change
        self.permissions.invalidate_guild(state.guild_id)
        state.threads.pop(cid, None)
        if state.channels.pop(cid, None) is None:
            return change
        scope = scope_of(state.guild_id, cid)
        for uid in sorted(self.granted.get(state.guild_id, {}).pop(cid, set())):
            change.roster.append(RosterEvent(scope=scope, action=RosterAction.LEAVE, user_id=uid))
        return change

    def thread_update(self, d: dict[str, Any]) -> GuildChange:
        """THREAD_CREATE and THREAD_UPDATE: a thread reads as its parent does."""
        state = self._state(d, "discord THREAD")
        if state is not None:
            state.put_channel(d)
        return GuildChange()

    def thread_delete(self, d: dict[str, Any]) -> GuildChange:
        """A deleted thread: its replies (stored in its parent channel) are forgotten."""
        where = "discord THREAD_DELETE"
        tid = req_str(d, "id", where)
        gid = opt_str(d, "guild_id", where)
        parent = opt_str(d, "parent_id", where)
        state = self._state(d, where)
        if state is not None:
            known = state.threads.pop(tid, None)
            parent = parent or (known[0] if known else None)
        if not gid:
            return GuildChange()
        # without a parent: a thread whose messages were stored as a channel of its own
        return GuildChange(deletions=[ThreadDeleted(scope_of(gid, parent or tid), tid)])

    def thread_list_sync(self, d: dict[str, Any]) -> GuildChange:
        state = self._state(d, "discord THREAD_LIST_SYNC")
        if state is None:
            return GuildChange()
        for th in d.get("threads") or []:
            try:
                state.put_channel(th)
            except PayloadError as exc:
                log.warning("discord: skipped thread in THREAD_LIST_SYNC: %s", exc)
        return GuildChange()

    # ---- members ----------------------------------------------------------------------------

    def member_add(self, d: dict[str, Any]) -> GuildChange:
        event = tr.member_add(d)
        change = GuildChange(roster=[event])  # the user's name, guild-wide
        state = self.guilds.get(event.scope.workspace)
        if state is None:
            return change
        if event.user_id not in state.members:
            state.member_count += 1
        state.put_member(d)
        change.roster += self.reconcile(state, users=[event.user_id])
        return change

    def member_remove(self, d: dict[str, Any]) -> GuildChange:
        event = tr.member_remove(d)
        change = GuildChange(roster=[event])  # leaves every channel of the guild
        state = self.guilds.get(event.scope.workspace)
        if state is None:
            return change
        self.permissions.invalidate_member(state.guild_id, event.user_id)
        if state.members.pop(event.user_id, None) is not None:
            state.member_count = max(0, state.member_count - 1)
        for have in self.granted.get(state.guild_id, {}).values():
            have.discard(event.user_id)
        return change

    def member_update(self, d: dict[str, Any]) -> GuildChange:
        event = tr.member_update(d)
        state = self.guilds.get(event.scope.workspace)
        before = state.members.get(event.user_id) if state is not None else None
        change = GuildChange()
        if event.name and (before is None or before.name != event.name):
            change.roster.append(event)  # guild-wide rename (channel "*")
        if state is None:
            return change
        if before is None:
            state.member_count += 1
        state.put_member(d)
        change.roster += self.reconcile(state, users=[event.user_id])
        return change

    def members_chunk(self, d: dict[str, Any]) -> GuildChange:
        state = self._state(d, "discord GUILD_MEMBERS_CHUNK")
        if state is None:
            return GuildChange()
        users: list[str] = []
        for m in d.get("members") or []:
            try:
                users.append(state.put_member(m))
            except PayloadError as exc:
                log.warning("discord: skipped member in chunk: %s", exc)
        change = GuildChange(roster=self.reconcile(state, users=users))
        last = d.get("chunk_index") == (d.get("chunk_count") or 1) - 1
        if last and state.complete:
            change.roster += self.reconcile(state)  # now leaves are known too
        return change

    def learn_author(
        self, guild_id: str | None, member: Mapping[str, Any]
    ) -> list[RosterEvent] | None:
        """A member not known yet (no start-up chunks), from the GUILD_MEMBER-shaped payload
        their message carries (`members.member_from_message`): their channels' JOINs. None
        when there is nothing to learn (a known member, an unknown guild)."""
        state = self.guilds.get(guild_id or "")
        if state is None or member["user"]["id"] in state.members:
            return None
        uid = state.put_member(member)
        return self.reconcile(state, users=[uid])

    def channel_names(self) -> dict[Scope, str]:
        return {
            scope_of(gid, cid): name
            for gid, state in self.guilds.items()
            for cid, name in state.names.items()
        }
