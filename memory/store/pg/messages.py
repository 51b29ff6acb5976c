"""System 1 on PostgreSQL: the SQLite `MessageRepo` with its SQLite-only SQL replaced.

What changes (everything else — placement into sessions, turns and segments, the
convergence of creates, edits and deletes — is the base class's code):

- Ingest: one transaction-scoped advisory lock serialises ingest across processes, as
  SQLite's single writer does (placement reads each channel's cursor and the next segment
  id, so two concurrent batches must not interleave); JSON table functions become
  `unnest` joins, `INSERT OR IGNORE` becomes `ON CONFLICT DO NOTHING`, and the full-text
  index needs no write of its own (a generated column, see messages_schema.py).
- Lexical search: the FTS5 MATCH expressions the callers build (OR-ed quoted words and
  phrases, some limited to the text column) are parsed into `tsquery`s; matching rows of
  the channels come from the GIN index (each row's tsvector holds its channel's tag, so the
  index intersects the terms with the channels) and are ranked by Okapi BM25 computed in SQL with
  FTS5's constants and column weights (text 1.0, speaker name 0.5), so the ranking keeps
  the inverse document frequency that `ts_rank_cd` lacks (see `_BM25_SQL`).
- Dense search: as on SQLite, a Hamming scan over the stored sign bits of the channels'
  vectors picks the candidates (`dense_oversample` of them, or the configured fraction of
  a large channel); their float32 payloads are re-scored with numpy exactly as on SQLite,
  so both backends return the same similarities.
"""

from __future__ import annotations

import asyncio
import math
import re
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg import AsyncCursor
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo

from memory.models import MessageEvent
from memory.store.database import IN_CHUNK, StoreError, Transaction
from memory.store.governance import GovernanceRepo
from memory.store.messages import MessageRepo, _Early, embed_text, speaker_phrase
from memory.store.pg.database import translate
from memory.store.pg.messages_schema import TS_CONFIG, fts_input
from memory.store.vectors import rescore

INGEST_LOCK = 0x53504D53  # "SPMS": the advisory lock id that serialises message ingest

K1, B = 1.2, 0.75
"""FTS5's bm25() constants."""
WEIGHT_TEXT, WEIGHT_SPEAKER = 1.0, 0.5
"""Column weights of every lexical query (bm25(messages_fts, 1.0, 0.5, 0.0) on SQLite)."""
MIN_IDF = 1e-6
"""FTS5 floors a term's IDF here when it occurs in more than half of the rows."""
STATS_TTL_S = 30.0
STATS_EXACT_BELOW = 5_000
"""Corpus statistics (row count, mean length) are re-read on every query below this many
live messages and at most every STATS_TTL_S above it (a full scan; the IDF barely moves)."""

PRUNE_BUDGET = 4_000
"""On a large corpus, lexical search first scores only the rows matching its rarest terms
(as many terms as fit this many matches) and returns that ranking when the
other terms together cannot lift an unscored row into it (exact; see
`PgMessageRepo.lexical`), else adds COMMON_FILL rows of the other terms (approximate)."""
COMMON_FILL = 1_000
"""When the rarest terms' rows cannot decide a large corpus' lexical ranking, this many rows
matching only its common terms are scored with them (see `PgMessageRepo.lexical`)."""
RESCORE_ALL, RESCORE_MARGIN = 1_000, 16
"""Dense search hands numpy every candidate up to RESCORE_ALL of them, else the
2 * limit + RESCORE_MARGIN best by pgvector's inner product (see `PgMessageRepo.dense`)."""
TAG_SHARE = 0.5
"""Lexical search filters by channel tags in the GIN index when the searched channels hold
under this share of the live messages (see `PgMessageRepo._channel_filter`)."""
DF_ESTIMATE_ABOVE = 5_000
"""A common word's document frequency comes from ANALYZE's sampled lexeme frequencies
(about 2 % off at 20,000 of a million rows) once it reaches this many rows; below it, and
for phrases and column-limited words, it is counted exactly (see `_DF_SQL`)."""
DF_CACHE = 4_096
"""Document frequencies kept per process (each expires with the corpus statistics)."""

# A quoted FTS5 string, optionally behind a column filter: `{text} : "word"`, `"a b"`.
_ITEM = re.compile(r'(?:\{([^}]*)\}\s*:\s*)?"((?:[^"]|"")*)"')


