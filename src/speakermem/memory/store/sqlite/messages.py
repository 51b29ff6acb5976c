"""System 1's search on SQLite: FTS5 BM25 over `messages_fts`, a Hamming KNN over vec0's
sign bits re-scored by exact cosine, and the embedding queue (`messages.embedded`).

The ingest, edits, deletes and reads are the neutral `MessageRepo`'s.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from speakermem.memory.store.database import IN_CHUNK
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.messages import MessageRepo, embed_text, speaker_phrase
from speakermem.memory.store.messages.text import count_lowercase
from speakermem.memory.store.sqlite.database import SqliteDatabase
from speakermem.memory.store.vectors import (
    BITS_CACHE_BYTES,
    BITS_CACHE_MIN_ROWS,
    COARSE_WIDEN,
    PackedBits,
    coarse_top_k,
    pack_chunks,
    quantize_bits,
    rescore,
)


class SqliteMessageRepo(MessageRepo):
    db: SqliteDatabase

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shadow_knn = True  # see _coarse_knn
        self._bits_cache: OrderedDict[int, _CachedBits] = OrderedDict()
        self.bits_cache_min_rows = BITS_CACHE_MIN_ROWS

    # ---- embeddings ---------------------------------------------------------------------

    async def pending_embeddings(self, limit: int) -> list[tuple[int, int, str]]:
        """(pk, channel_pk, text to embed) for messages without a vector yet."""
        rows = await self.db.read(
            "SELECT id, channel_pk, speaker_name, text FROM messages"
            " WHERE embedded = 0 AND deleted_at IS NULL ORDER BY id LIMIT ?",
            (limit,),
        )
        return [(r[0], r[1], embed_text(r[2], r[3])) for r in rows]

    async def drop_vectors(self) -> int:
        """Delete every message vector and queue the live messages for embedding again (a
        re-embed with another model); returns how many were queued."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM messages_vec")
            await tx.execute("DELETE FROM message_vectors")
            await tx.execute("UPDATE messages SET embedded = 0 WHERE embedded = 1")
            row = await tx.fetchone(
                "SELECT count(*) FROM messages WHERE embedded = 0 AND deleted_at IS NULL"
            )
        self._bits_cache.clear()
        return int(row[0])

    async def count_pending_embeddings(self) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM messages WHERE embedded = 0 AND deleted_at IS NULL"
        )
        return int(rows[0][0])

    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray, *, draft: bool = False
    ) -> int:
        """Write vectors for messages whose text did not change since they were read
        (`draft`: from the quicker graph, to be written again by `replace_drafts`)."""
        return await self._write_vectors(
            items, vectors, "embedded = 0 AND deleted_at IS NULL", draft=draft
        )

    async def replace_drafts(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int:
        """Write full-precision vectors over the drafts of messages whose text did not
        change since `draft_vectors` read them."""
        return await self._write_vectors(
            items,
            vectors,
            "deleted_at IS NULL AND id IN (SELECT id FROM message_vectors WHERE draft = 1)",
            draft=False,
        )

    async def _write_vectors(
        self,
        items: Sequence[tuple[int, int, str]],
        vectors: np.ndarray,
        still: str,
        *,
        draft: bool,
    ) -> int:
        """Write vectors for the messages that still match `still` with the text read."""
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
                    f" AND {still}",
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
            # a final vector names no `draft` column (a new row's default, 0, is right), so
            # writing one works on every schema since the first
            await tx.executemany(
                "INSERT OR REPLACE INTO message_vectors (id, embedding, draft) VALUES (?, ?, 1)"
                if draft
                else "INSERT OR REPLACE INTO message_vectors (id, embedding) VALUES (?, ?)",
                [(items[i][0], vectors[i].tobytes()) for i in keep],
            )
            await tx.executemany(
                "UPDATE messages SET embedded = 1 WHERE id = ?", [(items[i][0],) for i in keep]
            )
        return len(keep)

    # ---- search -------------------------------------------------------------------------

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

        A coarse KNN on binary-quantised vectors (per channel partition) picks `oversample`
        candidates (or `oversample_fraction` of a large partition's rows when that is more):
        `COARSE_WIDEN` times as many by Hamming distance, the best of those by the float
        query's score against their sign bits. Exact cosine on their float vectors ranks
        them.
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
                    await self._coarse_knn(conn, q, qbits, k, pk, fraction=oversample_fraction)
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
        self, conn: Any, q: np.ndarray, qbits: bytes, k: int, pk: int, *, fraction: float = 0.0
    ) -> list[int]:
        """The coarse candidates of one channel partition: `k` of them, or `fraction` of
        its rows when that is more (see `dense`).

        Fast path: read the partition's packed chunks straight from vec0's shadow tables and
        rank them with numpy (about 4x less CPU than vec0's own KNN on a 100k-row partition,
        whose per-chunk top-k dominates). Any sign that the shadow layout is not the one
        expected (another sqlite-vec version) switches permanently to the vec0 KNN query.
        """
        if self._shadow_knn:
            packed = await self._packed_partition(conn, pk, len(qbits))
            if packed is not None:
                keep = max(k, math.ceil(fraction * packed.valid.size))
                return await asyncio.to_thread(
                    coarse_top_k, packed, qbits, q, COARSE_WIDEN * keep, keep
                )
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
        entry is never used. That check is skipped when nothing was committed to the
        database since this reader connection last made it (SQLite's `data_version`
        changes on the connection whenever another connection commits).
        """
        try:
            if pk in self._bits_cache:
                entry = self._bits_cache[pk]
                ((version,),) = await conn.execute_fetchall("PRAGMA data_version")
                if entry.checked.get(conn) == version:
                    self._bits_cache.move_to_end(pk)
                    return entry.packed
                meta = await conn.execute_fetchall(
                    "SELECT chunk_id, validity, rowids FROM messages_vec_chunks"
                    " WHERE partition00 = ? ORDER BY chunk_id",
                    (pk,),
                )
                if entry.stamp == _chunks_stamp(meta):
                    entry.checked[conn] = version
                    self._bits_cache.move_to_end(pk)
                    return entry.packed
                del self._bits_cache[pk]
            rows = await conn.execute_fetchall(
                # CROSS JOIN keeps the small chunk table as the outer loop; the vector
                # chunk is found by its real rowid, as vec0's own blob reads do. The
                # data_version read in the same statement is the one the chunks were read at.
                "SELECT c.chunk_id, c.validity, c.rowids, v.vectors,"
                " (SELECT data_version FROM pragma_data_version) FROM messages_vec_chunks AS c"
                " CROSS JOIN messages_vec_vector_chunks00 AS v ON v._rowid_ = c.chunk_id"
                " WHERE c.partition00 = ? ORDER BY c.chunk_id",
                (pk,),
            )
        except self.db.driver.error:
            return None
        packed = pack_chunks([r[1:4] for r in rows], nbytes)
        if rows and packed is not None and packed.valid.size >= self.bits_cache_min_rows:
            entry = _CachedBits(_chunks_stamp(rows), packed)
            entry.checked[conn] = rows[0][4]
            self._remember(pk, entry)
        return packed

    def _remember(self, pk: int, entry: _CachedBits) -> None:
        self._bits_cache[pk] = entry
        self._bits_cache.move_to_end(pk)
        total = sum(e.nbytes for e in self._bits_cache.values())
        while total > BITS_CACHE_BYTES and len(self._bits_cache) > 1:
            _, evicted = self._bits_cache.popitem(last=False)
            total -= evicted.nbytes

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
            "SELECT m.text FROM messages_fts f JOIN messages m ON m.id = f.rowid"
            " WHERE messages_fts MATCH ? LIMIT ?",
            (f"{{text}} : ({phrase}) AND channel_tag : ({tags})", sample),
        )
        return count_lowercase(word, [r[0] for r in rows])

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


class _CachedBits:
    """A cached partition: its sign bits, the stamp they were read under, and the
    `data_version` at which each reader connection last found the stamp current."""

    def __init__(self, stamp: bytes, packed: PackedBits) -> None:
        self.stamp = stamp
        self.packed = packed
        self.checked: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    @property
    def nbytes(self) -> int:
        return len(self.stamp) + self.packed.nbytes


def _chunks_stamp(rows: Sequence[Any]) -> bytes:
    """What identifies a partition's content: (chunk_id, validity, rowids, ...) rows."""
    return b"".join(int(r[0]).to_bytes(8, "little", signed=True) + r[1] + r[2] for r in rows)
