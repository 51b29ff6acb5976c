"""System 2 on PostgreSQL: the SQLite RecordRepo with its FTS5, vec0 and SQLite-only SQL
replaced.

- Lexical search reads the `records.fts` tsvector (records_schema.py). The FTS5 MATCH text
  the callers build (quoted terms joined by OR, memory.search.fts_query) becomes an OR of
  `phraseto_tsquery` over the same terms, and `ts_rank` orders the matches. Scores are
  returned negated, so lower is better, as with FTS5's bm25(). ts_rank has no inverse
  document frequency: a match on a rare word does not outrank one on a common word as
  BM25 would (the callers use only the order of each owner's or source's matches).
- Dense search is exact cosine distance (`<=>`) over `records_vec` per channel, as sqlite-vec
  does; vectors travel as pgvector's text form.
- commit_segment locks the segment row, so two workers committing one segment (a lease that
  ran out while the first was still writing) commit it once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from memory.store.database import Transaction
from memory.store.pg.messages_schema import TS_CONFIG, fts_input
from memory.store.records import RecordRepo

_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def match_terms(match: str) -> list[str]:
    """The quoted terms of an FTS5 MATCH expression built by memory.search.fts_query, in
    order (a column filter such as `{text} :` has no counterpart on records and is dropped;
    an unquoted word counts as a term of its own)."""
    terms = [m.group(1).replace('""', '"') for m in _QUOTED.finditer(match)]
    rest = _QUOTED.sub(" ", match)
    rest = re.sub(r"\{[^}]*\}\s*:", " ", rest)
    terms.extend(w for w in re.findall(r"\w+", rest) if w not in ("OR", "AND", "NOT", "NEAR"))
    return [t for t in terms if t.strip()]


def tsquery_sql(n: int) -> str:
    """SQL for the OR of `n` phrase queries, one `?` parameter each."""
    one = f"phraseto_tsquery('{TS_CONFIG}'::regconfig, {fts_input('?')})"
    return "(" + " || ".join([one] * n) + ")"


def vector_text(vector: np.ndarray) -> str:
    """pgvector's text form of a float32 vector (exact: float32 values print exactly)."""
    values = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1).tolist()
    return "[" + ",".join(map(repr, values)) + "]"


