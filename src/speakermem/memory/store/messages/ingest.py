"""Ingesting messages: a batch placed into sessions, turns and segments in one transaction.

One transaction places every message of a batch from the channel cursor, so an import
writes tens of thousands of rows per second while a live event is simply a batch of one.
A create of a known id is a duplicate (a deleted message keeps a tombstone row); a create
whose edit came first is stored with the newest early edit's text, and one whose delete
came first is stored and forgotten in the same transaction (memory/store/messages/early.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.sessions import ChannelCursor, place_message
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import IN_CHUNK, Database, Transaction
from speakermem.memory.store.governance.cascade import ForgetCascade
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.messages import early as early_changes
from speakermem.memory.store.messages.outcomes import IngestOutcome, IngestStatus
from speakermem.memory.store.rows import to_ts

MESSAGE_COLUMNS = (
    ("channel_pk", "bigint"),
    ("platform", "text"),
    ("workspace", "text"),
    ("channel", "text"),
    ("message_id", "text"),
    ("thread_id", "text"),
    ("speaker_id", "text"),
    ("speaker_name", "text"),
    ("text", "text"),
    ("ts", "double precision"),
    ("session_id", "integer"),
    ("turn_index", "integer"),
    ("reply_to", "text"),
    ("addressees", "text"),
    ("segment_id", "bigint"),
    ("edited_at", "double precision"),
)
"""The columns of an ingested message row, in the order `_ingest_tx` builds them."""

SEGMENT_COLUMNS = (
    ("id", "bigint"),
    ("channel_pk", "bigint"),
    ("platform", "text"),
    ("workspace", "text"),
    ("channel", "text"),
    ("state", "text"),
    ("n_messages", "integer"),
    ("opened_at", "double precision"),
    ("last_message_at", "double precision"),
    ("closed_at", "double precision"),
)
"""The columns of a new segment row, in the order `_ingest_tx` builds them."""


class MessageIngest:
    """The ingest transaction (`MessageRepo.ingest`)."""

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
        self.cascade = cascade
        self.gap_seconds = gap_seconds
        self.window = window
        dialect = db.dialect
        self._sessions_sql = dialect.insert_or_ignore(
            "sessions (channel_pk, platform, workspace, channel, session_id, started_at)",
            "VALUES (?, ?, ?, ?, ?, ?)",
        )
        self._segment_update_sql = (
            "UPDATE segments SET n_messages = ?,"
            f" last_message_at = {dialect.greatest('last_message_at', '?')},"
            f" state = CASE WHEN {dialect.truthy('?')} THEN 'pending' ELSE state END,"
            f" closed_at = CASE WHEN {dialect.truthy('?')} THEN ? ELSE closed_at END WHERE id = ?"
        )

    async def run(
        self, events: Sequence[MessageEvent], channel_default: bool
    ) -> tuple[list[IngestOutcome], Receipt | None]:
        """Store the batch atomically (see `MessageRepo.ingest`); also what the cascade
        removed of messages whose delete came first (None when none did)."""
        if not events:
            return [], None
        try:
            async with self.db.transaction() as tx:
                return await self._ingest_tx(tx, events, channel_default)
        except BaseException:
            self.channels.forget_cache()
            raise

    async def _ingest_tx(
        self, tx: Transaction, events: Sequence[MessageEvent], channel_default: bool
    ) -> tuple[list[IngestOutcome], Receipt | None]:
        # Round trips to the SQLite thread dominate a batch spread over many channels, so the
        # per-channel state is read with one query per batch, placement runs in Python, and
        # every write goes out as one executemany per table.
        by_scope: dict[Scope, list[int]] = {}
        for i, ev in enumerate(events):
            by_scope.setdefault(ev.scope, []).append(i)
        await tx.ingest_lock([scope.key() for scope in by_scope])
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
        early = await early_changes.pending_for(tx, self.db.dialect, events)
        consumed: list[tuple[str, ...]] = []
        dropped_edits: list[tuple[str, ...]] = []
        tombstoned: list[tuple[int, str]] = []
        states = await self._channel_states(tx, list(pks.values()))
        last_message_pk = 0
        if self.db.dialect.index_new_messages is not None:
            top = await tx.fetchone("SELECT coalesce(max(id), 0) FROM messages")
            last_message_pk = int(top[0])
        # New segments get provisional ids (-1, -2, ...) during placement and their real
        # ids from `reserve_ids` once their number is known.
        next_seg = -1
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
                    next_seg -= 1
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
        if seg_inserts:
            real = await tx.reserve_ids("segments", len(seg_inserts))
            seg_ids = {rec[0]: sid for rec, sid in zip(seg_inserts, real, strict=True)}
            for rec in seg_inserts:
                rec[0] = seg_ids[rec[0]]
            rows = [(*r[:-2], seg_ids.get(r[-2], r[-2]), r[-1]) for r in rows]
        await self.channels.add_member_rows(tx, member_rows)
        # Users are per workspace: one upsert per workspace, not per channel (the last
        # sighting of a user in the batch wins, as before).
        for scope, users in users_by_ws.values():
            if users:
                await self.channels.upsert_users(tx, scope, list(users.values()))
        await tx.executemany(self._sessions_sql, session_rows)
        # Close the channels' earlier open segments before inserting new ones (one open
        # segment per channel is a unique index).
        await tx.executemany(self._segment_update_sql, seg_updates)
        await tx.insert_rows("segments", SEGMENT_COLUMNS, [tuple(rec) for rec in seg_inserts])
        await tx.executemany(
            "UPDATE channels SET last_ts = ?, session_id = ?, next_turn = ? WHERE id = ?",
            channel_updates,
        )
        await tx.insert_rows("messages", MESSAGE_COLUMNS, rows)
        if rows and self.db.dialect.index_new_messages is not None:
            await tx.execute(self.db.dialect.index_new_messages, (last_message_pk,))
        if consumed or dropped_edits:
            await early_changes.drop(tx, consumed + dropped_edits)
        receipt = await self._forget_on_arrival(tx, tombstoned) if tombstoned else None
        return [o for o in outcomes if o is not None], receipt

    async def _forget_on_arrival(
        self, tx: Transaction, tombstoned: list[tuple[int, str]]
    ) -> Receipt:
        """Messages whose delete came first: stored above, forgotten here, in one transaction."""
        pks: list[int] = []
        for channel_pk, message_id in tombstoned:
            row = await tx.fetchone(
                "SELECT id FROM messages WHERE channel_pk = ? AND message_id = ?",
                (channel_pk, message_id),
            )
            pks.append(int(row[0]))
        receipt = Receipt(action="platform-delete", target=f"{len(pks)} early delete(s)")
        await self.cascade.forget_in(tx, pks, receipt, reason="platform-delete")
        return receipt

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

    async def _existing_pairs(
        self, tx: Transaction, pairs: list[tuple[int, str]]
    ) -> dict[int, set[str]]:
        """Which (channel pk, message id) pairs are stored already: one query per 5,000."""
        batch = self.db.dialect.batch(("bigint", "text"))
        sql = (
            f"SELECT m.channel_pk, m.message_id FROM {batch.source} {batch.join} messages AS m"
            f" ON m.channel_pk = {batch.column(0)} AND m.message_id = {batch.column(1)}"
        )
        found: dict[int, set[str]] = {}
        for start in range(0, len(pairs), 5_000):
            for r in await tx.fetchall(sql, batch.params(pairs[start : start + 5_000])):
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
