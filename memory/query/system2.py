"""System 2 path of /recall: expand rows, pick records per row, head or full chains.

Rows come from Project (ALL -> every human roster member + GROUP). Within a row the
records the row owns are ranked by relevance to the issue (FTS5 BM25 first, dense
similarity to fill), k per row; `source_k` more records the row's person provided
about others are added without using the row's budget. An empty row falls back to
the person's best verbatim messages on the issue; a row with nothing is kept as
"(none)" so the answerer can say "no record".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from memory.config import RecallConfig
from memory.engine import MemoryEngine
from memory.models import GROUP, DerivedRecord, RosterMember, StoredMessage
from memory.query.projection import ALL, Projection
from memory.search.fts_query import build_match

DENSE_RECORD_POOL = 100

QueryVector = np.ndarray | Callable[[], Awaitable[np.ndarray | None]] | None
"""The issue's embedding, or a function that computes it: called only if a row needs it."""


@dataclass
class RowRecord:
    """A record chosen for a row, with its chain when the tense is `full`."""

    record: DerivedRecord
    chain: list[DerivedRecord]
    via_source: bool = False


@dataclass
class Row:
    key: str
    """A user id or GROUP."""
    label: str
    records: list[RowRecord] = field(default_factory=list)
    fallback: list[StoredMessage] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.records and not self.fallback


def expand_rows(projection: Projection, roster: Sequence[RosterMember]) -> list[tuple[str, str]]:
    """(key, label) rows in question order; ALL means every human member and GROUP."""
    names = {m.user_id: m.display_name for m in roster}
    keys: list[str] = []
    for row in projection.rows:
        if row == ALL:
            keys.extend(m.user_id for m in roster if not m.is_bot and m.active)
            keys.append(GROUP)
        else:
            keys.append(row)
    seen: dict[str, None] = {}
    for k in keys:
        seen.setdefault(k, None)
    return [(k, "GROUP" if k == GROUP else names.get(k, k)) for k in seen]


def rank_row(lexical: Sequence[int], dense: Sequence[int], owned: set[int], k: int) -> list[int]:
    """Lexical matches first, then dense matches, among the row's own records; k at most."""
    out: list[int] = []
    for rid in list(lexical) + list(dense):
        if rid in owned and rid not in out:
            out.append(rid)
        if len(out) >= k:
            break
    return out


async def system2(
    engine: MemoryEngine,
    projection: Projection,
    roster: Sequence[RosterMember],
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    *,
    query_vector: QueryVector,
) -> list[Row]:
    records = engine.store.records
    match = build_match(projection.issue)
    dense: tuple[list[int], dict[int, DerivedRecord]] | None = None

    async def dense_pool() -> tuple[list[int], dict[int, DerivedRecord]]:
        """The dense record pool, fetched once and only when a row needs filling: lexical
        matches come first in every row, so a row with k of them never looks at it."""
        nonlocal dense
        if dense is None:
            ids: list[int] = []
            vector = await query_vector() if callable(query_vector) else query_vector
            if vector is not None:
                found = await records.dense(vector, channel_pks, DENSE_RECORD_POOL)
                ids = [rid for rid, _ in found]
            dense = (ids, await records.get_many(ids))
        return dense

    rows: list[Row] = []
    for key, label in expand_rows(projection, roster):
        row = Row(key=key, label=label)
        if cfg.s2_k > 0:
            source_filter = projection.source if projection.owner == key else None
            lex = [
                rid
                for rid, _ in await records.lexical(
                    match, channel_pks, cfg.s2_k * 4, owner=key, source=source_filter
                )
            ]
            dense_ids: list[int] = []
            owned = set(lex)
            if len(lex) < cfg.s2_k:
                dense_ids, dense_records = await dense_pool()
                owned |= {
                    rid
                    for rid, rec in dense_records.items()
                    if rec.owner == key
                    and rec.state.value == "active"
                    and (source_filter is None or rec.source == source_filter)
                }
            chosen = rank_row(lex, dense_ids, owned, cfg.s2_k)
            if key != GROUP and cfg.s2_source_k > 0:
                about_others = [
                    rid
                    for rid, _ in await records.lexical(
                        match, channel_pks, cfg.s2_source_k, source=key, exclude_owner=key
                    )
                ]
                extra = [rid for rid in about_others if rid not in chosen][: cfg.s2_source_k]
            else:
                extra = []
            got = await records.get_many(chosen + extra)
            for rid in chosen + extra:
                rec = got.get(rid)
                if rec is None:
                    continue
                chain = await records.chain(rid) if projection.tense == "full" else [rec]
                row.records.append(RowRecord(rec, chain, via_source=rid in extra))
        if not row.records and key != GROUP and cfg.s2_fallback_messages > 0 and match:
            pks = [
                pk
                for pk, _ in await engine.store.messages.lexical(
                    match, channel_pks, cfg.s2_fallback_messages, speakers=[key]
                )
            ]
            found = await engine.store.messages.get_many(pks)
            row.fallback = [found[pk] for pk in pks if pk in found]
        rows.append(row)
    return rows