class PgRecordRepo(RecordRepo):
    _SEGMENT_STATE_SQL = "SELECT state FROM segments WHERE id = ? FOR UPDATE"

    @staticmethod
    def _link_sources_sql(n: int) -> str:
        return (
            "INSERT INTO record_sources (record_id, message_pk, platform, workspace, channel)"
            " SELECT ?, id, platform, workspace, channel FROM messages"
            f" WHERE channel_pk = ? AND message_id IN ({','.join('?' * n)})"
            " ON CONFLICT DO NOTHING"
        )

    async def _index_vector(
        self, tx: Transaction, record_id: int, channel_pk: int, vector: np.ndarray
    ) -> None:
        await tx.execute(
            "INSERT INTO records_vec (rowid, channel_pk, embedding) VALUES (?, ?, ?::vector)",
            (record_id, channel_pk, vector_text(vector)),
        )

    async def _vectors(self, record_ids: Sequence[int]) -> tuple[list[int], np.ndarray]:
        rows = await self.db.read_in(
            "SELECT rowid, embedding::real[] FROM records_vec WHERE rowid IN ({marks})",
            record_ids,
        )
        ids = [int(r[0]) for r in rows]
        if not ids:
            return [], np.empty((0, 0), dtype=np.float32)
        return ids, np.array([r[1] for r in rows], dtype=np.float32)

    # ---- lexical ------------------------------------------------------------------------

    async def lexical(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        *,
        active_only: bool = True,
        owner: str | None = None,
        source: str | None = None,
        exclude_owner: str | None = None,
    ) -> list[tuple[int, float]]:
        terms = match_terms(match)
        if not terms or not channel_pks:
            return []
        marks = ",".join("?" * len(channel_pks))
        sql = (
            "SELECT r.id, -ts_rank(r.fts, tq.q) AS score FROM records r,"
            f" (SELECT {tsquery_sql(len(terms))} AS q) AS tq"
            f" WHERE r.fts @@ tq.q AND r.channel_pk IN ({marks})"
        )
        params: list[object] = [*terms, *channel_pks]
        if active_only:
            sql += " AND r.state = 'active'"
        if owner is not None:
            sql += " AND r.owner = ?"
            params.append(owner)
        if source is not None:
            sql += " AND r.source = ?"
            params.append(source)
        if exclude_owner is not None:
            sql += " AND r.owner != ?"
            params.append(exclude_owner)
        sql += " ORDER BY score, r.id LIMIT ?"
        params.append(limit)
        return [(r[0], float(r[1])) for r in await self.db.read(sql, params)]

    async def _lexical_grouped(
        self,
        match: str,
        channel_pks: Sequence[int],
        column: str,
        keys: Sequence[str],
        per_key: int,
        *,
        about_others: bool = False,
    ) -> dict[str, list[int]]:
        if column not in ("owner", "source"):
            raise ValueError(f"cannot group records by {column!r}")
        keys = list(dict.fromkeys(keys))
        terms = match_terms(match)
        if not terms or not channel_pks or not keys or per_key <= 0:
            return {}
        sql = (
            "SELECT id, grp FROM (SELECT r.id AS id, r.{col} AS grp, row_number() OVER"
            " (PARTITION BY r.{col} ORDER BY ts_rank(r.fts, tq.q) DESC, r.id) AS rn"
            " FROM records r, (SELECT {tsq} AS q) AS tq"
            " WHERE r.fts @@ tq.q AND r.channel_pk IN ({pks}) AND r.{col} IN ({keys})"
            " AND r.state = 'active'{others}) AS ranked WHERE rn <= ? ORDER BY grp, rn"
        ).format(
            col=column,
            tsq=tsquery_sql(len(terms)),
            pks=",".join("?" * len(channel_pks)),
            keys=",".join("?" * len(keys)),
            others=" AND r.owner != r.source" if about_others else "",
        )
        out: dict[str, list[int]] = {}
        for rid, grp in await self.db.read(sql, [*terms, *channel_pks, *keys, per_key]):
            out.setdefault(grp, []).append(rid)
        return out

    async def matching_owners(
        self, match: str, channel_pks: Sequence[int], limit: int
    ) -> list[str]:
        terms = match_terms(match)
        if not terms or not channel_pks or limit <= 0:
            return []
        marks = ",".join("?" * len(channel_pks))
        rows = await self.db.read(
            "SELECT r.owner FROM records r,"
            f" (SELECT {tsquery_sql(len(terms))} AS q) AS tq"
            f" WHERE r.fts @@ tq.q AND r.channel_pk IN ({marks})"
            " AND r.state = 'active' AND r.record_scope = 'PERSON'"
            " ORDER BY ts_rank(r.fts, tq.q) DESC, r.id LIMIT ?",
            [*terms, *channel_pks, limit],
        )
        return list(dict.fromkeys(r[0] for r in rows))

    # ---- dense --------------------------------------------------------------------------

    async def dense(
        self, query: np.ndarray, channel_pks: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        """Exact cosine KNN over the channels' record vectors (the union of per-channel
        top-k lists cut to `limit` is the top `limit` of all of them, so one query)."""
        if not channel_pks or limit <= 0:
            return []
        q = vector_text(query)
        marks = ",".join("?" * len(channel_pks))
        rows = await self.db.read(
            "SELECT rowid, 1 - (embedding <=> ?::vector) AS sim FROM records_vec"
            f" WHERE channel_pk IN ({marks}) ORDER BY embedding <=> ?::vector, rowid LIMIT ?",
            [q, *channel_pks, q, limit],
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    # ---- counts -------------------------------------------------------------------------

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read(
            "SELECT count(*), count(*) FILTER (WHERE state = 'active'),"
            " count(*) FILTER (WHERE supersedes IS NOT NULL) FROM records"
        )
        r = rows[0]
        by_layer = await self.db.read(
            "SELECT layer, count(*) FROM records WHERE state = 'active' GROUP BY layer"
        )
        out = {
            "records": int(r[0] or 0),
            "active_records": int(r[1] or 0),
            "updates": int(r[2] or 0),
        }
        out.update({f"active_{layer}": int(n) for layer, n in by_layer})
        return out

    async def writer_stats(self) -> dict[str, object]:
        rows = await self.db.read(
            "SELECT count(*), coalesce(sum(proposed), 0), coalesce(sum(accepted), 0),"
            " coalesce(sum(noops), 0), coalesce(sum(prompt_tokens), 0),"
            " coalesce(sum(completion_tokens), 0), coalesce(avg(latency_ms), 0),"
            " count(*) FILTER (WHERE outcome != 'committed') FROM writer_runs"
        )
        r = rows[0]
        rejected: dict[str, int] = {}
        for (blob,) in await self.db.read("SELECT rejected FROM writer_runs"):
            for reason, n in json.loads(blob or "{}").items():
                rejected[reason] = rejected.get(reason, 0) + int(n)
        return {
            "flushes": int(r[0]),
            "proposed": int(r[1]),
            "accepted": int(r[2]),
            "noops": int(r[3]),
            "prompt_tokens": int(r[4]),
            "completion_tokens": int(r[5]),
            "mean_latency_ms": round(float(r[6]), 1),
            "failed_flushes": int(r[7]),
            "rejected": dict(sorted(rejected.items())),
        }
