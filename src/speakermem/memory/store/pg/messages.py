"""System 1's search on PostgreSQL: BM25 over the `messages.fts` tsvector and a Hamming
KNN over pgvector sign bits (the ingest, edits, deletes and reads are the neutral
`MessageRepo`'s).

- Lexical search: the FTS5 MATCH expressions the callers build are parsed into `tsquery`s
  (memory/store/pg/bm25.py); matching rows of the channels come from the GIN index (each
  row's tsvector holds its channel's tag, so the index intersects the terms with the
  channels) and are ranked by Okapi BM25 computed in SQL with FTS5's constants and column
  weights. Corpus statistics and document frequencies are cached per process.
- Dense search and the embedding queue: memory/store/pg/message_vectors.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from speakermem.memory.store.messages import MessageRepo, speaker_phrase
from speakermem.memory.store.messages.text import count_lowercase
from speakermem.memory.store.pg import message_vectors
from speakermem.memory.store.pg.bm25 import (
    DF_ESTIMATE_ABOVE,
    DF_SQL,
    K1,
    MESSAGES_BM25_SQL,
    MIN_IDF,
    WEIGHT_SPEAKER,
    WEIGHT_TEXT,
    B,
    in_columns,
    in_speaker_name,
    parse_match,
)
from speakermem.memory.store.pg.database import PgDatabase
from speakermem.memory.store.pg.messages_schema import TS_CONFIG, fts_input

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
TAG_SHARE = 0.5
"""Lexical search filters by channel tags in the GIN index when the searched channels hold
under this share of the live messages (see `PgMessageRepo._channel_filter`)."""
DF_CACHE = 4_096
"""Document frequencies kept per process (each expires with the corpus statistics)."""


# The rows under one of the given display names (their phrases in the speaker name's `s:`
# lexemes), as FTS5's `speaker_name : (...)` filter; names without a lexeme are left out,
# and when none is left the filter is the terms' query (which every scored row matches).
_NAME_PHRASE = in_speaker_name(f"phraseto_tsquery('{TS_CONFIG}', {fts_input('u.raw')})")
_NAMES_FILTER = f"""coalesce((
    SELECT string_agg('(' || n.q::text || ')', ' | ')::tsquery
    FROM (SELECT {_NAME_PHRASE} AS q FROM unnest(?::text[]) AS u(raw)) AS n
    WHERE numnode(n.q) > 0
), (SELECT string_agg('(' || qw::text || ')', ' | ')::tsquery FROM terms))"""


class PgMessageRepo(MessageRepo):
    db: PgDatabase

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stats: tuple[float, int, float] | None = None  # (read at, rows, mean length)
        self._df: dict[tuple[str, str], tuple[float, int]] = {}  # (raw, ws) -> (read at, df)
        # items whose count is being read: the lexical rankings of one question run
        # concurrently and share terms (a name, its phrase), so they wait for one count
        # instead of each reading every matching row again
        self._df_reading: dict[tuple[str, str], asyncio.Future[int | None]] = {}
        self._sizes: dict[int, tuple[float, int]] = {}  # channel -> (read at, vectors)
        self._binary = message_vectors.BinaryVectors()

    # ---- embeddings ---------------------------------------------------------------------

    async def pending_embeddings(self, limit: int) -> list[tuple[int, int, str]]:
        """(pk, channel_pk, text to embed) for messages without a vector yet."""
        return await message_vectors.pending_embeddings(self.db, limit)

    async def drop_vectors(self) -> int:
        """Delete every message vector (the sign bits follow) and queue the live messages
        for embedding again (a re-embed with another model); returns how many were queued."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM messages_vec")
            await tx.execute("DELETE FROM message_vectors")
            await tx.execute(
                "INSERT INTO messages_unembedded (id) SELECT id FROM messages"
                " WHERE deleted_at IS NULL ON CONFLICT DO NOTHING"
            )
            row = await tx.fetchone("SELECT count(*) FROM messages_unembedded")
        return int(row[0])

    async def count_pending_embeddings(self) -> int:
        return await message_vectors.count_pending_embeddings(self.db)

    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray, *, draft: bool = False
    ) -> int:
        """Write vectors for messages still pending whose text did not change since they
        were read (`draft`: from the quicker graph, written again by `replace_drafts`)."""
        return await message_vectors.store_vectors(
            self.db, self._binary, items, vectors, draft=draft
        )

    async def replace_drafts(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int:
        """Write full-precision vectors over these messages' drafts."""
        return await message_vectors.replace_drafts(self.db, self._binary, items, vectors)

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
        speaker_names: Sequence[str] = (),
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
        at most `fill` rows matching only the other items (the first the index yields).
        `speaker_names` (the `speakers`' display names) narrow the rows in the index, as
        FTS5's speaker_name filter does on SQLite (`_NAMES_FILTER`)."""
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
            phrases = [p for p in map(speaker_phrase, speaker_names) if p]
            if phrases:
                filters += f" AND m.fts @@ {_NAMES_FILTER}"
                extra.append([raw for p in phrases for raw, _ in parse_match(p)])
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
        return MESSAGES_BM25_SQL.format(filters=filters, channels=channels), params

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

        `speaker_names` (the display names of `speakers`) narrow the matches in the GIN
        index to messages under one of those names, as FTS5's speaker_name filter does on
        SQLite, before the speaker ids are checked on the rows."""
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
                    speaker_names=speaker_names,
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
            speaker_names=speaker_names,
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
        speaker_names: Sequence[str] = (),
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
            speaker_names=speaker_names,
            since=since,
            until=until,
        )
        if scored is None:
            return []
        sql, params = scored
        rows = await self.db.read_prepared(
            f"SELECT id, score FROM ({sql}) s ORDER BY score, id LIMIT ?", [*params, limit]
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    async def _doc_freqs(self, items: list[tuple[str, str]]) -> list[float | None]:
        """Each item's document frequency over all live messages (None: no lexeme), from a
        per-process cache that expires with the corpus statistics; an item another search
        is counting at the moment is awaited, not counted again."""
        now = time.monotonic()
        out: list[float | None] = [None] * len(items)
        missing: list[int] = []
        waiting: list[tuple[int, asyncio.Future[int | None]]] = []
        for n, item in enumerate(items):
            hit = self._df.get(item)
            if hit is not None and now - hit[0] < STATS_TTL_S:
                out[n] = float(hit[1])
            elif (reading := self._df_reading.get(item)) is not None:
                waiting.append((n, reading))
            elif item not in (items[m] for m in missing):
                missing.append(n)
        if missing:
            loop = asyncio.get_running_loop()
            mine = {items[n]: loop.create_future() for n in missing}
            self._df_reading.update(mine)
            try:
                counted = await self._count_doc_freqs([items[n] for n in missing])
            except BaseException as exc:
                for fut in mine.values():
                    if isinstance(exc, Exception):
                        fut.set_exception(exc)
                        fut.exception()  # retrieved here: a waiter re-raises it
                    else:
                        fut.cancel()  # this search was cancelled: its waiters count anew
                raise
            finally:
                for item in mine:
                    self._df_reading.pop(item, None)
            if len(self._df) > DF_CACHE:
                self._df.clear()
            for n, df in zip(missing, counted, strict=True):
                mine[items[n]].set_result(df)
                if df is not None:
                    out[n] = float(df)
                    self._df[items[n]] = (now, df)
        recount: list[int] = []
        for n, fut in waiting:
            try:
                df = await asyncio.shield(fut)  # a waiter's cancellation stays its own
            except asyncio.CancelledError:
                if not fut.cancelled():
                    raise  # this search itself is cancelled
                recount.append(n)
                continue
            out[n] = None if df is None else float(df)
        if recount:
            counted = await self._count_doc_freqs([items[n] for n in recount])
            for n, df in zip(recount, counted, strict=True):
                out[n] = None if df is None else float(df)
        for n, item in enumerate(items):  # an item given twice: its first one's count
            if out[n] is None and (first := items.index(item)) != n:
                out[n] = out[first]
        return out

    async def _count_doc_freqs(self, items: list[tuple[str, str]]) -> list[int | None]:
        """The items' document frequencies read from the database (one statement)."""
        stats = await self._cached_stats()
        rows = await self.db.read_prepared(
            DF_SQL,
            (
                [raw for raw, _ in items],
                [ws for _, ws in items],
                DF_ESTIMATE_ABOVE,
                stats[0] if stats is not None else 0.0,
            ),
        )
        out: list[int | None] = [None] * len(items)
        for i, df in rows:
            out[int(i) - 1] = int(df)
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
        rows = await self.db.read_prepared(
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
        # the query's own lexemes are the text's (the speaker name's carry a prefix)
        text_only = f"phraseto_tsquery('{TS_CONFIG}', {fts_input('?::text')})"
        rows = await self.db.read(
            f"SELECT text FROM messages WHERE fts @@ {text_only}"
            " AND deleted_at IS NULL AND channel_pk = ANY(?) LIMIT ?",
            (raw, list(channel_pks), sample),
        )
        return count_lowercase(word, [r[0] for r in rows])

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
        # a term matches the text or the speaker name, as FTS5's {text speaker_name}
        both = in_columns(f"phraseto_tsquery('{TS_CONFIG}', {fts_input('u.raw')})", "'AB'")
        rows = await self.db.read_prepared(
            "WITH t AS MATERIALIZED (SELECT v.i, v.q, (SELECT count(*) FROM (SELECT 1"
            " FROM messages WHERE fts @@ v.q AND deleted_at IS NULL"
            " AND channel_pk = ANY(?::bigint[]) LIMIT ?) f) AS hits FROM (SELECT u.i,"
            f" {both} AS q FROM unnest(?::text[]) WITH ORDINALITY AS u(raw, i)) v)"
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
        channel's vectors) candidates (when the fraction is more, the best of
        `COARSE_WIDEN` times as many by the query's score against their bits); their
        float32 payloads are re-scored with numpy.
        The scan reads the narrow bits table only, never the float vectors."""
        if not channel_pks:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        pks = list(dict.fromkeys(int(pk) for pk in channel_pks))
        k = max(limit, oversample)
        sizes = await self._channel_sizes(pks)
        ks = [max(k, math.ceil(oversample_fraction * sizes.get(pk, 0))) for pk in pks]
        total = sum(min(kc, sizes.get(pk, 0)) for pk, kc in zip(pks, ks, strict=True))
        # a share of a large channel: its candidates are chosen from more, as on SQLite;
        # the fixed oversample (/recall's) keeps the one-statement Hamming scan here, where
        # SQLite, ranking in process, widens it too
        widen = any(kc > k for kc in ks)
        return await message_vectors.rescored(
            self.db, q, pks, ks, total=total, limit=limit, widen=widen
        )

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
