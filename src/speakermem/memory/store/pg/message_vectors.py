"""System 1's vectors on PostgreSQL: the embedding queue, vectors written in binary, and
the candidates of a dense search.

The pending set is the table `messages_unembedded` (see messages_schema.py), kept by
triggers from what the writers set in `messages.embedded`; storing a vector deletes the
message's row there and never rewrites the `messages` row.

Dense search, as on SQLite: a coarse Hamming KNN on the stored sign bits (`messages_bits`)
picks each channel's candidates; their float32 payloads are re-scored with numpy exactly as
on SQLite, so both backends return the same similarities.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg import AsyncConnection, AsyncCursor
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo

from speakermem.memory.store.database import IN_CHUNK
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.messages import embed_text
from speakermem.memory.store.pg.database import PgDatabase
from speakermem.memory.store.pg.dialect import translate
from speakermem.memory.store.vectors import COARSE_WIDEN, asymmetric_top, rescore

RESCORE_ALL, RESCORE_MARGIN = 1_000, 16
"""Dense search hands numpy every candidate up to RESCORE_ALL of them, else the
2 * limit + RESCORE_MARGIN best by pgvector's inner product (see `PgMessageRepo.dense`)."""


class BinaryVectors:
    """Cursors that bind parameters on the server in binary (`%b`): the connections' own
    cursors bind on the client, which spells every float of a vector out in decimal (text
    the server parses again) and every payload in hex; binary sends each float32 once as
    its four bytes (about 7x faster for a batch of vectors). pgvector's `vector` type is
    looked up once per store."""

    def __init__(self) -> None:
        self._vector_type: tuple[TypeInfo, type[Dumper]] | None = None

    async def cursor(self, conn: AsyncConnection[Any]) -> AsyncCursor[Any]:
        if self._vector_type is None:
            info = await TypeInfo.fetch(conn, "vector")
            if info is None:
                raise StoreError("the pgvector extension is not installed in this database")
            vector_oid = info.oid

            class VectorDumper(Dumper):
                format = Format.BINARY
                oid = vector_oid

                def dump(self, obj: Any) -> bytes:
                    return bytes(obj)

            self._vector_type = (info, VectorDumper)
        info, dumper = self._vector_type
        cur = AsyncCursor(conn)
        info.register(cur)
        cur.adapters.register_dumper(VectorBinary, dumper)
        return cur


async def pending_embeddings(db: PgDatabase, limit: int) -> list[tuple[int, int, str]]:
    """(pk, channel_pk, text to embed) for messages without a vector yet."""
    rows = await db.read(
        "SELECT m.id, m.channel_pk, m.speaker_name, m.text FROM messages_unembedded u"
        " JOIN messages m ON m.id = u.id WHERE m.deleted_at IS NULL ORDER BY u.id LIMIT ?",
        (limit,),
    )
    return [(r[0], r[1], embed_text(r[2], r[3])) for r in rows]


async def count_pending_embeddings(db: PgDatabase) -> int:
    rows = await db.read(
        "SELECT count(*) FROM messages_unembedded u JOIN messages m ON m.id = u.id"
        " WHERE m.deleted_at IS NULL"
    )
    return int(rows[0][0])


async def store_vectors(
    db: PgDatabase,
    binary: BinaryVectors,
    items: Sequence[tuple[int, int, str]],
    vectors: np.ndarray,
    *,
    draft: bool = False,
) -> int:
    """Write vectors for messages still pending whose text did not change since they
    were read; they leave the pending set (the `messages` rows are not written)."""
    return await _write_vectors(
        db,
        binary,
        items,
        vectors,
        "SELECT m.id, m.speaker_name, m.text FROM messages_unembedded u"
        " JOIN messages m ON m.id = u.id WHERE u.id = ANY(?) AND m.deleted_at IS NULL",
        _DRAFT_VECTORS if draft else _VECTORS,
    )


async def replace_drafts(
    db: PgDatabase,
    binary: BinaryVectors,
    items: Sequence[tuple[int, int, str]],
    vectors: np.ndarray,
) -> int:
    """Write full-precision vectors over the drafts of messages whose text did not change
    since they were read."""
    return await _write_vectors(
        db,
        binary,
        items,
        vectors,
        "SELECT m.id, m.speaker_name, m.text FROM message_vectors v"
        " JOIN messages m ON m.id = v.id WHERE v.id = ANY(?) AND v.draft = 1"
        " AND m.deleted_at IS NULL",
        _FINAL_VECTORS,
    )