def parse_match(match: str, *, columns: str = "AB") -> list[tuple[str, str]]:
    """The quoted strings of an FTS5 OR-expression as (raw text, columns 'A'/'B'/'AB').

    The callers' expressions are ORs of quoted words or phrases (`build_match`,
    `phrase_match`, `speaker_phrase`), some under a `{text}` or `{speaker_name}` filter;
    operators between them carry no other meaning here."""
    out: list[tuple[str, str]] = []
    for cols, raw in _ITEM.findall(match):
        weights = columns
        if cols.strip():
            names = set(cols.split())
            weights = "".join(
                w for w, name in (("A", "text"), ("B", "speaker_name")) if name in names
            )
            weights = "".join(c for c in weights if c in columns)
        if weights:
            out.append((raw.replace('""', '"'), weights))
    return out


class PgMessageRepo(MessageRepo):
    _SESSIONS_SQL = (
        "INSERT INTO sessions (channel_pk, platform, workspace, channel, session_id,"
        " started_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
    )
    _SEGMENT_UPDATE_SQL = (
        "UPDATE segments SET n_messages = ?, last_message_at = GREATEST(last_message_at, ?),"
        " state = CASE WHEN ? <> 0 THEN 'pending' ELSE state END,"
        " closed_at = CASE WHEN ? <> 0 THEN ? ELSE closed_at END WHERE id = ?"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stats: tuple[float, int, float] | None = None  # (read at, rows, mean length)
        self._df: dict[tuple[str, str], tuple[float, int]] = {}  # (raw, ws) -> (read at, df)
        self._sizes: dict[int, tuple[float, int]] = {}  # channel -> (read at, vectors)
        self._vector_type: tuple[TypeInfo, type[Dumper]] | None = None  # see _binary_cursor

    # ---- writes -------------------------------------------------------------------------

    async def _ingest_tx(
        self, tx: Transaction, events: Sequence[MessageEvent], channel_default: bool
    ) -> list[Any]:
        await tx.execute("SELECT pg_advisory_xact_lock(?)", (INGEST_LOCK,))
        return await super()._ingest_tx(tx, events, channel_default)

    async def _serialise_with_ingest(self, tx: Transaction) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock(?)", (INGEST_LOCK,))

    @staticmethod
    async def _index_new_messages(tx: Transaction, last_message_pk: int) -> None:
        """Nothing to do: `messages.fts` is a generated column."""

    def _governance(self) -> GovernanceRepo:
        try:
            from memory.store.pg.governance import PgGovernanceRepo
        except ImportError:  # pragma: no cover - before the PostgreSQL governance port
            return GovernanceRepo(self.db, self.channels)
        return PgGovernanceRepo(self.db, self.channels)

    @staticmethod
    async def _existing_pairs(tx: Transaction, pairs: list[tuple[int, str]]) -> dict[int, set[str]]:
        found: dict[int, set[str]] = {}
        for start in range(0, len(pairs), 5_000):
            chunk = pairs[start : start + 5_000]
            for r in await tx.fetchall(
                "SELECT m.channel_pk, m.message_id FROM unnest(?::bigint[], ?::text[])"
                " AS j(pk, mid) JOIN messages AS m ON m.channel_pk = j.pk"
                " AND m.message_id = j.mid",
                ([p for p, _ in chunk], [m for _, m in chunk]),
            ):
                found.setdefault(r[0], set()).add(r[1])
        return found

    async def _early_changes(
        self, tx: Transaction, events: Sequence[MessageEvent]
    ) -> dict[tuple[str, ...], _Early]:
        if await tx.fetchone("SELECT 1 FROM early_changes LIMIT 1") is None:
            return {}
        await self._prune_early_edits(tx)
        keys = [(*ev.scope.key(), ev.message_id) for ev in events]
        out: dict[tuple[str, ...], _Early] = {}
        for start in range(0, len(keys), 5_000):
            chunk = keys[start : start + 5_000]
            for r in await tx.fetchall(
                "SELECT e.platform, e.workspace, e.channel, e.message_id, e.deleted_at, e.text,"
                " e.edited_at FROM unnest(?::text[], ?::text[], ?::text[], ?::text[])"
                " AS j(p, w, c, m) JOIN early_changes AS e ON e.platform = j.p"
                " AND e.workspace = j.w AND e.channel = j.c AND e.message_id = j.m",
                tuple([k[i] for k in chunk] for i in range(4)),
            ):
                out[(r[0], r[1], r[2], r[3])] = _Early(r[4] is not None, r[5], r[6])
        return out

    # ---- embeddings ---------------------------------------------------------------------
    # The pending set is the table `messages_unembedded` (see messages_schema.py), kept by
    # triggers from what the writers set in `messages.embedded`; storing a vector deletes
    # the message's row there and never rewrites the `messages` row.

    async def pending_embeddings(self, limit: int) -> list[tuple[int, int, str]]:
        """(pk, channel_pk, text to embed) for messages without a vector yet."""
        rows = await self.db.read(
            "SELECT m.id, m.channel_pk, m.speaker_name, m.text FROM messages_unembedded u"
            " JOIN messages m ON m.id = u.id WHERE m.deleted_at IS NULL ORDER BY u.id LIMIT ?",
            (limit,),
        )
        return [(r[0], r[1], embed_text(r[2], r[3])) for r in rows]

    async def count_pending_embeddings(self) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM messages_unembedded u JOIN messages m ON m.id = u.id"
            " WHERE m.deleted_at IS NULL"
        )
        return int(rows[0][0])

    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int:
        """Write vectors for messages still pending whose text did not change since they
        were read; they leave the pending set (the `messages` rows are not written)."""
        if not items:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        async with self.db.transaction() as tx:
            ids = [pk for pk, _, _ in items]
            current: dict[int, str] = {}
            for start in range(0, len(ids), IN_CHUNK):
                for r in await tx.fetchall(
                    "SELECT m.id, m.speaker_name, m.text FROM messages_unembedded u"
                    " JOIN messages m ON m.id = u.id WHERE u.id = ANY(?)"
                    " AND m.deleted_at IS NULL",
                    (ids[start : start + IN_CHUNK],),
                ):
                    current[r[0]] = embed_text(r[1], r[2])
            keep = [i for i, (pk, _, text) in enumerate(items) if current.get(pk) == text]
            if not keep:
                return 0
            pks = [items[i][0] for i in keep]
            cur = await self._binary_cursor(tx)
            await cur.execute(
                "INSERT INTO messages_vec (rowid, channel_pk, embedding)"
                " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::vector[])"
                " ON CONFLICT (rowid) DO UPDATE SET channel_pk = excluded.channel_pk,"
                " embedding = excluded.embedding",
                (pks, [items[i][1] for i in keep], vector_binaries(vectors[keep])),
            )
            await cur.execute(
                "INSERT INTO message_vectors (id, embedding)"
                " SELECT * FROM unnest(%b::bigint[], %b::bytea[])"
                " ON CONFLICT (id) DO UPDATE SET embedding = excluded.embedding",
                (pks, [vectors[i].tobytes() for i in keep]),
            )
            await tx.execute(
                "DELETE FROM messages_unembedded WHERE id = ANY(?)", ([items[i][0] for i in keep],)
            )
        return len(keep)

    async def _binary_cursor(self, tx: Transaction) -> Any:
        """A cursor on the transaction's connection that binds parameters on the server in
        binary (`%b`): the connections' own cursors bind on the client, which spells every
        float of a vector out in decimal (text the server parses again) and every payload
        in hex; binary sends each float32 once as its four bytes (about 7x faster for a
        batch of vectors). pgvector's `vector` type is looked up once per store."""
        conn = tx.pg  # type: ignore[attr-defined]
        if self._vector_type is None:
            info = await TypeInfo.fetch(conn, "vector")
            if info is None:
                raise StoreError("the pgvector extension is not installed in this database")

            class VectorDumper(Dumper):
                format = Format.BINARY
                oid = info.oid

                def dump(self, obj: Any) -> bytes:
                    return bytes(obj)

            self._vector_type = (info, VectorDumper)
        info, dumper = self._vector_type
        cur = AsyncCursor(conn)
        info.register(cur)
        cur.adapters.register_dumper(VectorBinary, dumper)
        return cur

    # ---- lexical ------------------------------------------------------------------------

    async def _cached_stats(self) -> tuple[float, float] | None:
        """(live messages, mean token count) from a per-process cache on a large corpus;
        None on a small one, whose statement computes them exactly (one cheap scan)."""
        now = time.monotonic()
        if self._stats is None or now - self._stats[0] >= STATS_TTL_S:
            r = (
                await self.db.read(
                    "SELECT count(*), coalesce(avg(fts_len), 0) FROM messages"
                    " WHERE deleted_at IS NULL"
                )
            )[0]
            self._stats = (now, int(r[0]), float(r[1]))
        _, rows, mean = self._stats
        return (float(rows), mean) if rows >= STATS_EXACT_BELOW else None

    async def _scored(
        self,
        match: str,
        channel_pks: Sequence[int],
        *,
        speakers: Sequence[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        items: list[tuple[str, str]] | None = None,
        dfs: Sequence[float | None] | None = None,
        essential: Sequence[int] | None = None,
        stats: tuple[float, float] | None = None,
        fill: int = 0,
    ) -> tuple[str, list[Any]] | None:
        """One statement selecting (id, speaker_id, score) of the channels' live matches,
        score the negative BM25 (lower is better, as FTS5's bm25()); None when nothing can
        match. `dfs` (aligned with the parsed items) supplies known document frequencies;
        `essential` (1-based item numbers) restricts the scored rows to those matching one
        of these items (each such row still gets its full score over every item), plus
        at most `fill` rows matching only the other items (the first the index yields)."""
        if items is None:
            items = parse_match(match)
        if not items:
            return None
        if stats is None:
            stats = await self._cached_stats()
        filters = ""
        extra: list[Any] = []
        if speakers:
            filters += " AND m.speaker_id = ANY(?)"
            extra.append(list(speakers))
        if since is not None:
            filters += " AND m.ts >= ?"
            extra.append(since)
        if until is not None:
            filters += " AND m.ts < ?"
            extra.append(until)
        params: list[Any] = [
            *(stats or (None, None)),
            stats is None,
            [raw for raw, _ in items],
            [weights for _, weights in items],
            MIN_IDF,
            MIN_IDF,
            list(dfs) if dfs is not None else [None] * len(items),
            None if essential is None else list(essential),
            None if essential is None else list(essential),
            list(dict.fromkeys(int(pk) for pk in channel_pks)),
            *extra,
            None if essential is None else list(essential),
            list(dict.fromkeys(int(pk) for pk in channel_pks)),
            *extra,
            fill if essential is not None else 0,
            WEIGHT_TEXT,
            WEIGHT_SPEAKER,
            WEIGHT_TEXT,
            WEIGHT_SPEAKER,
            K1 + 1,
            K1,
            1 - B,
            B,
        ]
        channels = await self._channel_filter(channel_pks, stats)
        return _BM25_SQL.format(filters=filters, channels=channels), params

    async def _channel_filter(
        self, channel_pks: Sequence[int], stats: tuple[float, float] | None
    ) -> str:
        """How the statement keeps the searched channels' rows (one `?`: the channel pks).

        Their channel tags (`fts @@ speakermem_channels(...)`: the GIN index intersects the
        terms with the channels) when the channels hold under TAG_SHARE of a large corpus;
        else `channel_pk` on the matched rows: when they hold most rows, intersecting with
        their long posting lists costs more than it filters out (100k messages in one
        channel: +6 ms a query). A channel's size is its vector count (`_channel_sizes`,
        cached): a corpus without vectors always takes the tags."""
        if stats is not None:
            pks = list(dict.fromkeys(int(pk) for pk in channel_pks))
            sizes = await self._channel_sizes(pks)
            if sum(sizes.get(pk, 0) for pk in pks) < TAG_SHARE * stats[0]:
                return "m.fts @@ speakermem_channels(?::bigint[])"
        return "m.channel_pk = ANY(?::bigint[])"

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
        """BM25 over the given channels' live messages: [(pk, -bm25)] best first.

        `speaker_names` narrows FTS5's search on SQLite; here the speaker-id filter alone
        does (an index on the matches), so the names are not needed."""
        if not match or not channel_pks:
            return []
        items = parse_match(match)
        if not items:
            return []
        stats = await self._cached_stats()
        dfs: list[float | None] | None = None
        if stats is not None:
            # Large corpus: every row of the rarest terms is scored, plus at most COMMON_FILL
            # rows matching only the common ones, in one statement. A term adds less than
            # idf * (k1 + 1) to any row (f / (f + K) < 1), so when the common terms' bounds
            # sum below the limit-th score of the rare terms' rows, no row matching only
            # common terms can enter the ranking and the result equals the full
            # computation's (MaxScore); the fill rows then score below it and change nothing.
            # Scoring the rare rows alone first, to stop there when they decide, cost a
            # second statement on every query they did not decide (p95 doubled).
            dfs = await self._doc_freqs(items)
            known = [(i, df) for i, df in enumerate(dfs) if df is not None]
            order = sorted(known, key=lambda t: t[1])
            essential: list[int] = []
            total = 0.0
            for i, df in order:
                if total + df > PRUNE_BUDGET:
                    break
                essential.append(i)
                total += df
            rest = [df for i, df in order if i not in essential]
            if rest:
                ess = [i + 1 for i in essential]
                # The rarest terms cannot decide the ranking alone: the rest of it comes
                # from rows matching only common terms, of which at most COMMON_FILL (the
                # first the index yields) are scored, not every one (an approximation:
                # scoring tens of thousands of rows does not fit a search's time).
                return await self._ranked(
                    match,
                    channel_pks,
                    limit,
                    items,
                    dfs,
                    ess,
                    stats,
                    fill=COMMON_FILL,
                    speakers=speakers,
                    since=since,
                    until=until,
                )
        return await self._ranked(
            match,
            channel_pks,
            limit,
            items,
            dfs,
            None,
            stats,
            speakers=speakers,
            since=since,
            until=until,
        )

    async def _ranked(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        items: list[tuple[str, str]],
        dfs: Sequence[float | None] | None,
        essential: Sequence[int] | None,
        stats: tuple[float, float] | None,
        *,
        fill: int = 0,
        speakers: Sequence[str] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[tuple[int, float]]:
        scored = await self._scored(
            match,
            channel_pks,
            items=items,
            dfs=dfs,
            essential=essential,
            stats=stats,
            fill=fill,
            speakers=speakers,
            since=since,
            until=until,
        )
        if scored is None:
            return []
        sql, params = scored
        rows = await self.db.read(
            f"SELECT id, score FROM ({sql}) s ORDER BY score, id LIMIT ?", [*params, limit]
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    async def _doc_freqs(self, items: list[tuple[str, str]]) -> list[float | None]:
        """Each item's document frequency over all live messages (None: no lexeme), from a
        per-process cache that expires with the corpus statistics."""
        now = time.monotonic()
        out: list[float | None] = [None] * len(items)
        missing: list[int] = []
        for n, item in enumerate(items):
            hit = self._df.get(item)
            if hit is not None and now - hit[0] < STATS_TTL_S:
                out[n] = float(hit[1])
            else:
                missing.append(n)
        if missing:
            stats = await self._cached_stats()
            rows = await self.db.read(
                _DF_SQL,
                (
                    DF_ESTIMATE_ABOVE,
                    [items[n][0] for n in missing],
                    [items[n][1] for n in missing],
                    stats[0] if stats is not None else 0.0,
                ),
            )
            if len(self._df) > DF_CACHE:
                self._df.clear()
            for i, df in rows:
                n = missing[int(i) - 1]
                out[n] = float(df)
                self._df[items[n]] = (now, int(df))
        return out

    async def lexical_by_speaker(
        self, match: str, channel_pks: Sequence[int], speakers: Sequence[str], per_speaker: int
    ) -> dict[str, list[int]]:
        speakers = list(dict.fromkeys(speakers))
        if not match or not channel_pks or not speakers or per_speaker <= 0:
            return {}
        scored = await self._scored(match, channel_pks, speakers=speakers)
        if scored is None:
            return {}
        sql, params = scored
        rows = await self.db.read(
            "SELECT id, speaker_id FROM (SELECT id, speaker_id, row_number() OVER"
            f" (PARTITION BY speaker_id ORDER BY score, id) AS rn FROM ({sql}) s) r"
            " WHERE rn <= ? ORDER BY speaker_id, rn",
            [*params, per_speaker],
        )
        out: dict[str, list[int]] = {}
        for pk, speaker in rows:
            out.setdefault(speaker, []).append(int(pk))
        return out

    async def lowercase_share(
        self, word: str, channel_pks: Sequence[int], *, sample: int = 200
    ) -> tuple[int, float]:
        phrase = speaker_phrase(word)
        if not phrase or not channel_pks:
            return 0, 0.0
        raw = " ".join(raw for raw, _ in parse_match(phrase))
        query = f"phraseto_tsquery('{TS_CONFIG}', {fts_input('?::text')})"
        text_only = _weighted(query, "'A'")
        rows = await self.db.read(
            f"SELECT text FROM messages WHERE fts @@ {text_only}"
            " AND deleted_at IS NULL AND channel_pk = ANY(?) LIMIT ?",
            (raw, list(channel_pks), sample),
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

    async def session_term_counts(
        self, terms: Sequence[str], channel_pks: Sequence[int], *, cap: int = 2000
    ) -> dict[str, dict[tuple[int, int], int]]:
        if not channel_pks:
            return {}
        pks = list(dict.fromkeys(int(pk) for pk in channel_pks))
        out: dict[str, dict[tuple[int, int], int]] = {}
        # one statement for all terms: each term's capped match count, then the per-session
        # counts of the terms under the cap (-1 marks a term with no match at all)
        raws = {term: " ".join(raw for raw, _ in parse_match(term)) for term in terms}
        if not raws:
            return out
        rows = await self.db.read(
            "WITH t AS MATERIALIZED (SELECT v.i, v.q, (SELECT count(*) FROM (SELECT 1"
            " FROM messages WHERE fts @@ v.q AND deleted_at IS NULL"
            " AND channel_pk = ANY(?::bigint[]) LIMIT ?) f) AS hits FROM (SELECT u.i,"
            f" phraseto_tsquery('{TS_CONFIG}', {fts_input('u.raw')}) AS q"
            " FROM unnest(?::text[]) WITH ORDINALITY AS u(raw, i)) v)"
            " SELECT t.i, m.channel_pk, m.session_id, count(*) FROM t JOIN messages m"
            " ON m.fts @@ t.q AND m.deleted_at IS NULL"
            " AND m.channel_pk = ANY(?::bigint[]) WHERE t.hits BETWEEN 1 AND ?"
            " GROUP BY t.i, m.channel_pk, m.session_id"
            " UNION ALL SELECT t.i, -1, -1, 0 FROM t WHERE t.hits = 0",
            (pks, cap + 1, list(raws.values()), pks, cap),
        )
        names = list(raws)
        for i, channel_pk, session_id, n in rows:
            counts = out.setdefault(names[int(i) - 1], {})
            if int(n) > 0:
                counts[(int(channel_pk), int(session_id))] = int(n)
        return out

    # ---- dense --------------------------------------------------------------------------

    async def dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        limit: int,
        oversample: int,
        oversample_fraction: float = 0.0,
    ) -> list[tuple[int, float]]:
        """Vector KNN over the given channels: [(pk, cosine similarity)] best first.

        As on SQLite: a coarse Hamming KNN on the stored sign bits (`messages_bits`)
        picks, per channel, max(`limit`, `oversample`, `oversample_fraction` of the
        channel's vectors) candidates; their float32 payloads are re-scored with numpy.
        The scan reads the narrow bits table only, never the float vectors."""
        if not channel_pks:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        pks = list(dict.fromkeys(int(pk) for pk in channel_pks))
        k = max(limit, oversample)
        sizes = await self._channel_sizes(pks)
        ks = [max(k, math.ceil(oversample_fraction * sizes.get(pk, 0))) for pk in pks]
        total = sum(min(kc, sizes.get(pk, 0)) for pk, kc in zip(pks, ks, strict=True))
        # Up to RESCORE_ALL candidates, numpy re-scores all of them in id order, as SQLite
        # does (the same input gives the same order among equal similarities). Above it,
        # pgvector's inner product first narrows them to a margin over `limit` (its float
        # sums differ from numpy's in the last bits only), sparing the transfer of every
        # candidate's payload. The scalar subquery makes each candidate one index probe
        # (a join is planned as a scan of every vector: the planner cannot see how few
        # candidates there are).
        literal = vector_literal(q)
        if total <= RESCORE_ALL:
            # every candidate goes to numpy: no pgvector ordering (it would read each
            # candidate's row of messages_vec, one more random page per candidate)
            rows = await self._read_binary(
                "SELECT v.id, v.embedding FROM unnest(?::bigint[], ?::bigint[]) AS p(pk, k)"
                " CROSS JOIN LATERAL (SELECT rowid FROM messages_bits WHERE channel_pk = p.pk"
                " ORDER BY bits <~> binary_quantize(?::vector), rowid LIMIT p.k) AS c"
                " JOIN message_vectors v ON v.id = c.rowid ORDER BY v.id",
                (pks, ks, literal),
            )
            if not rows:
                return []
            return await asyncio.to_thread(
                rescore, [(int(r[0]), bytes(r[1])) for r in rows], q, limit
            )
        keep = 2 * limit + RESCORE_MARGIN
        rows = await self._read_binary(
            "SELECT v.id, v.embedding FROM (SELECT c.rowid FROM unnest(?::bigint[], ?::bigint[])"
            " AS p(pk, k) CROSS JOIN LATERAL (SELECT rowid FROM messages_bits"
            " WHERE channel_pk = p.pk ORDER BY bits <~> binary_quantize(?::vector), rowid"
            " LIMIT p.k) AS c ORDER BY (SELECT e.embedding <#> ?::vector FROM messages_vec e"
            " WHERE e.rowid = c.rowid), c.rowid LIMIT ?) AS r"
            " JOIN message_vectors v ON v.id = r.rowid ORDER BY v.id",
            (pks, ks, literal, literal, keep),
        )
        if not rows:
            return []
        return await asyncio.to_thread(rescore, [(int(r[0]), bytes(r[1])) for r in rows], q, limit)

    async def _read_binary(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of a read with results in binary: a float32 payload (bytea) arrives as
        its bytes; in text the server spells it in hex and the client parses that back
        (800 candidates' payloads: 14-30 ms -> 9 ms for the statement on 1M messages)."""
        reader: Any
        async with self.db.reader() as reader, AsyncCursor(reader.conn) as cur:
            await cur.execute(translate(sql), params, binary=True)
            return list(await cur.fetchall())

    async def _channel_sizes(self, pks: list[int]) -> dict[int, int]:
        """Vectors per channel (candidate counts), cached per process for
        STATS_TTL_S once a channel holds STATS_EXACT_BELOW of them (a count scans them)."""
        now = time.monotonic()
        out: dict[int, int] = {}
        missing = []
        for pk in pks:
            hit = self._sizes.get(pk)
            if hit is not None and now - hit[0] < STATS_TTL_S and hit[1] >= STATS_EXACT_BELOW:
                out[pk] = hit[1]
            else:
                missing.append(pk)
        if missing:
            for pk, n in await self.db.read(
                "SELECT channel_pk, count(*) FROM messages_bits WHERE channel_pk = ANY(?)"
                " GROUP BY channel_pk",
                (missing,),
            ):
                out[int(pk)] = int(n)
                self._sizes[int(pk)] = (now, int(n))
        return out

    # ---- counts -------------------------------------------------------------------------

    async def counts(self) -> dict[str, int]:
        r = (
            await self.db.read(
                "SELECT count(*), count(*) FILTER (WHERE deleted_at IS NOT NULL),"
                " (SELECT count(*) FROM messages_unembedded u JOIN messages p ON p.id = u.id"
                " WHERE p.deleted_at IS NULL), count(DISTINCT channel_pk) FROM messages"
            )
        )[0]
        return {
            "messages": int(r[0]) - int(r[1]),
            "deleted": int(r[1]),
            "unembedded": int(r[2]),
            "channels_with_messages": int(r[3]),
        }


def _weighted(query: str, weights: str, allowed: str = "'AB'") -> str:
    """SQL restricting a tsquery's lexemes to the columns `weights` ('A' text, 'B' speaker
    name, 'AB'), NULL when they are not among the term's `allowed` columns (both SQL text
    expressions). Lexemes hold no quote (the text search input has no punctuation), so
    rewriting the query's text form is safe."""
    return (
        f"CASE WHEN strpos({allowed}, {weights}) > 0 THEN regexp_replace(({query})::text,"
        f" '''([^'']*)''', '''\\1'':' || {weights}, 'g')::tsquery END"
    )


# Okapi BM25 as FTS5 computes it, per matching row m:
#   sum over terms t of idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * |m| / avg|m|))
# idf(t) = ln((N - n_t + 0.5) / (n_t + 0.5)), floored at 1e-6, over all live messages (FTS5
# counts the whole index, not the searched channels). f: for a single word, its occurrences
# in the allowed columns weighted by column (text 1.0, speaker name 0.5), read from the
# tsvector's positions (each matching row's tsvector is unnested once, joined to the
# terms); for a phrase, 1.0 when it occurs in the text plus 0.5 when it occurs in the name
# (a tsvector keeps no phrase counts). |m| is the row's token count (messages.fts_len).
# `stats` reads N and avg|m| from the parameters, or (third parameter true) computes them;
# a term's document frequency comes from the parameters when known, else is counted; the
# rows scored are those matching any term, or any of the listed (essential) terms;
# the terms arrive as raw text and columns and are normalised here (one round trip).
_BM25_SQL = f"""
WITH stats AS (
    SELECT coalesce(?::float8, count(*)::float8) AS n,
           coalesce(?::float8, avg(fts_len)::float8, 0) AS avglen
    FROM messages WHERE deleted_at IS NULL AND ?::boolean
), t0 AS MATERIALIZED (
    SELECT u.i, u.ws, phraseto_tsquery('{TS_CONFIG}', {fts_input("u.raw")}) AS tq
    FROM unnest(?::text[], ?::text[]) WITH ORDINALITY AS u(raw, ws, i)
), q AS MATERIALIZED (
    SELECT t0.i, t0.ws,
           CASE WHEN numnode(t0.tq) = 1 THEN btrim(t0.tq::text, '''') END AS lex,
           {_weighted("t0.tq", "'A'", "t0.ws")} AS qa,
           {_weighted("t0.tq", "'B'", "t0.ws")} AS qb,
           CASE WHEN t0.ws = 'AB' THEN t0.tq ELSE {_weighted("t0.tq", "t0.ws", "t0.ws")} END AS qw
    FROM t0 WHERE numnode(t0.tq) > 0
), terms AS MATERIALIZED (
    SELECT q.i, q.lex, q.ws, q.qa, q.qb, q.qw,
           CASE WHEN s.n - d.df + 0.5 > 0
                THEN greatest(ln((s.n - d.df + 0.5) / (d.df + 0.5)), ?::float8)
                ELSE ?::float8 END AS idf
    FROM q CROSS JOIN stats s CROSS JOIN LATERAL (
        SELECT coalesce((?::float8[])[q.i], (SELECT count(*) FROM messages
                        WHERE fts @@ q.qw AND deleted_at IS NULL)) AS df
    ) d
), hits AS MATERIALIZED (
    SELECT m.id, m.speaker_id, m.fts, m.fts_len FROM messages m
    WHERE m.fts @@ (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms
                    WHERE ?::int[] IS NULL OR i = ANY(?::int[]))
      AND m.deleted_at IS NULL AND {{channels}}
    {{filters}}
    UNION
    (SELECT m.id, m.speaker_id, m.fts, m.fts_len FROM messages m
     WHERE m.fts @@ (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms
                     WHERE NOT (i = ANY(?::int[])))
       AND m.deleted_at IS NULL AND {{channels}}
     {{filters}}
     LIMIT ?)
), tf AS (
    SELECT h.id, h.speaker_id, h.fts_len, t.i,
           sum(CASE w WHEN 'A' THEN ?::float8 ELSE ?::float8 END) AS f
    FROM hits h CROSS JOIN LATERAL (
        SELECT lexeme, weights FROM unnest(h.fts)
        WHERE lexeme = ANY(ARRAY(SELECT lex FROM terms WHERE lex IS NOT NULL))
    ) AS u
    JOIN terms t ON t.lex = u.lexeme
    CROSS JOIN LATERAL unnest(u.weights) AS w
    WHERE strpos(t.ws, w) > 0
    GROUP BY h.id, h.speaker_id, h.fts_len, t.i
    UNION ALL
    SELECT h.id, h.speaker_id, h.fts_len, t.i, CASE WHEN h.fts @@ t.qa THEN ?::float8 ELSE 0 END
                      + CASE WHEN h.fts @@ t.qb THEN ?::float8 ELSE 0 END
    FROM hits h JOIN terms t ON t.lex IS NULL
)
SELECT tf.id AS id, tf.speaker_id AS speaker_id,
       -sum(t.idf * tf.f * ?::float8 / (tf.f + ?::float8
            * (?::float8 + ?::float8 * tf.fts_len / greatest(s.avglen, 1e-9)))) AS score
FROM tf JOIN terms t ON t.i = tf.i CROSS JOIN stats s
WHERE tf.f > 0
GROUP BY tf.id, tf.speaker_id"""


def _idf(n: float, df: float) -> float:
    """FTS5's IDF as the statement computes it (floored at MIN_IDF)."""
    if n - df + 0.5 <= 0:
        return MIN_IDF
    return max(math.log((n - df + 0.5) / (df + 0.5)), MIN_IDF)


# Each item's document frequency over all live messages (items without lexemes: no row).
# A single word searched in both columns that ANALYZE lists among the most common lexemes
# of `messages.fts` with at least DF_ESTIMATE_ABOVE rows (frequency x live rows) takes
# that estimate; every other item is counted (a count reads each matching row's heap page:
# hundreds of milliseconds for a word in a tenth of a million rows; a rare word is cheap).
_DF_SQL = f"""
SELECT t0.i, CASE WHEN e.df >= ?::float8 THEN e.df
    ELSE (SELECT count(*) FROM messages WHERE deleted_at IS NULL AND fts @@
          CASE WHEN t0.ws = 'AB' THEN t0.tq ELSE {_weighted("t0.tq", "t0.ws", "t0.ws")} END)
    END
FROM (SELECT u.i, u.ws, phraseto_tsquery('{TS_CONFIG}', {fts_input("u.raw")}) AS tq
      FROM unnest(?::text[], ?::text[]) WITH ORDINALITY AS u(raw, ws, i)) t0
LEFT JOIN LATERAL (
    SELECT round(f.freq * ?::float8) AS df
    FROM pg_stats s CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[],
                                              s.most_common_elem_freqs) AS f(lex, freq)
    WHERE s.schemaname = current_schema() AND s.tablename = 'messages' AND s.attname = 'fts'
      AND t0.ws = 'AB' AND numnode(t0.tq) = 1 AND f.lex = btrim(t0.tq::text, '''')
    LIMIT 1
) e ON true
WHERE numnode(t0.tq) > 0"""


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
