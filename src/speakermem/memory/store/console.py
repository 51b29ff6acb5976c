"""Reads for the web console that no other repository answers: aggregates per channel and
per person, a page of a workspace's people, the addressee graph's edge counts.

Plain SQL that SQLite and PostgreSQL both run, so `PgStore` uses this class as it is. Every
query is bounded (LIMIT, an index range or a GROUP BY over one channel's rows), so a page
stays fast on a store of a million messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speakermem.memory.models import DerivedRecord, StoredMessage
from speakermem.memory.store.channels import ChannelRepo, normalise_alias
from speakermem.memory.store.database import Database
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.rows import (
    MESSAGE_COLUMNS,
    RECORD_COLUMNS,
    message_from_row,
    record_from_row,
)

EARLIEST = -1e18
"""A time before every message (a channel with fewer messages than the window)."""


@dataclass(frozen=True)
class PersonRow:
    """A workspace member as the console lists them."""

    user_id: str
    display_name: str
    is_bot: bool
    aliases: tuple[str, ...]
    opted_out: bool


@dataclass(frozen=True)
class PersonCounts:
    """How many active records of a channel are about (owner) and from (source) a person."""

    person: str
    about: int
    provided: int


class ConsoleRepo:
    def __init__(self, db: Database, channels: ChannelRepo) -> None:
        self.db = db
        self.channels = channels

    async def active_records_per_channel(self) -> dict[int, int]:
        """Channel pk -> its active records."""
        rows = await self.db.read(
            "SELECT channel_pk, count(*) FROM records WHERE state = 'active' GROUP BY channel_pk"
        )
        return {int(r[0]): int(r[1]) for r in rows}

    async def record_people(self, channel_pk: int) -> list[PersonCounts]:
        """Everyone the channel's active records are about or came from, most records first
        (the group-scoped records appear as the person "GROUP")."""
        about = await self.db.read(
            "SELECT owner, count(*) FROM records WHERE channel_pk = ? AND state = 'active'"
            " GROUP BY owner",
            (channel_pk,),
        )
        provided = await self.db.read(
            "SELECT source, count(*) FROM records WHERE channel_pk = ? AND state = 'active'"
            " GROUP BY source",
            (channel_pk,),
        )
        counts: dict[str, list[int]] = {}
        for person, n in about:
            counts.setdefault(person, [0, 0])[0] = int(n)
        for person, n in provided:
            counts.setdefault(person, [0, 0])[1] = int(n)
        out = [PersonCounts(p, a, s) for p, (a, s) in counts.items()]
        out.sort(key=lambda c: (-(c.about + c.provided), c.person))
        return out

    async def person_records(
        self, channel_pks: Sequence[int], person: str, *, limit: int, offset: int = 0
    ) -> tuple[list[DerivedRecord], int]:
        """A page of these channels' active records about or from `person`, newest first,
        and how many there are in all."""
        if not channel_pks:
            return [], 0
        marks, pks = in_list(channel_pks)
        where = (
            f"FROM records WHERE channel_pk IN ({marks}) AND state = 'active'"
            " AND (owner = ? OR source = ?)"
        )
        params = [*pks, person, person]
        total = await self.db.read(f"SELECT count(*) {where}", params)
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} {where} ORDER BY time DESC, id DESC LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
        return [record_from_row(r) for r in rows], int(total[0][0])

    async def speaker_messages(
        self, channel_pks: Sequence[int], user_id: str, *, limit: int
    ) -> tuple[list[StoredMessage], int]:
        """The person's latest stored messages in these channels, and how many there are."""
        if not channel_pks:
            return [], 0
        marks, pks = in_list(channel_pks)
        where = (
            f"FROM messages WHERE channel_pk IN ({marks}) AND speaker_id = ? AND deleted_at IS NULL"
        )
        total = await self.db.read(f"SELECT count(*) {where}", [*pks, user_id])
        rows = await self.db.read(
            f"SELECT {MESSAGE_COLUMNS} {where} ORDER BY ts DESC, id DESC LIMIT ?",
            [*pks, user_id, limit],
        )
        return [message_from_row(r) for r in rows], int(total[0][0])

    async def on_roster(self, channel_pks: Sequence[int], user_id: str) -> bool:
        """Whether the user is or was on the roster of one of these channels."""
        if not channel_pks:
            return False
        marks, pks = in_list(channel_pks)
        rows = await self.db.read(
            f"SELECT 1 FROM roster WHERE channel_pk IN ({marks}) AND user_id = ? LIMIT 1",
            [*pks, user_id],
        )
        return bool(rows)

    async def addressee_edges(
        self, channel_pk: int, *, last_messages: int, limit: int
    ) -> list[tuple[str, str, int]]:
        """(speaker, addressee, messages) over the channel's latest `last_messages` messages,
        the busiest pairs first: who talks to whom, from the inferred addressee graph."""
        cutoff = await self.db.read(
            "SELECT ts FROM messages WHERE channel_pk = ? ORDER BY ts DESC LIMIT 1 OFFSET ?",
            (channel_pk, max(0, last_messages - 1)),
        )
        since = float(cutoff[0][0]) if cutoff else EARLIEST
        rows = await self.db.read(
            "SELECT m.speaker_id, a.addressee, count(*) FROM messages m"
            " JOIN message_addressees a ON a.message_pk = m.id"
            " WHERE m.channel_pk = ? AND m.ts >= ? AND m.deleted_at IS NULL"
            " AND a.addressee != m.speaker_id"
            " GROUP BY m.speaker_id, a.addressee ORDER BY count(*) DESC, m.speaker_id, a.addressee"
            " LIMIT ?",
            (channel_pk, since, limit),
        )
        return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]

    async def people(
        self,
        platform: str,
        workspace: str,
        *,
        query: str = "",
        channel_pks: Sequence[int] | None = None,
        limit: int,
        offset: int = 0,
    ) -> tuple[list[PersonRow], int]:
        """A page of the workspace's known people (display name order) whose name, alias or
        id contains `query`, only those on these channels' current rosters when given; and
        the total."""
        if channel_pks is not None and not channel_pks:
            return [], 0
        where = "FROM users u WHERE u.platform = ? AND u.workspace = ?"
        params: list[object] = [platform, workspace]
        text = normalise_alias(query)
        if text:
            like = f"%{_escape_like(text)}%"
            where += (
                " AND (lower(u.display_name) LIKE ? ESCAPE '\\' OR lower(u.user_id) = ?"
                " OR u.user_id IN (SELECT a.user_id FROM user_aliases a WHERE a.platform = ?"
                " AND a.workspace = ? AND a.alias_norm LIKE ? ESCAPE '\\'))"
            )
            params += [like, text, platform, workspace, like]
        if channel_pks is not None:
            marks, pks = in_list(sorted(set(channel_pks)))
            where += (
                " AND u.user_id IN (SELECT r.user_id FROM roster r"
                f" WHERE r.channel_pk IN ({marks}) AND r.left_at IS NULL)"
            )
            params += pks
        total = await self.db.read(f"SELECT count(*) {where}", params)
        rows = await self.db.read(
            f"SELECT u.user_id, u.display_name, u.is_bot {where}"
            " ORDER BY lower(u.display_name), u.user_id LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
        ids = [str(r[0]) for r in rows]
        aliases: dict[str, list[str]] = {}
        opted: set[str] = set()
        if ids:
            marks, padded = in_list(ids)
            for uid, alias in await self.db.read(
                "SELECT user_id, alias FROM user_aliases WHERE platform = ? AND workspace = ?"
                f" AND user_id IN ({marks}) ORDER BY alias_norm",
                [platform, workspace, *padded],
            ):
                aliases.setdefault(str(uid), []).append(str(alias))
            opted = {
                str(r[0])
                for r in await self.db.read(
                    "SELECT user_id FROM user_prefs WHERE platform = ? AND workspace = ?"
                    f" AND opted_out = 1 AND user_id IN ({marks})",
                    [platform, workspace, *padded],
                )
            }
        people = [
            PersonRow(
                user_id=str(r[0]),
                display_name=str(r[1]),
                is_bot=bool(r[2]),
                aliases=tuple(aliases.get(str(r[0]), ())),
                opted_out=str(r[0]) in opted,
            )
            for r in rows
        ]
        return people, int(total[0][0])


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
