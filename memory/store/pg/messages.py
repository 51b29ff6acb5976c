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
  the channels come from the GIN index and are ranked by Okapi BM25 computed in SQL with
  FTS5's constants and column weights (text 1.0, speaker name 0.5), so the ranking keeps
  the inverse document frequency that `ts_rank_cd` lacks (see `_BM25_SQL`).
- Dense search: exact inner product over the channels' pgvector rows picks the
  candidates; their float32 payloads are re-scored with numpy exactly as on SQLite, so
  both backends return the same similarities.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory.models import MessageEvent
from memory.store.database import Transaction
from memory.store.governance import GovernanceRepo
from memory.store.messages import _CHUNK, MessageRepo, _Early, embed_text, speaker_phrase
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

    # ---- writes -------------------------------------------------------------------------

    async def _ingest_tx(self, tx: Transaction, events: Sequence[MessageEvent]) -> list[Any]:
        await tx.execute("SELECT pg_advisory_xact_lock(?)", (INGEST_LOCK,))
        return await super()._ingest_tx(tx, events)

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

    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int:
        """Write vectors for messages whose text did not change since they were read."""
        if not items:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        async with self.db.transaction() as tx:
            ids = [pk for pk, _, _ in items]
            current: dict[int, str] = {}
            for start in range(0, len(ids), _CHUNK):
                for r in await tx.fetchall(
                    "SELECT id, speaker_name, text FROM messages WHERE id = ANY(?)"
                    " AND embedded = 0 AND deleted_at IS NULL",
                    (ids[start : start + _CHUNK],),
                ):
                    current[r[0]] = embed_text(r[1], r[2])
            keep = [i for i, (pk, _, text) in enumerate(items) if current.get(pk) == text]
            if not keep:
                return 0
            await tx.execute(
                "INSERT INTO messages_vec (rowid, channel_pk, embedding)"
                " SELECT * FROM unnest(?::bigint[], ?::bigint[], ?::vector[])"
                " ON CONFLICT (rowid) DO UPDATE SET channel_pk = excluded.channel_pk,"
                " embedding = excluded.embedding",
                (
                    [items[i][0] for i in keep],
                    [items[i][1] for i in keep],
                    [vector_literal(vectors[i]) for i in keep],
                ),
            )
            await tx.executemany(
                "INSERT INTO message_vectors (id, embedding) VALUES (?, ?)"
                " ON CONFLICT (id) DO UPDATE SET embedding = excluded.embedding",
                [(items[i][0], vectors[i].tobytes()) for i in keep],
            )
            await tx.execute(
                "UPDATE messages SET embedded = 1 WHERE id = ANY(?)", ([items[i][0] for i in keep],)
            )
        return len(keep)

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
    ) -> tuple[str, list[Any]] | None:
        """One statement selecting (id, speaker_id, score) of the channels' live matches,
        score the negative BM25 (lower is better, as FTS5's bm25()); None when nothing can
        match."""
        items = parse_match(match)
        if not items:
            return None
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
            list(dict.fromkeys(int(pk) for pk in channel_pks)),
            *extra,
            WEIGHT_TEXT,
            WEIGHT_SPEAKER,
            WEIGHT_TEXT,
            WEIGHT_SPEAKER,
            K1 + 1,
            K1,
            1 - B,
            B,
        ]
        return _BM25_SQL.format(filters=filters), params

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
        scored = await self._scored(match, channel_pks, speakers=speakers, since=since, until=until)
        if scored is None:
            return []
        sql, params = scored
        rows = await self.db.read(
            f"SELECT id, score FROM ({sql}) s ORDER BY score, id LIMIT ?", [*params, limit]
        )
        return [(int(r[0]), float(r[1])) for r in rows]

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

        The candidates are exact: pgvector's inner product over every vector of the
        channels (no approximate index, so the top `limit` equal an exact cosine ranking).
        `oversample` and `oversample_fraction` size SQLite's coarse binary pass and change
        nothing here. The float32 payloads are re-scored with numpy, as on SQLite."""
        if not channel_pks:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        literal = vector_literal(q)
        rows = await self.db.read(
            "SELECT v.id, v.embedding FROM (SELECT rowid FROM messages_vec"
            " WHERE channel_pk = ANY(?) ORDER BY embedding <#> ?::vector, rowid LIMIT ?) c"
            " JOIN message_vectors v ON v.id = c.rowid",
            (list(dict.fromkeys(int(pk) for pk in channel_pks)), literal, limit),
        )
        if not rows:
            return []
        return await asyncio.to_thread(rescore, [(int(r[0]), bytes(r[1])) for r in rows], q, limit)

    # ---- counts -------------------------------------------------------------------------

    async def counts(self) -> dict[str, int]:
        r = (
            await self.db.read(
                "SELECT count(*), count(*) FILTER (WHERE deleted_at IS NOT NULL),"
                " count(*) FILTER (WHERE embedded = 0 AND deleted_at IS NULL),"
                " count(DISTINCT channel_pk) FROM messages"
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
        SELECT count(*) AS df FROM messages WHERE fts @@ q.qw AND deleted_at IS NULL
    ) d
), hits AS MATERIALIZED (
    SELECT m.id, m.speaker_id, m.fts, m.fts_len FROM messages m
    WHERE m.fts @@ (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms)
      AND m.deleted_at IS NULL AND m.channel_pk = ANY(?::bigint[])
    {{filters}}
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


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form of a float32 vector (9 significant digits round-trip exactly)."""
    return "[" + ",".join(f"{float(x):.9g}" for x in np.asarray(vector).reshape(-1)) + "]"