_VECTORS = (
    "INSERT INTO message_vectors (id, embedding)"
    " SELECT * FROM unnest(%b::bigint[], %b::bytea[])"
    " ON CONFLICT (id) DO UPDATE SET embedding = excluded.embedding"
)
"""A message's first vector, final: no `draft` column named (a new row's default, 0, is
right), so it works on every schema since the first."""
_DRAFT_VECTORS = (
    "INSERT INTO message_vectors (id, embedding, draft)"
    " SELECT p.id, p.embedding, 1 FROM unnest(%b::bigint[], %b::bytea[]) AS p(id, embedding)"
    " ON CONFLICT (id) DO UPDATE SET embedding = excluded.embedding, draft = 1"
)
_FINAL_VECTORS = (
    "UPDATE message_vectors AS v SET embedding = p.embedding, draft = 0"
    " FROM unnest(%b::bigint[], %b::bytea[]) AS p(id, embedding) WHERE v.id = p.id"
)


async def _write_vectors(
    db: PgDatabase,
    binary: BinaryVectors,
    items: Sequence[tuple[int, int, str]],
    vectors: np.ndarray,
    still: str,
    write: str,
) -> int:
    """Write vectors for the messages `still` (a query of ids, texts) returns with the text
    read, `write` (one of the statements above) into message_vectors; they leave the
    pending set."""
    if not items:
        return 0
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    async with db.transaction() as tx:
        ids = [pk for pk, _, _ in items]
        current: dict[int, str] = {}
        for start in range(0, len(ids), IN_CHUNK):
            for r in await tx.fetchall(still, (ids[start : start + IN_CHUNK],)):
                current[r[0]] = embed_text(r[1], r[2])
        keep = [i for i, (pk, _, text) in enumerate(items) if current.get(pk) == text]
        if not keep:
            return 0
        pks = [items[i][0] for i in keep]
        cur = await binary.cursor(tx.pg)
        await cur.execute(
            "INSERT INTO messages_vec (rowid, channel_pk, embedding)"
            " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::vector[])"
            " ON CONFLICT (rowid) DO UPDATE SET channel_pk = excluded.channel_pk,"
            " embedding = excluded.embedding",
            (pks, [items[i][1] for i in keep], vector_binaries(vectors[keep])),
        )
        await cur.execute(
            write,
            (pks, [vectors[i].tobytes() for i in keep]),
        )
        await tx.execute("DELETE FROM messages_unembedded WHERE id = ANY(?)", (pks,))
    return len(keep)


_NEAREST = (
    "unnest(?::bigint[], ?::bigint[]) AS p(pk, k) CROSS JOIN LATERAL (SELECT rowid, bits"
    " FROM messages_bits WHERE channel_pk = p.pk"
    " ORDER BY bits <~> binary_quantize(?::vector), rowid LIMIT p.k) AS c"
)
"""Each channel's `k` nearest rows by Hamming distance (channel pks, ks, the query)."""
_BY_HAMMING = f"SELECT c.rowid FROM {_NEAREST}"
_GIVEN = "SELECT c.rowid FROM unnest(?::bigint[]) AS c(rowid)"


