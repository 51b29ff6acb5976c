"""System 1: verbatim messages, their sessions and segments, and their indexes.

`MessageRepo` is the backend-neutral part: ingest (ingest.py), edits and deletes
(changes.py) and the reads below. Each backend adds its full-text and vector search and its
embedding queue (memory/store/sqlite/messages.py: FTS5 and vec0; memory/store/pg/messages.py:
BM25 over tsvector and pgvector).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import DeleteEvent, EditEvent, MessageEvent, Scope, StoredMessage
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import IN_CHUNK, Database
from speakermem.memory.store.governance.cascade import ForgetCascade
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.messages.changes import MessageChanges
from speakermem.memory.store.messages.ingest import MessageIngest
from speakermem.memory.store.messages.outcomes import ChangeStatus, IngestOutcome
from speakermem.memory.store.messages.text import embed_text
from speakermem.memory.store.rows import MESSAGE_COLUMNS, message_from_row
from speakermem.memory.store.vectors import rescore


class MessageRepo:
    """Every channel's messages; a backend adds its search and embedding queue."""

    def __init__(
        self,
        db: Database,
        channels: ChannelRepo,
        cascade: ForgetCascade,
        *,
        gap_seconds: float,
        window: int,
    ) -> None:
        self.db = db
        self.channels = channels
        self._ingest = MessageIngest(db, channels, cascade, gap_seconds=gap_seconds, window=window)
        self._changes = MessageChanges(db, channels, cascade)
        self.last_receipt: Receipt | None = None
        """What the latest platform delete removed (logs and tests read it)."""

    # ---- which model wrote the vectors --------------------------------------------------

    async def vectors_written_by(self) -> str | None:
        """The embedder's name the store's vectors were written with (None: not recorded)."""
        rows = await self.db.read("SELECT value FROM store_meta WHERE name = 'embedder'")
        return str(rows[0][0]) if rows else None

    async def set_vectors_written_by(self, name: str) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                self.db.dialect.upsert("store_meta", ("name", "value"), ("name",)),
                ("embedder", name),
            )

    async def has_vectors(self) -> bool:
        """Whether any message or record has a vector."""
        rows = await self.db.read(
            "SELECT EXISTS (SELECT 1 FROM message_vectors) OR EXISTS (SELECT 1 FROM records_vec)"
        )
        return bool(rows[0][0])

    async def draft_vectors(self, limit: int) -> list[tuple[int, int, str]]:
        """(pk, channel_pk, text to embed) for live messages whose vector is a draft, the
        oldest first (`replace_drafts` writes their full-precision vectors)."""
        rows = await self.db.read(
            "SELECT m.id, m.channel_pk, m.speaker_name, m.text FROM message_vectors v"
            " JOIN messages m ON m.id = v.id WHERE v.draft = 1 AND m.deleted_at IS NULL"
            " ORDER BY v.id LIMIT ?",
            (limit,),
        )
        return [(r[0], r[1], embed_text(r[2], r[3])) for r in rows]

    async def count_draft_vectors(self) -> int:
        """Live messages whose vector is still a draft."""
        rows = await self.db.read(
            "SELECT count(*) FROM message_vectors v JOIN messages m ON m.id = v.id"
            " WHERE v.draft = 1 AND m.deleted_at IS NULL"
        )
        return int(rows[0][0])

    # ---- writes -------------------------------------------------------------------------

    async def ingest(
        self, events: Sequence[MessageEvent], *, channel_default: bool
    ) -> list[IngestOutcome]:
        """Store a batch of messages atomically; replays of known ids are reported, not stored.

        The admission gate runs here, in the same transaction: a bot's message, one in a
        channel whose memory is off (its switch, else `channel_default`), or one by a member
        who opted out or was forgotten is reported with the reason and not stored. No entry
        path (live events, catch-up, imports, spill replay) reaches the tables around it."""
        outcomes, receipt = await self._ingest.run(events, channel_default)
        if receipt is not None:
            self.last_receipt = receipt
        return outcomes

    async def edit(self, event: EditEvent, *, channel_default: bool) -> ChangeStatus:
        """Apply an edit (see `MessageChanges.edit`)."""
        return await self._changes.edit(event, channel_default=channel_default)

    async def delete(self, event: DeleteEvent) -> ChangeStatus:
        """A platform delete: the forgetting cascade (see `MessageChanges.delete`)."""
        status, receipt = await self._changes.delete(event)
        if receipt is not None:
            self.last_receipt = receipt
        return status

    # ---- reads --------------------------------------------------------------------------

    async def get_many(self, pks: Sequence[int]) -> dict[int, StoredMessage]:
        rows = await self.db.read_in(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id IN ({{marks}})", pks
        )
        return {msg.pk: msg for msg in map(message_from_row, rows)}

    async def by_ids(self, scope: Scope, message_ids: Sequence[str]) -> dict[str, StoredMessage]:
        pk = await self.channels.lookup(scope)
        if pk is None or not message_ids:
            return {}
        rows = await self.db.read_in(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE channel_pk = ?"
            " AND message_id IN ({marks})",
            message_ids,
            before=(pk,),
        )
        return {msg.message_id: msg for msg in map(message_from_row, rows)}

    async def get(self, scope: Scope, message_id: str) -> StoredMessage | None:
        return (await self.by_ids(scope, [message_id])).get(message_id)

    async def in_segment(self, segment_id: int) -> list[StoredMessage]:
        rows = await self.db.read(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE segment_id = ?"
            " AND deleted_at IS NULL ORDER BY ts, id",
            (segment_id,),
        )
        return [message_from_row(r) for r in rows]

    async def neighbours(self, message: StoredMessage, radius: int) -> list[StoredMessage]:
        """Turns around a message in its session (the Expand step)."""
        pk = await self.channels.lookup(message.scope)
        rows = await self.db.read(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE channel_pk = ? AND session_id = ?"
            " AND turn_index BETWEEN ? AND ? AND deleted_at IS NULL ORDER BY turn_index",
            (pk, message.session_id, message.turn_index - radius, message.turn_index + radius),
        )
        return [message_from_row(r) for r in rows]

    async def session_started(self, scope: Scope, session_ids: Sequence[int]) -> dict[int, float]:
        pk = await self.channels.lookup(scope)
        if pk is None or not session_ids:
            return {}
        marks, ids = in_list(session_ids)
        rows = await self.db.read(
            f"SELECT session_id, started_at FROM sessions WHERE channel_pk = ?"
            f" AND session_id IN ({marks})",
            (pk, *ids),
        )
        return {r[0]: r[1] for r in rows}

    async def channel_corpus(self, channel_pk: int) -> list[tuple[int, str, str, str]]:
        """Every live message of a channel as (pk, message_id, speaker_name, text), in order."""
        rows = await self.db.read(
            "SELECT id, message_id, speaker_name, text FROM messages WHERE channel_pk = ?"
            " AND deleted_at IS NULL ORDER BY ts, id",
            (channel_pk,),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    async def vectors(self, pks: Sequence[int]) -> dict[int, np.ndarray]:
        rows = await self.db.read_in(
            "SELECT id, embedding FROM message_vectors WHERE id IN ({marks})", pks
        )
        return {r[0]: np.frombuffer(r[1], dtype=np.float32) for r in rows}

    async def speaker_dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        speakers: Sequence[str],
        limit: int,
        *,
        max_messages: int,
    ) -> list[tuple[int, float]]:
        """Exact cosine over the messages of people who speak rarely: [(pk, similarity)].

        A speaker with more than `max_messages` messages in the channels is left out (the
        general dense ranking covers them, and scoring them all would cost too much).
        """
        if not channel_pks or not speakers:
            return []
        cm, channels = in_list(channel_pks)
        sm, padded = in_list(speakers)
        rows = await self.db.read(
            f"SELECT speaker_id, count(*) FROM messages WHERE channel_pk IN ({cm})"
            f" AND speaker_id IN ({sm}) AND deleted_at IS NULL GROUP BY speaker_id",
            (*channels, *padded),
        )
        rare = [r[0] for r in rows if r[1] <= max_messages]
        if not rare:
            return []
        rm, rare = in_list(rare)
        blobs = await self.db.read(
            f"SELECT v.id, v.embedding FROM messages m JOIN message_vectors v ON v.id = m.id"
            f" WHERE m.channel_pk IN ({cm}) AND m.speaker_id IN ({rm}) AND m.deleted_at IS NULL",
            (*channels, *rare),
        )
        if not blobs:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        return await asyncio.to_thread(rescore, [(r[0], r[1]) for r in blobs], q, limit)

    async def session_total(self, channel_pks: Sequence[int]) -> int:
        """How many sessions the channels hold (the N of session-level IDF)."""
        if not channel_pks:
            return 0
        marks, channels = in_list(channel_pks)
        rows = await self.db.read(
            f"SELECT coalesce(sum(session_id), 0) FROM channels WHERE id IN ({marks})",
            channels,
        )
        return int(rows[0][0])

    async def session_sizes(
        self, sessions: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        """Messages per (channel pk, session): the document length of session-level BM25.

        Counted on the (channel_pk, session_id, turn_index) index alone, so deleted
        messages still count (a negligible bias for a length normaliser).
        """
        out: dict[tuple[int, int], int] = {}
        by_channel: dict[int, list[int]] = {}
        for channel_pk, session_id in dict.fromkeys(sessions):
            by_channel.setdefault(channel_pk, []).append(session_id)
        for channel_pk, ids in by_channel.items():
            for start in range(0, len(ids), IN_CHUNK):
                marks, chunk = in_list(ids[start : start + IN_CHUNK])
                rows = await self.db.read(
                    "SELECT session_id, count(*) FROM messages WHERE channel_pk = ?"
                    f" AND session_id IN ({marks}) GROUP BY session_id",
                    (channel_pk, *chunk),
                )
                out.update({(channel_pk, r[0]): r[1] for r in rows})
        return out

    async def latest_ts(self, channel_pks: Sequence[int]) -> float | None:
        if not channel_pks:
            return None
        marks, channels = in_list(channel_pks)
        rows = await self.db.read(
            f"SELECT max(last_ts) FROM channels WHERE id IN ({marks})", channels
        )
        return None if rows[0][0] is None else float(rows[0][0])
