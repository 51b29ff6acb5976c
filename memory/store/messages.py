"""System 1: verbatim messages, their FTS5 and vector indexes, sessions and segments.

Ingestion is batched: one transaction places every message of a batch (session,
turn, segment) from the channel cursor, so an import writes tens of thousands of
rows per second while a live event is simply a batch of one.

Creates, edits and deletes converge in any order and with any duplicates:
- a create of a known id is a duplicate (a deleted message keeps a tombstone row);
- an edit applies only when it is newer (by `edited_at`, then text) than what is stored;
- an edit or delete of an id not stored yet is kept in `early_changes`; the create that
  follows is stored with the newest early edit's text, or, after a delete, stored and
  forgotten in the same transaction (the one cascade of `GovernanceRepo`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from memory.governance.policy import Receipt, Refusal
from memory.models import DeleteEvent, EditEvent, MessageEvent, Scope, StoredMessage
from memory.search.fts_query import quote
from memory.sessions import ChannelCursor, place_message
from memory.store.channels import ChannelRepo
from memory.store.database import IN_CHUNK, Database, Transaction
from memory.store.governance import GovernanceRepo
from memory.store.inlists import in_list
from memory.store.rows import MESSAGE_COLUMNS, message_from_row, to_ts
from memory.store.vectors import (
    BITS_CACHE_BYTES,
    BITS_CACHE_MIN_ROWS,
    PackedBits,
    hamming_top_k,
    pack_chunks,
    quantize_bits,
    rescore,
)


class IngestStatus(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    """Known already (a forgotten or deleted message keeps its id as a tombstone)."""
    DELETED = "deleted"
    """Its delete arrived first: stored as a tombstone only."""
    # turned away by the admission gate (memory.governance.policy.admission): nothing stored
    BOT = Refusal.BOT.value
    CHANNEL_OFF = Refusal.CHANNEL_OFF.value
    FORGOTTEN = Refusal.FORGOTTEN.value
    OPTED_OUT = Refusal.OPTED_OUT.value

    @property
    def refused(self) -> bool:
        return self.value in REFUSALS


class ChangeStatus(StrEnum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    UNKNOWN = "unknown"
    # an edit whose text the gate turned away (its channel is off and the message is not
    # held, or its author was forgotten or opted out): no text kept
    CHANNEL_OFF = Refusal.CHANNEL_OFF.value
    FORGOTTEN = Refusal.FORGOTTEN.value
    OPTED_OUT = Refusal.OPTED_OUT.value

    @property
    def refused(self) -> bool:
        return self.value in REFUSALS


REFUSALS = frozenset(r.value for r in Refusal)


@dataclass(frozen=True)
class IngestOutcome:
    message_id: str
    status: IngestStatus
    pk: int | None = None


EARLY_EDIT_TTL_S = 86_400.0
"""How long the text of an edit whose message never arrived is kept: reordering by retries
and reconnects spans minutes, and catch-up and imports fetch the edited text anyway. Early
deletes are kept for good: they hold ids only, and stop an import bringing a message back."""


@dataclass(frozen=True)
class _Early:
    deleted: bool
    text: str | None
    edited_at: float | None


class MessageRepo:
    # Statements of the ingest transaction whose SQL differs between backends.
    _SESSIONS_SQL = (
        "INSERT OR IGNORE INTO sessions (channel_pk, platform, workspace, channel,"
        " session_id, started_at) VALUES (?, ?, ?, ?, ?, ?)"
    )
    _SEGMENT_UPDATE_SQL = (
        "UPDATE segments SET n_messages = ?, last_message_at = max(last_message_at, ?),"
        " state = CASE WHEN ? THEN 'pending' ELSE state END,"
        " closed_at = CASE WHEN ? THEN ? ELSE closed_at END WHERE id = ?"
    )

    def __init__(self, db: Database, channels: ChannelRepo, *, gap_seconds: float, window: int):
        self.db = db
        self.channels = channels
        self.gap_seconds = gap_seconds
        self.window = window
        self._shadow_knn = True  # see _coarse_knn
        self._bits_cache: OrderedDict[int, tuple[bytes, PackedBits]] = OrderedDict()
        self.bits_cache_min_rows = BITS_CACHE_MIN_ROWS
        self.last_receipt: Receipt | None = None
        """What the latest platform delete removed (logs and tests read it)."""

    # ---- writes -------------------------------------------------------------------------

    async def ingest(
        self, events: Sequence[MessageEvent], *, channel_default: bool
    ) -> list[IngestOutcome]:
        """Store a batch of messages atomically; replays of known ids are reported, not stored.

        The admission gate runs here, in the same transaction: a bot's message, one in a
        channel whose memory is off (its switch, else `channel_default`), or one by a member
        who opted out or was forgotten is reported with the reason and not stored. No entry
        path (live events, catch-up, imports, spill replay) reaches the tables around it."""
        if not events:
            return []
        try:
            async with self.db.transaction() as tx:
                return await self._ingest_tx(tx, events, channel_default)
        except BaseException:
            self.channels.forget_cache()
            raise

    async def _ingest_tx(
        self, tx: Transaction, events: Sequence[MessageEvent], channel_default: bool
    ) -> list[IngestOutcome]:
        # Round trips to the SQLite thread dominate a batch spread over many channels, so the
        # per-channel state is read with one query per batch, placement runs in Python, and
        # every write goes out as one executemany per table.
        by_scope: dict[Scope, list[int]] = {}
        for i, ev in enumerate(events):
            by_scope.setdefault(ev.scope, []).append(i)
        pks: dict[Scope, int] = {}
        for scope in by_scope:
            pks[scope] = await self.channels.ensure(tx, scope)
        known = await self._existing_pairs(tx, [(pks[ev.scope], ev.message_id) for ev in events])
        new = [
            i for i, ev in enumerate(events) if ev.message_id not in known.get(pks[ev.scope], ())
        ]
        refused = {  # the admission gate (duplicates stay duplicates)
            i: IngestStatus(refusal.value)
            for i, refusal in (
                await self.channels.policy.refusals(tx, events, new, channel_default)
            ).items()
        }
        early = await self._early_changes(tx, events)
        consumed: list[tuple[str, ...]] = []
        dropped_edits: list[tuple[str, ...]] = []
        tombstoned: list[tuple[int, str]] = []
        states = await self._channel_states(tx, list(pks.values()))
        top = await tx.fetchone(
            "SELECT (SELECT coalesce(max(id), 0) FROM segments),"
            " (SELECT coalesce(max(id), 0) FROM messages)"
        )
        next_seg, last_message_pk = int(top[0]) + 1, int(top[1])
        now = time.time()
        outcomes: list[IngestOutcome | None] = [None] * len(events)
        rows: list[tuple[Any, ...]] = []
        session_rows: list[tuple[Any, ...]] = []
        seg_updates: list[tuple[Any, ...]] = []
        seg_inserts: list[list[Any]] = []
        channel_updates: list[tuple[Any, ...]] = []
        users_by_ws: dict[tuple[str, str], tuple[Scope, dict[str, tuple[str, str, bool]]]] = {}
        member_rows: list[tuple[Any, ...]] = []
        for scope, idxs in by_scope.items():
            pk = pks[scope]
            key = scope.key()
            last_ts, session_id, next_turn, seg_id, seg_n = states[pk]
            cursor = ChannelCursor(last_ts, session_id, next_turn)
            seg_n = seg_n if seg_id is not None else 0
            new_segs: dict[int, list[Any]] = {}
            seg_last = 0.0
            known_here = known.setdefault(pk, set())
            placed: dict[str, int] = {}  # message id -> session, for replies within the batch
            users = users_by_ws.setdefault(key[:2], (scope, {}))[1]
            members: dict[str, float] = {}

            def save(sid: int, n: int, last: float, close: bool, new_segs: dict = new_segs) -> None:
                rec = new_segs.get(sid)
                if rec is None:  # the channel's open segment from an earlier batch
                    seg_updates.append((n, last, int(close), int(close), now, sid))
                    return
                # [id, pk, platform, workspace, channel, state, n, opened_at, last, closed_at]
                rec[5] = "pending" if close else "open"
                rec[6] = n
                rec[8] = max(rec[8], last)
                rec[9] = now if close else None

            for i in idxs:
                ev = events[i]
                if ev.message_id in known_here:
                    outcomes[i] = IngestOutcome(ev.message_id, IngestStatus.DUPLICATE)
                    continue
                if i in refused:
                    outcomes[i] = IngestOutcome(ev.message_id, refused[i])
                    change = early.get((*key, ev.message_id))
                    if change is not None and not change.deleted:  # its edit's text goes too
                        dropped_edits.append((*key, ev.message_id))
                    continue
                known_here.add(ev.message_id)
                text, edited_at = ev.text, None
                change = early.get((*key, ev.message_id))
                if change is not None:
                    consumed.append((*key, ev.message_id))
                    if change.deleted:
                        tombstoned.append((pk, ev.message_id))
                    elif change.text is not None:
                        text, edited_at = change.text, change.edited_at
                ts = to_ts(ev.ts)
                parent = ev.reply_to or ev.thread_id
                idle = cursor.last_ts is not None and ts - cursor.last_ts > self.gap_seconds
                place = place_message(
                    cursor,
                    ts,
                    gap_seconds=self.gap_seconds,
                    force_break=ev.session_break,
                    # only looked up when the gap would start a new session
                    continues=idle
                    and parent is not None
                    and await self._session_of(tx, pk, parent, placed) == cursor.session_id,
                )
                placed[ev.message_id] = place.session_id
                cursor = place.cursor
                if place.new_session:
                    session_rows.append((pk, *key, place.session_id, ts))
                    if seg_id is not None and seg_n > 0:
                        save(seg_id, seg_n, seg_last, True)
                        seg_id, seg_n = None, 0
                if seg_id is None:
                    seg_id = next_seg
                    next_seg += 1
                    rec = [seg_id, pk, *key, "open", 0, now, ts, None]
                    new_segs[seg_id] = rec
                    seg_inserts.append(rec)
                    seg_n = 0
                seg_n += 1
                seg_last = max(seg_last, ts)
                rows.append(
                    (
                        pk,
                        *key,
                        ev.message_id,
                        ev.thread_id,
                        ev.speaker_id,
                        ev.speaker_name,
                        text,
                        ts,
                        place.session_id,
                        place.turn_index,
                        ev.reply_to,
                        json.dumps(list(ev.addressees)) if ev.addressees else "[]",
                        seg_id,
                        edited_at,
                    )
                )
                status = IngestStatus.STORED
                if change is not None and change.deleted:
                    status = IngestStatus.DELETED
                outcomes[i] = IngestOutcome(ev.message_id, status)
                users[ev.speaker_id] = (ev.speaker_id, ev.speaker_name, ev.speaker_is_bot)
                members.setdefault(ev.speaker_id, ts)
                if seg_n >= self.window:
                    save(seg_id, seg_n, seg_last, True)
                    seg_id, seg_n = None, 0
            if seg_id is not None and seg_n > 0:
                save(seg_id, seg_n, seg_last, False)
            channel_updates.append((cursor.last_ts, cursor.session_id, cursor.next_turn, pk))
            member_rows.extend((pk, *key, uid, ts) for uid, ts in members.items())
        await self.channels.add_member_rows(tx, member_rows)
        # Users are per workspace: one upsert per workspace, not per channel (the last
        # sighting of a user in the batch wins, as before).
        for scope, users in users_by_ws.values():
            if users:
                await self.channels.upsert_users(tx, scope, list(users.values()))
        await tx.executemany(self._SESSIONS_SQL, session_rows)
        # Close the channels' earlier open segments before inserting new ones (one open
        # segment per channel is a unique index).
        await tx.executemany(self._SEGMENT_UPDATE_SQL, seg_updates)
        await tx.executemany(
            "INSERT INTO segments (id, channel_pk, platform, workspace, channel, state,"
            " n_messages, opened_at, last_message_at, closed_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [tuple(rec) for rec in seg_inserts],
        )
        await tx.executemany(
            "UPDATE channels SET last_ts = ?, session_id = ?, next_turn = ? WHERE id = ?",
            channel_updates,
        )
        await tx.executemany(
            "INSERT INTO messages (channel_pk, platform, workspace, channel, message_id,"
            " thread_id, speaker_id, speaker_name, text, ts, session_id, turn_index, reply_to,"
            " addressees, segment_id, edited_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        if rows:
            await self._index_new_messages(tx, last_message_pk)
        if consumed or dropped_edits:
            await tx.executemany(
                "DELETE FROM early_changes WHERE platform = ? AND workspace = ? AND channel = ?"
                " AND message_id = ?",
                consumed + dropped_edits,
            )
        if tombstoned:
            await self._forget_on_arrival(tx, tombstoned)
        return [o for o in outcomes if o is not None]

    @staticmethod
    async def _index_new_messages(tx: Transaction, last_message_pk: int) -> None:
        """Index the whole batch in one statement (we hold the write lock, so every new
        row has an id above the previous maximum)."""
        await tx.execute(
            "INSERT INTO messages_fts (rowid, text, speaker_name, channel_tag)"
            " SELECT id, text, speaker_name, 'c' || channel_pk FROM messages"
            " WHERE id > ? ORDER BY id",
            (last_message_pk,),
        )

    def _governance(self) -> GovernanceRepo:
        """The forgetting cascade of this backend (a platform delete runs it)."""
        return GovernanceRepo(self.db, self.channels)

    async def _early_changes(
        self, tx: Transaction, events: Sequence[MessageEvent]
    ) -> dict[tuple[str, ...], _Early]:
        """Edits and deletes kept for these messages: (platform, workspace, channel, id) ->."""
        if await tx.fetchone("SELECT 1 FROM early_changes LIMIT 1") is None:
            return {}  # the usual case: one cheap probe per batch
        await self._prune_early_edits(tx)
        keys = [[*ev.scope.key(), ev.message_id] for ev in events]
        out: dict[tuple[str, ...], _Early] = {}
        for start in range(0, len(keys), 5_000):
            for r in await tx.fetchall(
                "SELECT e.platform, e.workspace, e.channel, e.message_id, e.deleted_at, e.text,"
                " e.edited_at FROM json_each(?) AS j CROSS JOIN early_changes AS e"
                " ON e.platform = json_extract(j.value, '$[0]')"
                " AND e.workspace = json_extract(j.value, '$[1]')"
                " AND e.channel = json_extract(j.value, '$[2]')"
                " AND e.message_id = json_extract(j.value, '$[3]')",
                (json.dumps(keys[start : start + 5_000]),),
            ):
                out[(r[0], r[1], r[2], r[3])] = _Early(r[4] is not None, r[5], r[6])
        return out

    async def _forget_on_arrival(self, tx: Transaction, tombstoned: list[tuple[int, str]]) -> None:
        """Messages whose delete came first: stored above, forgotten here, in one transaction."""
        pks: list[int] = []
        for channel_pk, message_id in tombstoned:
            row = await tx.fetchone(
                "SELECT id FROM messages WHERE channel_pk = ? AND message_id = ?",
                (channel_pk, message_id),
            )
            pks.append(int(row[0]))
        receipt = Receipt(action="platform-delete", target=f"{len(pks)} early delete(s)")
        await self._governance().forget_in(tx, pks, receipt, reason="platform-delete")
        self.last_receipt = receipt

    @staticmethod
    async def _session_of(
        tx: Transaction, channel_pk: int, message_id: str, placed: dict[str, int]
    ) -> int | None:
        """The session of a reply's parent: placed earlier in this batch, or stored."""
        if message_id in placed:
            return placed[message_id]
        row = await tx.fetchone(
            "SELECT session_id FROM messages WHERE channel_pk = ? AND message_id = ?",
            (channel_pk, message_id),
        )
        return None if row is None else int(row[0])

    @staticmethod
    async def _existing_pairs(tx: Transaction, pairs: list[tuple[int, str]]) -> dict[int, set[str]]:
        """Which (channel pk, message id) pairs are stored already: one query per 5,000."""
        found: dict[int, set[str]] = {}
        for start in range(0, len(pairs), 5_000):
            chunk = pairs[start : start + 5_000]
            for r in await tx.fetchall(
                "SELECT m.channel_pk, m.message_id FROM json_each(?) AS j"
                " CROSS JOIN messages AS m ON m.channel_pk = json_extract(j.value, '$[0]')"
                " AND m.message_id = json_extract(j.value, '$[1]')",
                (json.dumps(chunk),),
            ):
                found.setdefault(r[0], set()).add(r[1])
        return found

    @staticmethod
    async def _channel_states(
        tx: Transaction, pks: list[int]
    ) -> dict[int, tuple[Any, int, int, int | None, int]]:
        """Each channel's cursor and open segment: pk -> (last_ts, session, next turn,
        open segment id or None, its message count)."""
        out: dict[int, tuple[Any, int, int, int | None, int]] = {}
        for start in range(0, len(pks), IN_CHUNK):
            marks, chunk = in_list(pks[start : start + IN_CHUNK])
            for r in await tx.fetchall(
                "SELECT c.id, c.last_ts, c.session_id, c.next_turn, s.id, s.n_messages"
                " FROM channels c LEFT JOIN segments s ON s.channel_pk = c.id"
                f" AND s.state = 'open' WHERE c.id IN ({marks})",
                chunk,
            ):
                out[r[0]] = (r[1], r[2], r[3], r[4], r[5] or 0)
        return out

    async def edit(self, event: EditEvent, *, channel_default: bool) -> ChangeStatus:
        """Replace the text: the FTS trigger swaps the indexed words, the old vector goes (the
        embedder makes a new one). Records citing it are re-checked by the caller
        (`memory.governance.service`), with `citing_records`.

        Only a newer edit applies: (edited_at, text) above the stored one, so any order of
        the same edits ends on the same text. An edit of a message not stored yet is kept
        for it (UNKNOWN); an edit of a deleted message changes nothing.

        The admission gate holds for edits too: the text of a member who opted out or was
        forgotten (the stored message's author, else the event's `author_id`) is not kept,
        nor an early edit's in a channel whose memory is off."""
        at = to_ts(event.edited_at)
        async with self.db.transaction() as tx:
            await self._serialise_with_ingest(tx)
            await tx.policy_lock(shared=True)
            row = await self._locate(tx, event.scope, event.message_id)
            if row is not None and row[2] is not None:
                return ChangeStatus.UNCHANGED
            people = await self.channels.policy.exclusions(
                event.scope.platform, event.scope.workspace, tx
            )
            author = row[4] if row is not None else event.author_id
            if author and (refusal := people.reason(author)) is not None:
                return ChangeStatus(refusal.value)
            if row is None:
                (on,) = (
                    await self.channels.policy.channels_on([event.scope], channel_default, tx)
                ).values()
                if not on:  # memory is off here: keep no text of a message it never stored
                    return ChangeStatus.CHANNEL_OFF
                await self._keep_early_edit(tx, event, at)
                return ChangeStatus.UNKNOWN
            pk, text, _deleted, edited_at, _speaker = row
            if edited_at is not None and (at, event.text) <= (edited_at, text):
                return ChangeStatus.UNCHANGED  # an older edit (or this one) replayed late
            if text == event.text:  # newer but the same words: only the time moves
                await tx.execute("UPDATE messages SET edited_at = ? WHERE id = ?", (at, pk))
                return ChangeStatus.UNCHANGED
            await tx.execute(
                "UPDATE messages SET text = ?, edited_at = ?, embedded = 0 WHERE id = ?",
                (event.text, at, pk),
            )
            await self._drop_vector(tx, pk)
            return ChangeStatus.APPLIED

    async def _serialise_with_ingest(self, tx: Transaction) -> None:
        """Order an edit or delete against ingests (a create and its early edit or delete
        must not miss each other). SQLite's one writer already does."""

    @staticmethod
    async def _prune_early_edits(tx: Transaction) -> None:
        await tx.execute(
            "DELETE FROM early_changes WHERE deleted_at IS NULL AND received_at < ?",
            (time.time() - EARLY_EDIT_TTL_S,),
        )

    @staticmethod
    async def _keep_early_edit(tx: Transaction, event: EditEvent, at: float) -> None:
        """Keep the newest edit of a message not stored yet (none after its delete)."""
        now = time.time()
        await MessageRepo._prune_early_edits(tx)
        await tx.execute(
            "INSERT INTO early_changes (platform, workspace, channel, message_id, text,"
            " edited_at, received_at, author_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (platform, workspace, channel, message_id) DO UPDATE"
            " SET text = excluded.text, edited_at = excluded.edited_at,"
            " received_at = excluded.received_at, author_id = excluded.author_id"
            " WHERE early_changes.deleted_at IS NULL"
            " AND (early_changes.edited_at IS NULL OR excluded.edited_at > early_changes.edited_at"
            " OR (excluded.edited_at = early_changes.edited_at"
            " AND excluded.text > early_changes.text))",
            (*event.scope.key(), event.message_id, event.text, at, now, event.author_id),
        )

    async def delete(self, event: DeleteEvent) -> ChangeStatus:
        """A platform delete: the forgetting cascade (text, indexes, vectors and every record
        citing it go; a tombstone keeps the id so a replayed create does not bring it back).

        A delete of a message not stored yet is kept as an early tombstone (UNKNOWN): the
        create that follows is stored forgotten."""
        async with self.db.transaction() as tx:
            await self._serialise_with_ingest(tx)
            row = await tx.fetchone(
                "SELECT m.id, m.deleted_at, m.speaker_name FROM messages m JOIN channels c"
                " ON c.id = m.channel_pk WHERE c.platform = ? AND c.workspace = ?"
                " AND c.channel = ? AND m.message_id = ?",
                (*event.scope.key(), event.message_id),
            )
            if row is None:
                await tx.execute(
                    "INSERT INTO early_changes (platform, workspace, channel, message_id,"
                    " deleted_at, received_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (platform, workspace, channel, message_id) DO UPDATE"
                    " SET deleted_at = coalesce(early_changes.deleted_at, excluded.deleted_at),"
                    " text = NULL, edited_at = NULL",
                    (*event.scope.key(), event.message_id, time.time(), time.time()),
                )
                return ChangeStatus.UNKNOWN
        pk, deleted, speaker_name = row
        cited = await self.db.read(
            "SELECT 1 FROM record_sources WHERE message_pk = ? LIMIT 1", (pk,)
        )
        if deleted is not None and not speaker_name and not cited:
            return ChangeStatus.UNCHANGED
        receipt = Receipt(action="platform-delete", target=f"{event.scope}/{event.message_id}")
        await self._governance().forget_messages([pk], receipt, reason="platform-delete")
        self.last_receipt = receipt
        return ChangeStatus.APPLIED

    async def _locate(self, tx: Transaction, scope: Scope, message_id: str) -> Any:
        return await tx.fetchone(
            "SELECT m.id, m.text, m.deleted_at, m.edited_at, m.speaker_id FROM messages m"
            " JOIN channels c ON c.id = m.channel_pk WHERE c.platform = ? AND c.workspace = ?"
            " AND c.channel = ? AND m.message_id = ?",
            (*scope.key(), message_id),
        )

    @staticmethod
    async def _drop_vector(tx: Transaction, pk: int) -> None:
        await tx.execute("DELETE FROM messages_vec WHERE rowid = ?", (pk,))
        await tx.execute("DELETE FROM message_vectors WHERE id = ?", (pk,))

    # ---- embeddings ---------------------------------------------------------------------

    async def pending_embeddings(self, limit: int) -> list[tuple[int, int, str]]:
        """(pk, channel_pk, text to embed) for messages without a vector yet."""
        rows = await self.db.read(
            "SELECT id, channel_pk, speaker_name, text FROM messages"
            " WHERE embedded = 0 AND deleted_at IS NULL ORDER BY id LIMIT ?",
            (limit,),
        )
        return [(r[0], r[1], embed_text(r[2], r[3])) for r in rows]

    async def count_pending_embeddings(self) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM messages WHERE embedded = 0 AND deleted_at IS NULL"
        )
        return int(rows[0][0])

    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int:
        """Write vectors for messages whose text did not change since they were read."""
        if not items:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        bits = quantize_bits(vectors)
        async with self.db.transaction() as tx:
            ids = [pk for pk, _, _ in items]
            current: dict[int, str] = {}
            for start in range(0, len(ids), IN_CHUNK):
                marks, chunk = in_list(ids[start : start + IN_CHUNK])
                for r in await tx.fetchall(
                    f"SELECT id, speaker_name, text FROM messages WHERE id IN ({marks})"
                    " AND embedded = 0 AND deleted_at IS NULL",
                    chunk,
                ):
                    current[r[0]] = embed_text(r[1], r[2])
            keep = [i for i, (pk, _, text) in enumerate(items) if current.get(pk) == text]
            await tx.executemany(
                "DELETE FROM messages_vec WHERE rowid = ?", [(items[i][0],) for i in keep]
            )
            await tx.executemany(
                "INSERT INTO messages_vec (rowid, channel_pk, embedding) VALUES (?, ?, vec_bit(?))",
                [(items[i][0], items[i][1], bits[i]) for i in keep],
            )
            await tx.executemany(
                "INSERT OR REPLACE INTO message_vectors (id, embedding) VALUES (?, ?)",
                [(items[i][0], vectors[i].tobytes()) for i in keep],
            )
            await tx.executemany(
                "UPDATE messages SET embedded = 1 WHERE id = ?", [(items[i][0],) for i in keep]
            )
        return len(keep)

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

    async def lexical(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        *,
        speakers: Sequence[str] | None = None,
        speaker_names: Sequence[str] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> list[tuple[int, float]]:
        """FTS5 BM25 over the given channels: [(pk, bm25)] best first (bm25 is negative).

        Optional filters keep only some speakers' messages or a time window. With
        `speaker_names` (those speakers' display names) FTS5 narrows to their messages
        first, so only those rows are joined and checked against the speaker ids.
        """
        if not match or not channel_pks:
            return []
        # The channel restriction is part of the MATCH (each row carries a `c<channel pk>`
        # token in the channel_tag column, weight 0 in bm25), so FTS5 intersects doclists and
        # scores only the channel's matches instead of every match in the database. The index
        # holds live messages only, so the unfiltered query needs no join at all.
        tags = " OR ".join(f'"c{int(pk)}"' for pk in dict.fromkeys(channel_pks))
        full_match = f"{{text speaker_name}} : ({match}) AND channel_tag : ({tags})"
        phrases = [p for p in map(speaker_phrase, speaker_names) if p]
        if speakers and phrases:
            full_match += f" AND speaker_name : ({' OR '.join(phrases)})"
        if not speakers and since is None and until is None:
            return [
                (r[0], r[1])
                for r in await self.db.read(
                    "SELECT rowid, bm25(messages_fts, 1.0, 0.5, 0.0) AS score FROM messages_fts"
                    " WHERE messages_fts MATCH ? ORDER BY score LIMIT ?",
                    (full_match, limit),
                )
            ]
        sql = (
            "SELECT m.id, bm25(messages_fts, 1.0, 0.5, 0.0) AS score FROM messages_fts"
            " JOIN messages m ON m.id = messages_fts.rowid"
            " WHERE messages_fts MATCH ? AND m.deleted_at IS NULL"
        )
        params: list[object] = [full_match]
        if speakers:
            marks, padded = in_list(speakers)
            sql += f" AND m.speaker_id IN ({marks})"
            params.extend(padded)
        if since is not None:
            sql += " AND m.ts >= ?"
            params.append(since)
        if until is not None:
            sql += " AND m.ts < ?"
            params.append(until)
        sql += " ORDER BY score LIMIT ?"
        params.append(limit)
        return [(r[0], r[1]) for r in await self.db.read(sql, params)]

    async def lexical_by_speaker(
        self, match: str, channel_pks: Sequence[int], speakers: Sequence[str], per_speaker: int
    ) -> dict[str, list[int]]:
        """Each speaker's best `per_speaker` live matches (pks, best first), in one query for
        all of them: System 2's empty rows fall back to these without a query per person."""
        speakers = list(dict.fromkeys(speakers))
        if not match or not channel_pks or not speakers or per_speaker <= 0:
            return {}
        tags = " OR ".join(f'"c{int(pk)}"' for pk in dict.fromkeys(channel_pks))
        full_match = f"{{text speaker_name}} : ({match}) AND channel_tag : ({tags})"
        marks, padded = in_list(speakers)
        # the inner LIMIT keeps SQLite from flattening bm25() into the window's ORDER BY
        sql = (
            "SELECT id, speaker_id FROM (SELECT id, speaker_id, row_number() OVER"
            " (PARTITION BY speaker_id ORDER BY score, id) AS rn FROM ("
            "SELECT m.id AS id, m.speaker_id AS speaker_id,"
            " bm25(messages_fts, 1.0, 0.5, 0.0) AS score FROM messages_fts"
            " JOIN messages m ON m.id = messages_fts.rowid"
            " WHERE messages_fts MATCH ? AND m.deleted_at IS NULL"
            f" AND m.speaker_id IN ({marks}) LIMIT -1))"
            " WHERE rn <= ? ORDER BY speaker_id, rn"
        )
        out: dict[str, list[int]] = {}
        for pk, speaker in await self.db.read(sql, [full_match, *padded, per_speaker]):
            out.setdefault(speaker, []).append(pk)
        return out

    async def dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        limit: int,
        oversample: int,
        oversample_fraction: float = 0.0,
    ) -> list[tuple[int, float]]:
        """Vector KNN over the given channels: [(pk, cosine similarity)] best first.

        A coarse Hamming KNN on binary-quantised vectors (per channel partition) picks
        `oversample` candidates (or `oversample_fraction` of a large partition's rows);
        exact cosine on their float vectors ranks them.
        """
        if not channel_pks:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        qbits = quantize_bits(q.reshape(1, -1))[0]
        k = max(limit, oversample)
        candidates: list[int] = []
        async with self.db.reader() as conn:
            for pk in channel_pks:
                candidates.extend(
                    await self._coarse_knn(conn, qbits, k, pk, fraction=oversample_fraction)
                )
            if not candidates:
                return []
            blobs: list[tuple[int, bytes]] = []
            for start in range(0, len(candidates), IN_CHUNK):
                marks, chunk = in_list(candidates[start : start + IN_CHUNK])
                rows = await conn.execute_fetchall(
                    f"SELECT id, embedding FROM message_vectors WHERE id IN ({marks})", chunk
                )
                blobs.extend((r[0], r[1]) for r in rows)
        if not blobs:
            return []
        return await asyncio.to_thread(rescore, blobs, q, limit)

    async def _coarse_knn(
        self, conn: Any, qbits: bytes, k: int, pk: int, *, fraction: float = 0.0
    ) -> list[int]:
        """The `k` nearest rows of one channel partition by Hamming distance.

        Fast path: read the partition's packed chunks straight from vec0's shadow tables and
        rank them with numpy (about 4x less CPU than vec0's own KNN on a 100k-row partition,
        whose per-chunk top-k dominates). Any sign that the shadow layout is not the one
        expected (another sqlite-vec version) switches permanently to the vec0 KNN query.
        """
        if self._shadow_knn:
            packed = await self._packed_partition(conn, pk, len(qbits))
            if packed is not None:
                k = max(k, math.ceil(fraction * packed.valid.size))
                return await asyncio.to_thread(hamming_top_k, packed, qbits, k)
            self._shadow_knn = False
        rows = await conn.execute_fetchall(
            "SELECT rowid FROM messages_vec WHERE embedding MATCH vec_bit(?)"
            " AND k = ? AND channel_pk = ?",
            (qbits, min(k, 4096), pk),
        )
        return [r[0] for r in rows]

    async def _packed_partition(self, conn: Any, pk: int, nbytes: int) -> PackedBits | None:
        """The partition's sign bits, from a per-process cache when still current.

        Only partitions of `BITS_CACHE_MIN_ROWS` rows or more are cached: below that,
        reading the bits costs about as much as checking the cache, and caching every small
        channel would only grow memory with the data. Currency is checked against the
        partition's chunk ids, validity bitmaps and rowids (about a sixth of the bytes of
        the vectors): any insert, edit or delete by any process changes them, so a stale
        entry is never used.
        """
        try:
            if pk in self._bits_cache:
                meta = await conn.execute_fetchall(
                    "SELECT chunk_id, validity, rowids FROM messages_vec_chunks"
                    " WHERE partition00 = ? ORDER BY chunk_id",
                    (pk,),
                )
                stamp, cached = self._bits_cache[pk]
                if stamp == _chunks_stamp(meta):
                    self._bits_cache.move_to_end(pk)
                    return cached
                del self._bits_cache[pk]
            rows = await conn.execute_fetchall(
                # CROSS JOIN keeps the small chunk table as the outer loop; the vector
                # chunk is found by its real rowid, as vec0's own blob reads do.
                "SELECT c.chunk_id, c.validity, c.rowids, v.vectors FROM messages_vec_chunks AS c"
                " CROSS JOIN messages_vec_vector_chunks00 AS v ON v._rowid_ = c.chunk_id"
                " WHERE c.partition00 = ? ORDER BY c.chunk_id",
                (pk,),
            )
        except self.db.driver.error:
            return None
        packed = pack_chunks([r[1:] for r in rows], nbytes)
        if packed is not None and packed.valid.size >= self.bits_cache_min_rows:
            self._remember(pk, _chunks_stamp(rows), packed)
        return packed

    def _remember(self, pk: int, stamp: bytes, packed: PackedBits) -> None:
        self._bits_cache[pk] = (stamp, packed)
        self._bits_cache.move_to_end(pk)
        total = sum(len(s) + p.nbytes for s, p in self._bits_cache.values())
        while total > BITS_CACHE_BYTES and len(self._bits_cache) > 1:
            _, (s, p) = self._bits_cache.popitem(last=False)
            total -= len(s) + p.nbytes

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

    async def lowercase_share(
        self, word: str, channel_pks: Sequence[int], *, sample: int = 200
    ) -> tuple[int, float]:
        """How the channels' messages write `word` (a roster name or one of its parts):
        (occurrences seen in up to `sample` matching messages, share in lower case).

        A name people write in lower case most of the time ("man", "big") is an ordinary
        word of the channel, not a way of naming someone.
        """
        phrase = speaker_phrase(word)
        if not phrase or not channel_pks:
            return 0, 0.0
        tags = " OR ".join(f'"c{int(pk)}"' for pk in dict.fromkeys(channel_pks))
        rows = await self.db.read(
            "SELECT text FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?",
            (f"{{text}} : ({phrase}) AND channel_tag : ({tags})", sample),
        )
        pattern = re.compile(
            r"(?<!\w)" + r"\s+".join(map(re.escape, word.split())) + r"(?!\w)", re.IGNORECASE
        )
        seen = lower = 0
        for (text,) in rows:
            for m in pattern.finditer(text):
                seen += 1
                lower += m.group(0) == m.group(0).lower()
        return seen, (lower / seen if seen else 0.0)

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

    async def session_term_counts(
        self, terms: Sequence[str], channel_pks: Sequence[int], *, cap: int = 2000
    ) -> dict[str, dict[tuple[int, int], int]]:
        """Per query term: matching messages per (channel pk, session) — a session-level
        term frequency for scoring whole sessions.

        A term matching more than `cap` messages of the channels is left out: it is too
        common to tell sessions apart (its session IDF is near zero), and counting it would
        cost a row lookup per match (a speaker's name matches all their messages).
        """
        if not channel_pks:
            return {}
        tags = " OR ".join(f'"c{int(pk)}"' for pk in dict.fromkeys(channel_pks))
        out: dict[str, dict[tuple[int, int], int]] = {}
        async with self.db.reader() as conn:
            for term in terms:
                match = f"{{text speaker_name}} : ({term}) AND channel_tag : ({tags})"
                ((hits,),) = await conn.execute_fetchall(
                    "SELECT count(*) FROM (SELECT rowid FROM messages_fts"
                    " WHERE messages_fts MATCH ? LIMIT ?)",
                    (match, cap + 1),
                )
                if hits > cap:
                    continue
                rows = await conn.execute_fetchall(
                    "SELECT m.channel_pk, m.session_id, count(*) FROM"
                    " (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?) f"
                    " JOIN messages m ON m.id = f.rowid GROUP BY m.channel_pk, m.session_id",
                    (match, cap),
                )
                out[term] = {(r[0], r[1]): r[2] for r in rows}
        return out

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

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read(
            "SELECT count(*), sum(deleted_at IS NOT NULL),"
            " sum(embedded = 0 AND deleted_at IS NULL), count(DISTINCT channel_pk) FROM messages"
        )
        r = rows[0]
        return {
            "messages": int(r[0] or 0) - int(r[1] or 0),
            "deleted": int(r[1] or 0),
            "unembedded": int(r[2] or 0),
            "channels_with_messages": int(r[3] or 0),
        }


_NAME_TOKEN = re.compile(r"[^\W_]", re.UNICODE)


def _chunks_stamp(rows: Sequence[Any]) -> bytes:
    """What identifies a partition's content: (chunk_id, validity, rowids, ...) rows."""
    return b"".join(int(r[0]).to_bytes(8, "little", signed=True) + r[1] + r[2] for r in rows)


def speaker_phrase(name: str) -> str:
    """An FTS5 phrase matching a display name in the speaker column ('' if it has no word).

    The whole name is quoted, so FTS5 tokenizes it exactly as it tokenized the column:
    stop-words and one-letter parts ("Girl's Voice", "j_doe") stay in the phrase. The
    query tokenizer drops them, and its phrase then matched none of the speaker's rows.
    """
    name = " ".join(name.split())
    return quote(name) if _NAME_TOKEN.search(name) else ""


def embed_text(speaker_name: str, text: str) -> str:
    """What the dense index embeds: the speaker's name with the text, so 'who said' matches."""
    return f"{speaker_name}: {text}"