async def rescored(
    db: PgDatabase,
    q: np.ndarray,
    pks: list[int],
    ks: list[int],
    *,
    total: int,
    limit: int,
    widen: bool = False,
) -> list[tuple[int, float]]:
    """The `limit` best of each channel's `ks` coarse candidates, re-scored by exact
    cosine: [(pk, similarity)] best first. `total`: how many candidates that is.

    The candidates are each channel's `ks` nearest rows by Hamming distance; with `widen`,
    the best `ks` of COARSE_WIDEN times as many, ranked again by the query's asymmetric
    score against their bits, as SQLite's coarse pass does (see `widened`).

    Up to RESCORE_ALL candidates, numpy re-scores all of them in id order, as SQLite does
    (the same input gives the same order among equal similarities). Above it, pgvector's
    inner product first narrows them to a margin over `limit` (its float sums differ from
    numpy's in the last bits only), sparing the transfer of every candidate's payload. The
    scalar subquery makes each candidate one index probe, and the payloads are fetched by
    `id = ANY(ARRAY(...))`, one probe of message_vectors' key per candidate: a join is
    planned as a scan of every vector (the planner cannot see how few candidates there
    are; at 100k messages in one channel a merge join read all 156 MB of payloads)."""
    literal = vector_literal(q)
    params: list[Any]
    if widen:
        ids = await widened(db, q, literal, pks, ks)
        candidates, params = _GIVEN, [ids]
        total = len(ids)
    else:
        candidates, params = _BY_HAMMING, [pks, ks, literal]
    if total <= RESCORE_ALL:
        # every candidate goes to numpy: no pgvector ordering (it would read each
        # candidate's row of messages_vec, one more random page per candidate)
        rows = await read_binary(
            db,
            "SELECT v.id, v.embedding FROM message_vectors v WHERE v.id = ANY(ARRAY("
            f"{candidates})) ORDER BY v.id",
            params,
        )
    else:
        rows = await read_binary(
            db,
            "SELECT v.id, v.embedding FROM message_vectors v WHERE v.id = ANY(ARRAY("
            f"{candidates} ORDER BY (SELECT e.embedding <#> ?::vector FROM messages_vec e"
            " WHERE e.rowid = c.rowid), c.rowid LIMIT ?)) ORDER BY v.id",
            [*params, literal, 2 * limit + RESCORE_MARGIN],
        )
    if not rows:
        return []
    return await asyncio.to_thread(rescore, [(int(r[0]), bytes(r[1])) for r in rows], q, limit)


async def widened(
    db: PgDatabase, q: np.ndarray, literal: str, pks: list[int], ks: list[int]
) -> list[int]:
    """Each channel's `ks` best of its COARSE_WIDEN * `ks` nearest rows by Hamming
    distance, by the query's asymmetric score against their sign bits (computed in numpy
    from the bits the scan returns: `varbit_send`'s bytes after its 4-byte length)."""
    rows = await read_binary(
        db,
        f"SELECT p.pk, c.rowid, varbit_send(c.bits) FROM {_NEAREST}",
        (pks, [COARSE_WIDEN * k for k in ks], literal),
    )
    return await asyncio.to_thread(_best_by_query, rows, q, dict(zip(pks, ks, strict=True)))


def _best_by_query(rows: Sequence[Any], q: np.ndarray, keep: dict[int, int]) -> list[int]:
    by_channel: dict[int, list[Any]] = {}
    for pk, rowid, bits in rows:
        by_channel.setdefault(int(pk), []).append((int(rowid), bytes(bits)[4:]))
    out: list[int] = []
    for pk, items in by_channel.items():
        ids = np.array([i for i, _ in items], dtype=np.int64)
        raw = np.frombuffer(b"".join(b for _, b in items), dtype=np.uint8)
        # PostgreSQL's bit strings put the first bit in a byte's high bit; the asymmetric
        # score reads them in `quantize_bits`' order (the first bit low)
        bits = np.unpackbits(raw.reshape(len(items), -1), axis=1, bitorder="big")
        packed = np.packbits(bits, axis=1, bitorder="little")
        out.extend(int(i) for i in ids[asymmetric_top(packed, q, keep[pk])])
    return out


async def read_binary(db: PgDatabase, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of a read with results in binary: a float32 payload (bytea) arrives as
    its bytes; in text the server spells it in hex and the client parses that back
    (800 candidates' payloads: 14-30 ms -> 9 ms for the statement on 1M messages)."""
    async with db.reader() as conn, AsyncCursor(conn) as cur:
        await cur.execute(translate(sql), params, binary=True)
        return list(await cur.fetchall())


class VectorBinary(bytes):
    """A vector in pgvector's binary form, bound as `vector` by `_binary_cursor`."""


_VECTOR_HEAD = struct.Struct(">HH")


def vector_binaries(vectors: np.ndarray) -> list[VectorBinary]:
    """pgvector's binary form of each row of a float32 matrix: the dimension and an unused
    word (big-endian uint16 each), then the floats big-endian (exact: the same four bytes)."""
    rows = np.ascontiguousarray(vectors, dtype=">f4").reshape(len(vectors), -1)
    head = _VECTOR_HEAD.pack(rows.shape[1], 0)
    return [VectorBinary(head + row.tobytes()) for row in rows]


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form of a float32 vector (9 significant digits round-trip exactly)."""
    return "[" + ",".join(f"{float(x):.9g}" for x in np.asarray(vector).reshape(-1)) + "]"
