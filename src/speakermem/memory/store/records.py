"""System 2: derived records with append-only update chains, and their vectors.

Backend-neutral: commits (a segment's records, chain links, provenance, vectors, run log
and done mark in one transaction) and reads. Lexical and dense search over records are
each backend's own (memory/store/sqlite/records.py: FTS5 and vec0; memory/store/pg/
records.py: BM25 over tsvector and pgvector).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from speakermem.memory.models import DerivedRecord, NewRecord, Scope
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import Database, Transaction
from speakermem.memory.store.errors import ChainConflict, LeaseLost, StoreError
from speakermem.memory.store.inlists import in_list
from speakermem.memory.store.rows import RECORD_COLUMNS, record_from_row, to_ts
from speakermem.memory.store.segments import holds_claim


@dataclass
class WriterRunLog:
    """What one Writer flush did, stored beside its commit for `stats`."""

    model: str
    prompt_version: str
    started_at: float
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    noops: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    outcome: str = "committed"
    error: str | None = None


class RecordRepo(ABC):
    """The records of every channel; a backend adds its lexical and dense search."""

    def __init__(self, db: Database, channels: ChannelRepo) -> None:
        self.db = db
        self.channels = channels
        self.generation = 0
        """Record inserts this repository committed or attempted (a search's cache of
        corpus figures is stale once it moves)."""
        dialect = db.dialect
        self._segment_state_sql = (
            f"SELECT state, claimed_by, lease_until FROM segments WHERE id = ?{dialect.for_update}"
        )
        """commit_segment's done and claim check. SQLite's one writer serialises two commits
        of a segment; PostgreSQL locks the row (FOR UPDATE) so a second worker's commit waits
        and sees 'done', and a claim (which skips locked rows) cannot move the segment
        meanwhile."""
        self._cited_lock = dialect.for_share
        """Row locks on the cited messages while a commit checks them (PostgreSQL: a forget
        of one of them waits for the commit, then finds its records)."""

    async def commit_segment(
        self,
        segment_id: int,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        run: WriterRunLog,
        *,
        worker_id: str | None = None,
    ) -> list[int]:
        """Commit a segment's records, chain links, index rows, run log and done mark at once.

        A segment already done (a redo after a crash that committed) commits nothing and
        returns [] — so a replay can never duplicate records. A worker (`worker_id`) that no
        longer holds its claim (the lease ran out and another worker claimed the segment)
        commits nothing either and gets `LeaseLost`: the new holder's commit is the one that
        applies. Without a worker id (the in-process Writer) the commit applies unless a live
        lease of some worker holds the segment (memory.store.segments.holds_claim).
        """
        async with self.db.transaction() as tx:
            seg = await tx.fetchone(self._segment_state_sql, (segment_id,))
            if seg is None:
                raise StoreError(f"segment {segment_id} does not exist")
            if seg[0] == "done":
                return []
            if not holds_claim(seg[1], seg[2], worker_id, time.time()):
                raise LeaseLost(
                    f"segment {segment_id} is claimed by {seg[1]!r}, not {worker_id!r}:"
                    " nothing committed"
                )
            pk = await self.channels.ensure(tx, scope)
            records, vectors, dropped = await self.channels.policy.admissible(
                tx, pk, scope, records, vectors, lock_rows=self._cited_lock
            )
            if dropped:
                for reason, n in dropped.items():
                    run.rejected[reason] = run.rejected.get(reason, 0) + n
                run.accepted = max(0, run.accepted - sum(dropped.values()))
            ids = await self._insert_records(tx, pk, scope, records, vectors, segment_id)
            await tx.execute(
                "UPDATE segments SET state = 'done', done_at = ?, last_error = NULL,"
                " attempts = attempts + 1 WHERE id = ?",
                (time.time(), segment_id),
            )
            await self._log_run(tx, segment_id, scope, run)
            return ids

    async def add_records(
        self,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        *,
        rederive_item: int | None = None,
        dropped: dict[str, int] | None = None,
    ) -> list[int]:
        """Commit records outside the segment flow (replay writer, admin tools, re-derivation).

        With `rederive_item`, the re-derivation queue entry they answer is removed in the same
        transaction, so a crash can neither lose the entry nor commit its records twice.
        The same commit-time check as `commit_segment` applies; what it drops is counted
        in `dropped` (by reason) when given."""
        async with self.db.transaction() as tx:
            if rederive_item is not None:
                cur = await tx.execute("DELETE FROM rederive_queue WHERE id = ?", (rederive_item,))
                if not cur.rowcount:  # already done (or dropped by a later forget)
                    return []
            pk = await self.channels.ensure(tx, scope)
            records, vectors, refused = await self.channels.policy.admissible(
                tx, pk, scope, records, vectors, lock_rows=self._cited_lock
            )
            if dropped is not None:
                for reason, n in refused.items():
                    dropped[reason] = dropped.get(reason, 0) + n
            return await self._insert_records(tx, pk, scope, records, vectors, None)

    async def _insert_records(
        self,
        tx: Transaction,
        pk: int,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        segment_id: int | None,
    ) -> list[int]:
        self.generation += 1
        ids: list[int] = []
        now = time.time()
        dialect = self.db.dialect
        for i, rec in enumerate(records):
            chain_root: int | None = None
            if rec.supersedes is not None:
                old = await tx.fetchone(
                    "SELECT state, chain_root, channel_pk FROM records WHERE id = ?",
                    (rec.supersedes,),
                )
                if old is None or old[2] != pk:
                    raise ChainConflict(f"record {rec.supersedes} is not in this channel")
                if old[0] != "active":
                    raise ChainConflict(f"record {rec.supersedes} was already superseded")
                chain_root = int(old[1])
            rid = await tx.insert(
                "INSERT INTO records (channel_pk, platform, workspace, channel, layer,"
                " record_scope, content, source, owner, event, time, session_id, state, from_ids,"
                " supersedes, chain_root, writer_model, prompt_version, segment_id, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?)",
                (
                    pk,
                    *scope.key(),
                    rec.layer.value,
                    rec.record_scope.value,
                    rec.content,
                    rec.source,
                    rec.owner,
                    rec.event,
                    to_ts(rec.time),
                    rec.session_id,
                    json.dumps(list(rec.from_ids)),
                    rec.supersedes,
                    chain_root or 0,
                    rec.writer_model,
                    rec.prompt_version,
                    segment_id,
                    now,
                ),
            )
            if chain_root is None:
                await tx.execute("UPDATE records SET chain_root = id WHERE id = ?", (rid,))
            else:
                await tx.execute(
                    "UPDATE records SET state = 'superseded', superseded_by = ? WHERE id = ?",
                    (rid, rec.supersedes),
                )
            if rec.from_ids:
                # record_sources rows for the channel's stored messages it cites (ones
                # already linked are skipped)
                marks, from_ids = in_list(rec.from_ids)
                await tx.execute(
                    dialect.insert_or_ignore(
                        "record_sources (record_id, message_pk, platform, workspace, channel)",
                        "SELECT ?, id, platform, workspace, channel FROM messages"
                        f" WHERE channel_pk = ? AND message_id IN ({marks})",
                    ),
                    (rid, pk, *from_ids),
                )
            if vectors is not None:
                await tx.execute(
                    "INSERT INTO records_vec (rowid, channel_pk, embedding)"
                    f" VALUES (?, ?, {dialect.vector_cast})",
                    (rid, pk, dialect.vector_param(vectors[i])),
                )
            ids.append(rid)
        return ids

    async def vector_texts(self, after_id: int, limit: int) -> list[tuple[int, int, str]]:
        """(id, channel pk, content) of records after `after_id`, in id order: what a
        re-embed embeds."""
        rows = await self.db.read(
            "SELECT id, channel_pk, content FROM records WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

    async def replace_vectors(
        self, rows: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> None:
        """Write these records' vectors anew (`vector_texts`' rows, one vector each)."""
        dialect = self.db.dialect
        async with self.db.transaction() as tx:
            await tx.executemany(
                "DELETE FROM records_vec WHERE rowid = ?", [(rid,) for rid, _, _ in rows]
            )
            await tx.executemany(
                f"INSERT INTO records_vec (rowid, channel_pk, embedding) VALUES (?, ?,"
                f" {dialect.vector_cast})",
                [
                    (rid, pk, dialect.vector_param(v))
                    for (rid, pk, _), v in zip(rows, vectors, strict=True)
                ],
            )

    async def _vectors(self, record_ids: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """The stored vectors of those records that have one: their ids, as read, and a
        float32 matrix with one row per id."""
        dialect = self.db.dialect
        rows = await self.db.read_in(
            f"SELECT rowid, {dialect.vector_column('embedding')} FROM records_vec"
            " WHERE rowid IN ({marks})",
            record_ids,
        )
        return [int(r[0]) for r in rows], dialect.vector_matrix([r[1] for r in rows])

    @staticmethod
    async def _log_run(tx: Transaction, segment_id: int, scope: Scope, run: WriterRunLog) -> None:
        await tx.execute(
            "INSERT INTO writer_runs (segment_id, platform, workspace, channel, started_at,"
            " latency_ms, model, prompt_version, prompt_tokens, completion_tokens, proposed,"
            " accepted, noops, rejected, outcome, error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                segment_id,
                *scope.key(),
                run.started_at,
                run.latency_ms,
                run.model,
                run.prompt_version,
                run.prompt_tokens,
                run.completion_tokens,
                run.proposed,
                run.accepted,
                run.noops,
                json.dumps(run.rejected),
                run.outcome,
                run.error,
            ),
        )

    async def log_failed_run(self, segment_id: int, scope: Scope, run: WriterRunLog) -> None:
        async with self.db.transaction() as tx:
            await self._log_run(tx, segment_id, scope, run)

    # ---- reads --------------------------------------------------------------------------

    async def get_many(self, ids: Sequence[int]) -> dict[int, DerivedRecord]:
        rows = await self.db.read_in(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE id IN ({{marks}})", ids
        )
        return {rec.id: rec for rec in map(record_from_row, rows)}

    async def heads(
        self,
        channel_pks: Sequence[int],
        *,
        owners: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
    ) -> list[DerivedRecord]:
        """Active records of the channels, optionally owned by or sourced from some people."""
        if not channel_pks:
            return []
        marks, channels = in_list(channel_pks)
        sql = (
            f"SELECT {RECORD_COLUMNS} FROM records WHERE channel_pk IN ({marks})"
            " AND state = 'active'"
        )
        params: list[object] = list(channels)
        filters = []
        for column, values in (("owner", owners), ("source", sources)):
            if values:
                value_marks, padded = in_list(values)
                filters.append(f"{column} IN ({value_marks})")
                params.extend(padded)
        if filters:
            sql += " AND (" + " OR ".join(filters) + ")"
        sql += " ORDER BY time DESC, id DESC"
        return [record_from_row(r) for r in await self.db.read(sql, params)]

    async def chain(self, record_id: int) -> list[DerivedRecord]:
        """The whole update chain a record belongs to, oldest first."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE chain_root ="
            " (SELECT chain_root FROM records WHERE id = ?) ORDER BY id",
            (record_id,),
        )
        return [record_from_row(r) for r in rows]

    async def channel_of(self, record_ids: Sequence[int]) -> dict[int, tuple[str, str, str]]:
        if not record_ids:
            return {}
        marks, ids = in_list(record_ids)
        rows = await self.db.read(
            f"SELECT id, platform, workspace, channel FROM records WHERE id IN ({marks})",
            ids,
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    # ---- search: lexical and dense search are each backend's own ----------------------

    @abstractmethod
    async def _best_by(
        self,
        column: str,
        match: str,
        channel_pks: Sequence[int],
        keys: list[str],
        per_key: int,
        about_others: bool,
    ) -> dict[str, list[int]]:
        """The best `per_key` active matches of each of `keys` in `column` ('owner' or
        'source'), best first; only records about someone else with `about_others`."""

    async def lexical_by_owner(
        self, match: str, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> dict[str, list[int]]:
        """The best `per_owner` active matches of each owner, best first: one query for all
        the rows, however many (the per-person query it replaces cost a round trip each)."""
        return await self._lexical_grouped("owner", match, channel_pks, owners, per_owner)

    async def lexical_by_source(
        self, match: str, channel_pks: Sequence[int], sources: Sequence[str], per_source: int
    ) -> dict[str, list[int]]:
        """Each source's best active matches about someone else (owner != source)."""
        return await self._lexical_grouped(
            "source", match, channel_pks, sources, per_source, about_others=True
        )

    async def _lexical_grouped(
        self,
        column: str,
        match: str,
        channel_pks: Sequence[int],
        keys: Sequence[str],
        per_key: int,
        *,
        about_others: bool = False,
    ) -> dict[str, list[int]]:
        if column not in ("owner", "source"):
            raise ValueError(f"cannot group records by {column!r}")
        wanted = list(dict.fromkeys(keys))
        if not match or not channel_pks or not wanted or per_key <= 0:
            return {}
        return await self._best_by(column, match, channel_pks, wanted, per_key, about_others)

    async def latest_owned(
        self, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> list[int]:
        """Ids of the owners' latest `per_owner` active records each (through the (channel,
        owner, state) index): the candidates of `dense_among`, known before any embedding."""
        return [rid for rid, _ in await self.latest_owned_by(channel_pks, owners, per_owner)]

    async def latest_owned_by(
        self, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> list[tuple[int, str]]:
        """`latest_owned` with each record's owner: (id, owner)."""
        owners = list(dict.fromkeys(owners))
        if not owners or not channel_pks or per_owner <= 0:
            return []
        pk_marks, channels = in_list(channel_pks)
        owner_marks, padded = in_list(owners)
        rows = await self.db.read(
            "SELECT id, owner FROM (SELECT id, owner, row_number() OVER (PARTITION BY owner"
            " ORDER BY time DESC, id DESC) AS rn FROM records"
            f" WHERE channel_pk IN ({pk_marks}) AND owner IN ({owner_marks})"
            " AND state = 'active') AS latest WHERE rn <= ?",
            [*channels, *padded, per_owner],
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    async def citing(
        self, message_pks: Sequence[int], owners: Sequence[str]
    ) -> list[tuple[int, int]]:
        """(record id, message pk) of the owners' active records that cite any of these
        messages (through `record_sources`' message index)."""
        owners = list(dict.fromkeys(owners))
        if not message_pks or not owners:
            return []
        owner_marks, padded = in_list(owners)
        rows = await self.db.read_in(
            "SELECT s.record_id, s.message_pk FROM record_sources s"
            f" JOIN records r ON r.id = s.record_id WHERE r.owner IN ({owner_marks})"
            " AND r.state = 'active' AND s.message_pk IN ({marks})",
            list(dict.fromkeys(message_pks)),
            before=tuple(padded),
        )
        return [(int(r[0]), int(r[1])) for r in rows]

    async def dense_among(
        self, query: np.ndarray, record_ids: Sequence[int]
    ) -> list[tuple[int, float]]:
        """Cosine similarity of these records to `query`, best first."""
        ids, matrix = await self._vectors(list(record_ids))
        if not ids:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        norms = np.linalg.norm(matrix, axis=1) * (float(np.linalg.norm(q)) or 1.0)
        sims = (matrix @ q) / np.where(norms == 0, 1.0, norms)
        order = np.argsort(-sims, kind="stable")
        return [(ids[i], float(sims[i])) for i in order]

    async def dense_owned(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        owners: Sequence[str],
        per_owner: int,
    ) -> list[tuple[int, float]]:
        """Cosine similarity of the owners' latest `per_owner` active records each, best
        first: the dense fill of System 2's rows scores only the rows' people's records
        (found through the (channel, owner, state) index), not the whole channel's."""
        return await self.dense_among(
            query, await self.latest_owned(channel_pks, owners, per_owner)
        )

    async def chains(self, record_ids: Sequence[int]) -> dict[int, list[DerivedRecord]]:
        """Each record's whole update chain, oldest first, in one query for all of them."""
        if not record_ids:
            return {}
        roots = await self.db.read_in(
            "SELECT id, chain_root FROM records WHERE id IN ({marks})", list(record_ids)
        )
        root_of = {r[0]: r[1] for r in roots}
        nodes = await self.db.read_in(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE chain_root IN ({{marks}})",
            sorted(set(root_of.values())),
        )
        by_root: dict[int, list[DerivedRecord]] = {}
        for rec in sorted(map(record_from_row, nodes), key=lambda r: r.id):
            by_root.setdefault(rec.chain_root, []).append(rec)
        return {rid: by_root.get(root, []) for rid, root in root_of.items()}

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read(
            "SELECT count(*), sum(CASE WHEN state = 'active' THEN 1 ELSE 0 END),"
            " sum(CASE WHEN supersedes IS NOT NULL THEN 1 ELSE 0 END) FROM records"
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

    async def by_owner_name(self, name_or_id: str) -> list[DerivedRecord]:
        """Records owned by a user id or display name (any channel), newest chains first."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE owner = ? OR owner IN"
            " (SELECT user_id FROM users WHERE lower(display_name) = lower(?))"
            " OR owner IN (SELECT user_id FROM user_aliases WHERE alias_norm = lower(?))"
            " ORDER BY chain_root, id",
            (name_or_id, name_or_id, name_or_id),
        )
        return [record_from_row(r) for r in rows]

    async def writer_stats(self) -> dict[str, object]:
        rows = await self.db.read(
            "SELECT count(*), coalesce(sum(proposed), 0), coalesce(sum(accepted), 0),"
            " coalesce(sum(noops), 0), coalesce(sum(prompt_tokens), 0),"
            " coalesce(sum(completion_tokens), 0), coalesce(avg(latency_ms), 0),"
            " coalesce(sum(CASE WHEN outcome != 'committed' THEN 1 ELSE 0 END), 0)"
            " FROM writer_runs"
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
