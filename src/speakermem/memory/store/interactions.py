"""The interaction graph: inferred addressees and reply links per message.

The inference itself is pure (`memory.interactions`); this repository feeds it each
channel's new messages in order, with the last few earlier turns as context, and keeps a
per-channel cursor so each message is read once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import numpy as np

from speakermem.memory.interactions import WINDOW, NameIndex, Turn, infer
from speakermem.memory.models import Scope
from speakermem.memory.store.database import Database
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.vectors import rescore

_COLUMNS = "id, speaker_id, text, ts, session_id, message_id, reply_to, addressees, deleted_at"


def _turn(r: tuple) -> Turn:  # type: ignore[type-arg]
    return Turn(
        pk=r[0],
        speaker_id=r[1],
        text=r[2],
        ts=r[3],
        session_id=r[4],
        message_id=r[5],
        reply_to=r[6],
        addressees=tuple(json.loads(r[7] or "[]")),
    )


class InteractionRepo:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._locks: dict[int, asyncio.Lock] = {}
        dialect = db.dialect
        # inferred addressees and links: the same keys again, the last write wins
        self._addressee_upsert = dialect.upsert(
            "message_addressees", ("message_pk", "addressee", "how"), ("message_pk", "addressee")
        )
        self._link_upsert = dialect.upsert(
            "message_links", ("message_pk", "parent_pk", "how"), ("message_pk",)
        )
        self._cursor_upsert = (
            "INSERT INTO interaction_cursor (channel_pk, last_pk) VALUES (?, ?)"
            " ON CONFLICT (channel_pk) DO UPDATE SET last_pk ="
            f" {dialect.greatest('interaction_cursor.last_pk', 'excluded.last_pk')}"
        )
        """Where the channel's pass stands. It only moves forward: passes in two processes
        may overlap, and the one that read less must not move the cursor back over what
        the other already read."""

    async def update(
        self, channel_pk: int, names: NameIndex, *, limit: int = 5_000, wait: bool = True
    ) -> int:
        """Infer addressees and reply links for up to `limit` new messages of a channel;
        returns how many were read (0: the channel is up to date). `wait=False` returns 0 at
        once when another pass is already reading the channel (a /recall does not queue
        behind the background worker)."""
        lock = self._locks.setdefault(channel_pk, asyncio.Lock())
        if not wait and lock.locked():
            return 0
        async with lock:
            rows = await self.db.read(
                "SELECT last_pk FROM interaction_cursor WHERE channel_pk = ?", (channel_pk,)
            )
            cursor = rows[0][0] if rows else 0
            # Past a cursor, walk the rowid range (live: the few messages since the last
            # pass; the channel index would read the whole channel to sort it). A channel
            # never read starts from its own index instead.
            channel_term = "+channel_pk" if cursor else "channel_pk"
            new = await self.db.read(
                f"SELECT {_COLUMNS} FROM messages WHERE {channel_term} = ? AND id > ?"
                " ORDER BY id LIMIT ?",
                (channel_pk, cursor, limit),
            )
            if not new:
                return 0
            history = await self.db.read(
                f"SELECT {_COLUMNS} FROM messages WHERE channel_pk = ? AND id <= ?"
                " AND deleted_at IS NULL ORDER BY id DESC LIMIT ?",
                (channel_pk, cursor, WINDOW),
            )
            turns = [_turn(r) for r in new if r[8] is None]
            # pure CPU work over up to `limit` turns: off the event loop
            inferred = await asyncio.to_thread(
                infer, turns, names, history=[_turn(r) for r in reversed(history)]
            )
            async with self.db.transaction() as tx:
                await tx.executemany(
                    self._addressee_upsert,
                    [(i.pk, uid, how) for i in inferred for uid, how in i.addressees],
                )
                await tx.executemany(
                    self._link_upsert,
                    [(i.pk, i.parent, i.parent_how) for i in inferred if i.parent is not None],
                )
                await tx.execute(self._cursor_upsert, (channel_pk, new[-1][0]))
            return len(new)

    async def behind(self) -> list[tuple[int, Scope]]:
        """Channels with messages the graph has not read yet: (channel pk, scope)."""
        rows = await self.db.read(
            "SELECT c.id, c.platform, c.workspace, c.channel FROM"
            " (SELECT channel_pk, max(id) AS last FROM messages GROUP BY channel_pk) m"
            " JOIN channels c ON c.id = m.channel_pk"
            " LEFT JOIN interaction_cursor ic ON ic.channel_pk = m.channel_pk"
            " WHERE m.last > coalesce(ic.last_pk, 0)"
        )
        return [(int(r[0]), Scope(platform=r[1], workspace=r[2], channel=r[3])) for r in rows]

    async def addressees(self, pks: Sequence[int]) -> dict[int, list[tuple[str, str]]]:
        """pk -> [(addressee, how)]."""
        rows = await self.db.read_in(
            "SELECT message_pk, addressee, how FROM message_addressees"
            " WHERE message_pk IN ({marks})",
            pks,
        )
        out: dict[int, list[tuple[str, str]]] = {}
        for pk, uid, how in rows:
            out.setdefault(pk, []).append((uid, how))
        return out

    async def parents(self, pks: Sequence[int]) -> dict[int, tuple[int, str]]:
        """pk -> (parent pk, how it was found)."""
        rows = await self.db.read_in(
            "SELECT message_pk, parent_pk, how FROM message_links WHERE message_pk IN ({marks})",
            pks,
        )
        return {r[0]: (r[1], r[2]) for r in rows}

    async def replies(self, pks: Sequence[int]) -> dict[int, list[tuple[int, str]]]:
        """pk -> [(reply pk, how it was found)]: tagged replies first, then those addressed
        to the speaker, then by shared words, then the plain next turns; earliest first."""
        rows = await self.db.read_in(
            "SELECT l.parent_pk, l.message_pk, l.how FROM message_links l"
            " JOIN messages m ON m.id = l.message_pk"
            " WHERE l.parent_pk IN ({marks}) AND m.deleted_at IS NULL ORDER BY"
            " CASE l.how WHEN 'explicit' THEN 0 WHEN 'addressed' THEN 1 WHEN 'overlap' THEN 2"
            " ELSE 3 END, l.message_pk",
            pks,
        )
        out: dict[int, list[tuple[int, str]]] = {}
        for parent, child, how in rows:
            out.setdefault(parent, []).append((child, how))
        return out

    async def relation_dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        addressee: str,
        speakers: Sequence[str],
        limit: int,
        *,
        max_messages: int,
    ) -> list[tuple[int, float]]:
        """Messages to `addressee` (from `speakers`, or anyone when empty), with the
        addressee's replies to them, ranked by exact cosine to the query.

        Left empty when the relation holds more than `max_messages` messages: too broad to
        narrow anything, and too costly to score exactly.
        """
        if not channel_pks:
            return []
        cm, channels = in_list(channel_pks)
        sql = (
            "SELECT m.id FROM message_addressees a JOIN messages m ON m.id = a.message_pk"
            f" WHERE a.addressee = ? AND m.channel_pk IN ({cm}) AND m.deleted_at IS NULL"
        )
        params: list[object] = [addressee, *channels]
        speakers = [s for s in speakers if s != addressee]
        if speakers:
            sm, padded = in_list(speakers)
            sql += f" AND m.speaker_id IN ({sm})"
            params.extend(padded)
        sql += " LIMIT ?"
        params.append(max_messages + 1)
        told = [r[0] for r in await self.db.read(sql, params)]
        if not told or len(told) > max_messages:
            return []
        answers = await self.db.read_in(
            "SELECT l.message_pk FROM message_links l JOIN messages m ON m.id = l.message_pk"
            " WHERE m.speaker_id = ? AND l.parent_pk IN ({marks})",
            told,
            before=(addressee,),
        )
        pks = list(dict.fromkeys([*told, *(r[0] for r in answers)]))
        blobs = await self.db.read_in(
            "SELECT id, embedding FROM message_vectors WHERE id IN ({marks})", pks
        )
        if not blobs:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        return await asyncio.to_thread(rescore, [(r[0], r[1]) for r in blobs], q, limit)
