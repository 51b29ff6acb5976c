"""Channels, users, aliases and per-channel rosters."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

from speakermem.memory.governance.policy import Refusal
from speakermem.memory.models import RosterAction, RosterEvent, RosterMember, Scope
from speakermem.memory.roster_cache import ROSTERS
from speakermem.memory.store.database import Database, Transaction
from speakermem.memory.store.policy import PolicyRepo
from speakermem.memory.store.rows import from_ts, to_ts

WORKSPACE_WIDE = "*"
"""Channel value of roster events that concern the whole workspace (renames, guild leaves)."""
MEMBER_CACHE_CHANNELS = ROSTERS
"""Channels whose member lists stay cached (least recently used beyond): as many as keep
their derived values (name indexes) cached, so a list and what is built from it go together."""


def normalise_alias(alias: str) -> str:
    return " ".join(alias.casefold().split())


class ChannelRepo:
    """Channel rows (with their session cursor) and who is in each channel."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.policy = PolicyRepo(db)
        dialect = db.dialect
        self._members_sql = (
            "SELECT r.user_id, coalesce(u.display_name, r.user_id), coalesce(u.is_bot, 0),"
            " r.joined_at, r.left_at,"
            f" (SELECT {dialect.json_array_agg('a.alias', 'a.alias_norm')} FROM user_aliases a"
            "  WHERE a.platform = r.platform AND a.workspace = r.workspace"
            "  AND a.user_id = r.user_id)"
            " FROM roster r LEFT JOIN users u ON u.platform = r.platform"
            " AND u.workspace = r.workspace AND u.user_id = r.user_id"
            f" WHERE r.channel_pk = ? AND ({dialect.truthy('?')} OR r.left_at IS NULL)"
            " ORDER BY r.joined_at, r.user_id"
        )
        """A channel's members with their aliases as a JSON array."""
        """Switches, opt-outs and tombstones, shared by every repository (each has `channels`)."""
        self._pk_cache: dict[tuple[str, str, str], int] = {}
        self._members: OrderedDict[tuple[int, bool], tuple[int, list[RosterMember]]] = OrderedDict()
        """(channel pk, include_left) -> (roster revision, members): see `members`."""

    async def ensure(self, tx: Transaction, scope: Scope) -> int:
        key = scope.key()
        pk = self._pk_cache.get(key)
        if pk is not None:
            return pk
        # A new channel is private until an adapter (or import) says otherwise: privacy
        # that nobody reported must not let the channel answer elsewhere (fail closed).
        await tx.execute(
            "INSERT INTO channels (platform, workspace, channel, created_at, is_private)"
            " VALUES (?, ?, ?, ?, 1) ON CONFLICT (platform, workspace, channel) DO NOTHING",
            (*key, time.time()),
        )
        row = await tx.fetchone(
            "SELECT id FROM channels WHERE platform = ? AND workspace = ? AND channel = ?", key
        )
        pk = int(row[0])
        self._pk_cache[key] = pk
        return pk

    def forget_cache(self) -> None:
        """Drop cached ids (after a rolled-back transaction that may have created channels)."""
        self._pk_cache.clear()

    async def lookup(self, scope: Scope) -> int | None:
        key = scope.key()
        if key in self._pk_cache:
            return self._pk_cache[key]
        rows = await self.db.read(
            "SELECT id FROM channels WHERE platform = ? AND workspace = ? AND channel = ?", key
        )
        if not rows:
            return None
        self._pk_cache[key] = int(rows[0][0])
        return int(rows[0][0])

    async def all(self) -> list[dict[str, Any]]:
        rows = await self.db.read(
            "SELECT c.id, c.platform, c.workspace, c.channel, c.name, c.is_private,"
            " (SELECT count(*) FROM messages m WHERE m.channel_pk = c.id AND m.deleted_at IS NULL),"
            " (SELECT count(*) FROM roster r WHERE r.channel_pk = c.id AND r.left_at IS NULL),"
            " c.session_id"
            " FROM channels c ORDER BY c.platform, c.workspace, c.channel"
        )
        return [
            {
                "pk": r[0],
                "scope": Scope(platform=r[1], workspace=r[2], channel=r[3]),
                "name": r[4],
                "is_private": bool(r[5]),
                "messages": r[6],
                "members": r[7],
                "sessions": r[8],
            }
            for r in rows
        ]

    async def workspaces(self) -> list[tuple[str, str]]:
        """Every (platform, workspace) the store knows from a channel or a user, sorted."""
        rows = await self.db.read(
            "SELECT platform, workspace FROM channels UNION SELECT platform, workspace FROM users"
            " ORDER BY 1, 2"
        )
        return [(r[0], r[1]) for r in rows]

    async def find(self, channel: str, platform: str | None = None) -> list[Scope]:
        """Channels whose id or name is `channel` (CLI convenience)."""
        rows = await self.db.read(
            "SELECT platform, workspace, channel FROM channels"
            " WHERE (channel = ? OR name = ?) AND (? IS NULL OR platform = ?)"
            " ORDER BY platform, workspace",
            (channel, channel, platform, platform),
        )
        return [Scope(platform=r[0], workspace=r[1], channel=r[2]) for r in rows]

    async def set_meta(self, scope: Scope, *, name: str | None, is_private: bool | None) -> None:
        async with self.db.transaction() as tx:
            pk = await self.ensure(tx, scope)
            await tx.execute(
                "UPDATE channels SET name = coalesce(?, name),"
                " is_private = coalesce(?, is_private) WHERE id = ?",
                (name, None if is_private is None else int(is_private), pk),
            )

    async def is_private(self, scope: Scope) -> bool:
        """Unknown channels count as private (fail closed)."""
        rows = await self.db.read(
            "SELECT is_private FROM channels WHERE platform = ? AND workspace = ? AND channel = ?",
            scope.key(),
        )
        return not rows or bool(rows[0][0])

    # ---- roster -------------------------------------------------------------------------

    async def upsert_users(
        self, tx: Transaction, scope: Scope, users: list[tuple[str, str, bool]]
    ) -> None:
        """Record (user_id, display name, is_bot) as seen now; a changed name is a rename.

        Written in user-id order, as every roster and user write is: PostgreSQL locks row by
        row, and two processes syncing one channel's members in different orders (two Slack
        workers, a re-sync racing a join) took each other's rows crosswise and one failed
        with a deadlock. In one order the second waits for the first and then goes on."""
        now = time.time()
        await tx.executemany(
            "INSERT INTO users (platform, workspace, user_id, display_name, is_bot, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (platform, workspace, user_id) DO UPDATE SET"
            " display_name = excluded.display_name, is_bot = excluded.is_bot,"
            " updated_at = excluded.updated_at"
            " WHERE users.display_name != excluded.display_name OR users.is_bot != excluded.is_bot",
            [
                (scope.platform, scope.workspace, uid, name, int(bot), now)
                for uid, name, bot in sorted(users, key=lambda u: u[0])
            ],
        )

    @staticmethod
    async def add_member_rows(tx: Transaction, rows: list[tuple[object, ...]]) -> None:
        """Ensure members for many channels at once: rows of (pk, platform, ws, channel, uid,
        first seen); a member who had left and speaks again is re-joined (in one order: see
        `upsert_users`)."""
        await tx.executemany(
            "INSERT INTO roster (channel_pk, platform, workspace, channel, user_id, joined_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (channel_pk, user_id) DO UPDATE SET left_at = NULL"
            " WHERE roster.left_at IS NOT NULL AND roster.left_at < excluded.joined_at",
            sorted(rows, key=lambda r: (str(r[0]), str(r[4]))),
        )

    async def _forgotten(self, tx: Transaction, scope: Scope, user_id: str) -> bool:
        """Whether `user_id` is a forgotten person: their names are not written back (their
        roster membership still is: it is access, not memory)."""
        await tx.policy_lock(shared=True)
        found = await self.policy.exclusions(scope.platform, scope.workspace, tx)
        return found.reason(user_id) is Refusal.FORGOTTEN

    async def apply(self, event: RosterEvent) -> None:
        scope = event.scope
        at = to_ts(event.at)
        if scope.channel == WORKSPACE_WIDE:
            await self._apply_workspace(event, at)
            return
        async with self.db.transaction() as tx:
            pk = await self.ensure(tx, scope)
            named = not await self._forgotten(tx, scope, event.user_id)
            if event.action is RosterAction.JOIN:
                if named and event.name:
                    await self.upsert_users(tx, scope, [(event.user_id, event.name, event.is_bot)])
                elif named:
                    await tx.execute(
                        "INSERT INTO users (platform, workspace, user_id, display_name, is_bot,"
                        " updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (
                            scope.platform,
                            scope.workspace,
                            event.user_id,
                            event.user_id,
                            int(event.is_bot),
                            at,
                        ),
                    )
                await tx.execute(
                    "INSERT INTO roster (channel_pk, platform, workspace, channel, user_id,"
                    " joined_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (channel_pk, user_id) DO UPDATE SET left_at = NULL,"
                    " joined_at = coalesce(roster.joined_at, excluded.joined_at)",
                    (pk, *scope.key(), event.user_id, at),
                )
            elif event.action is RosterAction.LEAVE:
                await tx.execute(
                    "UPDATE roster SET left_at = ? WHERE channel_pk = ? AND user_id = ?",
                    (at, pk, event.user_id),
                )
            elif event.action is RosterAction.RENAME:
                if not event.name:
                    raise ValueError("a rename needs the new display name")
                if named:
                    await self.upsert_users(tx, scope, [(event.user_id, event.name, event.is_bot)])
            elif event.action is RosterAction.ALIAS:
                if not event.name:
                    raise ValueError("an alias event needs the alias")
                if named:
                    await self._add_alias(tx, scope, event.user_id, event.name)

    @staticmethod
    async def _add_alias(tx: Transaction, scope: Scope, user_id: str, alias: str) -> None:
        await tx.execute(
            "INSERT INTO user_aliases (platform, workspace, user_id, alias, alias_norm)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (scope.platform, scope.workspace, user_id, alias.strip(), normalise_alias(alias)),
        )

    async def _apply_workspace(self, event: RosterEvent, at: float) -> None:
        """Renames and aliases are per user; a workspace leave leaves every channel."""
        scope = event.scope
        async with self.db.transaction() as tx:
            named = not await self._forgotten(tx, scope, event.user_id)
            if not named and event.action is not RosterAction.LEAVE:
                return
            if event.action in (RosterAction.RENAME, RosterAction.JOIN) and event.name:
                await self.upsert_users(tx, scope, [(event.user_id, event.name, event.is_bot)])
            elif event.action is RosterAction.ALIAS and event.name:
                await self._add_alias(tx, scope, event.user_id, event.name)
            elif event.action is RosterAction.LEAVE:
                await tx.execute(
                    "UPDATE roster SET left_at = ? WHERE platform = ? AND workspace = ?"
                    " AND user_id = ? AND left_at IS NULL",
                    (at, scope.platform, scope.workspace, event.user_id),
                )

    async def sync_members(
        self, scope: Scope, listed: list[tuple[str, str | None, bool]], at: float | None = None
    ) -> tuple[int, int]:
        """Make `scope`'s roster exactly `listed` (user id, display name or None, is_bot) in one
        transaction: new members join, known names are updated, members not listed leave.
        Returns (joined or renamed, left). A roster of thousands costs one commit, not one
        per member."""
        at = time.time() if at is None else at
        listed = sorted(listed, key=lambda u: u[0])  # one order (see `upsert_users`)
        async with self.db.transaction() as tx:
            pk = await self.ensure(tx, scope)
            await tx.policy_lock(shared=True)
            exclusions = await self.policy.exclusions(scope.platform, scope.workspace, tx)
            have = {
                r[0]: r[1]
                for r in await tx.fetchall(
                    "SELECT r.user_id, u.display_name FROM roster r LEFT JOIN users u"
                    " ON u.platform = r.platform AND u.workspace = r.workspace"
                    " AND u.user_id = r.user_id WHERE r.channel_pk = ? AND r.left_at IS NULL",
                    (pk,),
                )
            }
            changed = [
                (uid, name, bot)
                for uid, name, bot in listed
                if uid not in have or (name is not None and have[uid] != name)
            ]
            # a forgotten person's name is not written back (their membership is)
            forgotten = {
                uid for uid, _, _ in changed if exclusions.reason(uid) is Refusal.FORGOTTEN
            }
            named = [
                (uid, name, bot)
                for uid, name, bot in changed
                if name is not None and name and uid not in forgotten
            ]
            if named:
                await self.upsert_users(tx, scope, named)
            await tx.executemany(
                "INSERT INTO users (platform, workspace, user_id, display_name, is_bot,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [
                    (*scope.key()[:2], uid, uid, int(bot), at)
                    for uid, nm, bot in changed
                    if not nm and uid not in forgotten
                ],
            )
            await tx.executemany(
                "INSERT INTO roster (channel_pk, platform, workspace, channel, user_id,"
                " joined_at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (channel_pk, user_id) DO UPDATE SET left_at = NULL,"
                " joined_at = coalesce(roster.joined_at, excluded.joined_at)",
                [(pk, *scope.key(), uid, at) for uid, _, _ in changed if uid not in have],
            )
            gone = sorted(have.keys() - {uid for uid, _, _ in listed})
            await tx.executemany(
                "UPDATE roster SET left_at = ? WHERE channel_pk = ? AND user_id = ?",
                [(at, pk, uid) for uid in gone],
            )
            return len(changed), len(gone)

    async def members(self, scope: Scope, *, include_left: bool = False) -> list[RosterMember]:
        """The channel's members, oldest first. Cached per channel until its roster revision
        moves (migration 5): a community channel's thousands of members are read once, not
        on every /recall. The list is shared: callers must not change it."""
        head = await self.db.read(
            "SELECT id, roster_rev FROM channels WHERE platform = ? AND workspace = ?"
            " AND channel = ?",
            scope.key(),
        )
        if not head:
            return []
        pk, rev = int(head[0][0]), int(head[0][1])
        key = (pk, include_left)
        cached = self._members.get(key)
        if cached is not None and cached[0] == rev:
            self._members.move_to_end(key)
            return cached[1]
        rows = await self.db.read(self._members_sql, (pk, int(include_left)))
        members = [
            RosterMember(
                user_id=r[0],
                display_name=r[1],
                is_bot=bool(r[2]),
                joined_at=from_ts(r[3]),
                left_at=from_ts(r[4]),
                aliases=tuple(json.loads(r[5] or "[]")),
            )
            for r in rows
        ]
        self._members[key] = (rev, members)
        while len(self._members) > MEMBER_CACHE_CHANNELS:
            self._members.popitem(last=False)
        return members

    async def readable_channels(self, platform: str, workspace: str, user_id: str) -> list[Scope]:
        """Channels whose current roster holds the user (the default read permission)."""
        rows = await self.db.read(
            "SELECT channel FROM roster WHERE platform = ? AND workspace = ? AND user_id = ?"
            " AND left_at IS NULL",
            (platform, workspace, user_id),
        )
        return [Scope(platform=platform, workspace=workspace, channel=r[0]) for r in rows]

    async def find_user(self, platform: str, workspace: str, name_or_id: str) -> list[str]:
        """User ids whose id, display name or alias equals `name_or_id` (case-insensitive)."""
        norm = normalise_alias(name_or_id)
        rows = await self.db.read(
            "SELECT user_id FROM users WHERE platform = ? AND workspace = ?"
            " AND (user_id = ? OR lower(display_name) = ?)"
            " UNION SELECT user_id FROM user_aliases WHERE platform = ? AND workspace = ?"
            " AND alias_norm = ?",
            (platform, workspace, name_or_id, norm, platform, workspace, norm),
        )
        return sorted({r[0] for r in rows})
