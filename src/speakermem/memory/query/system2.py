"""System 2 path of /recall: choose the rows' people, then read their records in batches.

Rows come from Project. `ALL` never means the whole roster of a large channel: when the
channel has more active members than `s2_max_people`, the people for it are the ones most
relevant to the question (speakers of the top System 1 evidence, people those messages
address, owners of records that match the issue, fused by rank), plus GROUP. Named rows keep
question order and are capped the same way. A small team's ALL still reads everyone, so
"(none)" can be said of a member who said nothing on the issue.

Rows complement System 1, so they are read after it. Within a row the records the row owns
are ranked by fusing three orders (RRF): FTS5 BM25 on the issue, dense similarity to the
question (with System 1's question vector, so no extra model call; a vector still to be
computed is spent only on rows lexical leaves short), and records citing a message linked
by reply to the System 1 evidence (the turn an evidence message answers, or an answer to
it: the same exchange, often its half the evidence lacks). Records whose every supporting
message is already in the evidence go last: they add nothing to the pack. k per row;
`source_k` more records the row's person provided about others are added without using the
row's budget. An empty row falls back to the person's best verbatim messages on the issue;
a row with nothing is kept as "(none)".

However many people a channel has, the records of all rows come from a fixed number of
queries: one per kind (owned, provided about others, dense pool, chains, fallback
messages), each batched over the rows' people; none runs once per person.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import visible_records
from speakermem.memory.models import GROUP, DerivedRecord, RosterMember, Scope, StoredMessage
from speakermem.memory.query.projection import ALL, Projection
from speakermem.memory.roster_cache import derived, display_names
from speakermem.memory.search.fts_query import build_match
from speakermem.memory.search.fusion import rrf

DENSE_PER_OWNER = 200
"""The dense order of a row ranks its owner's latest this-many records by cosine (one
batched query for all rows, not a channel-wide KNN)."""
OWNER_POOL_PER_PERSON = 8
"""Matching records looked at per allowed person when ranking who is relevant to an ALL row."""
PEOPLE_RRF_K0 = 10
ROW_RRF_K0 = 10
DENSE_WEIGHT = 2.0
"""A row's records: the dense order's weight against the lexical order's (1)."""
LINKED_WEIGHT = 2.0
"""A row's records: the weight of those citing a reply of (or the turn answered by) the
System 1 evidence."""
SOURCE_POOL = 4
"""Records each person provided about others, looked at for the `source_k` extras."""
DENSE_NEAREST = 100
DENSE_POOL = 4
"""Per row, this many times k records are taken from the dense order into the fusion."""

QueryVector = (
    np.ndarray
    | asyncio.Future[np.ndarray | None]
    | Callable[[], Awaitable[np.ndarray | None]]
    | None
)
"""The question's embedding (an array, or System 1's task computing it: either is free), or
a function that computes it: called only if a row needs it."""


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


@dataclass(frozen=True)
class PeopleChoice:
    """Which people get a row, and why (for --explain)."""

    keys: list[str]
    """Row keys in order: user ids, then GROUP where it is read."""
    considered: int
    """People the rows could have held (the active human roster for ALL, else the named)."""
    left_out: int
    """Of those, how many got no row."""
    how: str
    """'named', 'everyone' (a small roster read whole) or 'relevance'."""


@dataclass
class S2Result:
    rows: list[Row]
    people: PeopleChoice
    queries: int = 0
    """Store queries System 2 ran (bounded by the number of query kinds, not of people)."""


def eligible_people(roster: Sequence[RosterMember]) -> list[str]:
    """Active human members, in roster order: who an ALL row may read (computed once per
    roster list; shared, do not change it)."""
    return derived(roster, "eligible", _eligible)


def _eligible(roster: Sequence[RosterMember]) -> list[str]:
    return list(dict.fromkeys(m.user_id for m in roster if not m.is_bot and m.active))


def choose_people(
    projection: Projection,
    roster: Sequence[RosterMember],
    limit: int,
    *,
    evidence_speakers: Sequence[str] = (),
    evidence_addressees: Sequence[str] = (),
    record_owners: Sequence[str] = (),
    eligible: Sequence[str] | None = None,
) -> PeopleChoice:
    """The rows' people: pure, so the selection can be tested without a store.

    ALL over a roster no larger than `limit` reads everyone (as before). Over a larger one,
    three rankings are fused (RRF): speakers of the System 1 evidence in evidence order, the
    people those messages address plus the people the question names, and the owners of the
    best matching records. Only eligible (active, human) members count; at most `limit`.
    """
    if ALL in projection.rows:
        people = list(eligible) if eligible is not None else eligible_people(roster)
        if len(people) <= limit:
            return PeopleChoice([*people, GROUP], len(people), 0, "everyone")
        allowed = set(people)
        rankings = [
            [p for p in evidence_speakers if p in allowed],
            [p for p in (*projection.speakers, *evidence_addressees) if p in allowed],
            [p for p in record_owners if p in allowed],
        ]
        fused = [p for p, _ in rrf(rankings, k0=PEOPLE_RRF_K0)][:limit]
        return PeopleChoice([*fused, GROUP], len(people), len(people) - len(fused), "relevance")
    named = list(dict.fromkeys(r for r in projection.rows if r != GROUP))
    keys = named[:limit] + ([GROUP] if GROUP in projection.rows else [])
    # keep the question's order (GROUP may come first in an LLM projection)
    order = [r for r in dict.fromkeys(projection.rows) if r in keys]
    return PeopleChoice(order, len(named), max(0, len(named) - limit), "named")


def rank_row(
    lexical: Sequence[int],
    dense: Sequence[int],
    linked: Sequence[int],
    owned: set[int],
    k: int,
    *,
    novel: Callable[[int], bool] | None = None,
) -> list[int]:
    """The row's own records by fused rank (RRF of the lexical, dense and linked orders;
    dense and linked weigh DENSE_WEIGHT and LINKED_WEIGHT), k at most; with `novel`, the
    records that add evidence the pack lacks come first, in that order."""
    lists = [
        [rid for rid in lexical if rid in owned],
        [rid for rid in dense if rid in owned],
        [rid for rid in linked if rid in owned],
    ]
    fused = [
        rid for rid, _ in rrf(lists, k0=ROW_RRF_K0, weights=[1.0, DENSE_WEIGHT, LINKED_WEIGHT])
    ]
    if novel is not None:
        fused = sorted(fused, key=lambda rid: not novel(rid))
    return fused[:k]


async def linked_records(
    engine: MemoryEngine, evidence: Sequence[StoredMessage], owners: Sequence[str]
) -> tuple[dict[int, int], int]:
    """Records of `owners` citing a message linked by reply to the System 1 evidence (the
    turn an evidence message answers, or an answer to it): the same exchange, often the
    part of it the evidence lacks. Record id -> the best rank of the evidence it is linked
    to; and the number of store queries made."""
    interactions = engine.store.interactions
    rank = {m.pk: i for i, m in enumerate(evidence)}
    parents = await interactions.parents(list(rank))
    replies = await interactions.replies(list(rank))
    near: dict[int, int] = {}
    for pk, (parent, _) in parents.items():
        near[parent] = min(near.get(parent, rank[pk]), rank[pk])
    for pk, kids in replies.items():
        for kid, _ in kids:
            near[kid] = min(near.get(kid, rank[pk]), rank[pk])
    for pk in rank:  # the evidence itself is already in the pack
        near.pop(pk, None)
    if not near:
        return {}, 2
    out: dict[int, int] = {}
    for rid, pk in await engine.store.records.citing(list(near), owners):
        out[rid] = min(out.get(rid, near[pk]), near[pk])
    return out, 3


async def visible_record_ids(
    engine: MemoryEngine, record_ids: Sequence[int], channel_pks: Sequence[int]
) -> set[int]:
    """Records the asker may see: every message each cites is in a channel they may read
    (a PERSON record built partly from a private channel never answers elsewhere)."""
    if not record_ids:
        return set()
    sources = await engine.store.governance.record_source_channels(record_ids)
    return visible_records(sources, set(channel_pks))


@dataclass
class Candidates:
    """What System 2 reads before System 1's evidence is known: the rows' people and each
    row's candidate records (lexical, dense, about others). `fill_rows` chooses among them."""

    people: PeopleChoice
    rows: list[Row]
    match: str
    special: str | None
    """The row the question's source/owner constraint applies to (ranked on its own)."""
    lexical: dict[str, list[int]] = field(default_factory=dict)
    about: dict[str, list[int]] = field(default_factory=dict)
    dense: dict[str, list[int]] = field(default_factory=dict)
    records: dict[int, DerivedRecord] = field(default_factory=dict)
    queries: int = 0


def people_need_evidence(
    projection: Projection, roster: Sequence[RosterMember], cfg: RecallConfig
) -> bool:
    """Whether choosing the rows' people needs System 1's evidence (an ALL question over
    more active members than `s2_max_people`): else the candidates can be read meanwhile."""
    return ALL in projection.rows and len(eligible_people(roster)) > cfg.s2_max_people


async def read_rows(
    engine: MemoryEngine,
    projection: Projection,
    roster: Sequence[RosterMember],
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    *,
    query_vector: QueryVector,
    evidence: Sequence[StoredMessage] = (),
) -> S2Result:
    """Choose the rows' people, then fill every row from a fixed number of batched queries."""
    cands = await read_candidates(
        engine, projection, roster, channel_pks, cfg, query_vector=query_vector, evidence=evidence
    )
    return await fill_rows(engine, cands, projection, channel_pks, cfg, evidence=evidence)


async def read_candidates(
    engine: MemoryEngine,
    projection: Projection,
    roster: Sequence[RosterMember],
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    *,
    query_vector: QueryVector,
    evidence: Sequence[StoredMessage] = (),
) -> Candidates:
    """The rows' people (`evidence` chooses them for a large ALL row) and their candidate
    records. A ready vector (an array, or System 1's embedding task) ranks the channel's
    nearest records into their owners' rows; one still to be computed (a callable) is spent
    only on rows lexical leaves short, and only when dense can add a record."""
    records = engine.store.records
    match = build_match(projection.issue)
    queries = 0
    owners: list[str] = []
    eligible = eligible_people(roster) if ALL in projection.rows else []
    if ALL in projection.rows and len(eligible) > cfg.s2_max_people and match:
        owners = await records.matching_owners(
            match, channel_pks, cfg.s2_max_people * OWNER_POOL_PER_PERSON
        )
        queries += 1
    people = choose_people(
        projection,
        roster,
        cfg.s2_max_people,
        evidence_speakers=[m.speaker_id for m in evidence],
        evidence_addressees=[a for m in evidence for a in m.addressees],
        record_owners=owners,
        eligible=eligible,
    )
    names = display_names(roster)
    rows = [Row(key=k, label="GROUP" if k == GROUP else names.get(k, k)) for k in people.keys]
    special = projection.owner if projection.source and projection.owner else None
    cands = Candidates(people=people, rows=rows, match=match, special=special)
    if cfg.s2_k <= 0 or not rows:
        cands.queries = queries
        return cands
    persons = [r.key for r in rows if r.key != GROUP]
    keys = [r.key for r in rows if r.key != special]
    lexical = await records.lexical_by_owner(match, channel_pks, keys, cfg.s2_k * 4)
    queries += 1 if match and keys else 0
    if special is not None and special in people.keys and match:
        lexical[special] = [
            rid
            for rid, _ in await records.lexical(
                match, channel_pks, cfg.s2_k * 4, owner=special, source=projection.source
            )
        ]
        queries += 1
    if cfg.s2_source_k > 0 and persons and match:
        cands.about = await records.lexical_by_source(
            match, channel_pks, persons, cfg.s2_source_k * SOURCE_POOL
        )
        queries += 1
    cands.lexical = lexical
    if callable(query_vector):
        queries += await _lazy_dense(engine, cands, channel_pks, cfg, query_vector)
    elif query_vector is not None:
        vector = await query_vector if isinstance(query_vector, asyncio.Future) else query_vector
        if vector is not None:
            # the channel's nearest records, each to its owner's row
            near = [rid for rid, _ in await records.dense(vector, channel_pks, DENSE_NEAREST)]
            cands.records = await records.get_many(near)
            queries += 2
            keys_set = set(people.keys)
            for rid in near:
                rec = cands.records.get(rid)
                if rec is not None and rec.owner in keys_set and rec.state.value == "active":
                    best = cands.dense.setdefault(rec.owner, [])
                    if len(best) < cfg.s2_k * DENSE_POOL:
                        best.append(rid)
    cands.queries = queries
    return cands


async def _lazy_dense(
    engine: MemoryEngine,
    cands: Candidates,
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    query_vector: Callable[[], Awaitable[np.ndarray | None]],
) -> int:
    """Dense candidates for the rows lexical leaves short, from their owners' latest
    records; the question is embedded only when dense can add a record lexical did not
    find (a sparse System 2 often has none: then the model call is saved, same rows).
    Returns the store queries made."""
    records = engine.store.records
    short = [r.key for r in cands.rows if len(cands.lexical.get(r.key, [])) < cfg.s2_k]
    if not short:
        return 0
    owned_by = dict(await records.latest_owned_by(channel_pks, short, DENSE_PER_OWNER))
    found_already = {rid for key in short for rid in cands.lexical.get(key, [])}
    if not any(rid not in found_already for rid in owned_by):
        return 1
    vector = await query_vector()
    if vector is None:
        return 1
    for rid, _ in await records.dense_among(vector, list(owned_by)):
        best = cands.dense.setdefault(owned_by[rid], [])
        if len(best) < cfg.s2_k * DENSE_POOL:
            best.append(rid)
    return 2


async def fill_rows(
    engine: MemoryEngine,
    cands: Candidates,
    projection: Projection,
    channel_pks: Sequence[int],
    cfg: RecallConfig,
    *,
    evidence: Sequence[StoredMessage] = (),
) -> S2Result:
    """Choose each row's records among the candidates, now that System 1's evidence is
    known (records linked to it rank up; those adding nothing to it go last), then read
    chains, apply access, and fall back to messages for empty rows."""
    records = engine.store.records
    rows, match, special = cands.rows, cands.match, cands.special
    persons = [r.key for r in rows if r.key != GROUP]
    queries = cands.queries
    chosen: dict[str, list[int]] = {}
    extra: dict[str, list[int]] = {}
    candidates = dict(cands.records)
    if cfg.s2_k > 0 and rows:
        linked: dict[int, int] = {}
        if evidence:
            linked, n = await linked_records(engine, evidence, [r.key for r in rows])
            queries += n
        pooled = {
            rid
            for ids in (*cands.lexical.values(), *cands.about.values(), *cands.dense.values())
            for rid in ids
        }
        wanted_ids = sorted((pooled | set(linked)) - set(candidates))
        if wanted_ids:
            candidates.update(await records.get_many(wanted_ids))
            queries += 1
        covered = {m.message_id for m in evidence}

        def adds_evidence(rid: int) -> bool:
            rec = candidates.get(rid)
            return rec is not None and not set(rec.from_ids) <= covered

        for row in rows:
            source_filter = projection.source if row.key == special else None
            fits = {
                rid
                for rid, rec in candidates.items()
                if rec.owner == row.key
                and rec.state.value == "active"
                and (source_filter is None or rec.source == source_filter)
            }
            lex = cands.lexical.get(row.key, [])
            near = sorted((rid for rid in linked if rid in fits), key=lambda r: (linked[r], -r))
            chosen[row.key] = rank_row(
                lex,
                cands.dense.get(row.key, []),
                near,
                fits | set(lex),
                cfg.s2_k,
                novel=adds_evidence,
            )
        for key in persons:
            ids = [rid for rid in cands.about.get(key, []) if rid not in chosen.get(key, [])]
            extra[key] = sorted(ids, key=lambda rid: not adds_evidence(rid))[: cfg.s2_source_k]
    wanted = [rid for row in rows for rid in (*chosen.get(row.key, []), *extra.get(row.key, []))]
    got = {rid: candidates[rid] for rid in wanted if rid in candidates}
    if got:  # access: only records whose every cited message the asker may read
        visible = await visible_record_ids(engine, list(got), channel_pks)
        got = {rid: rec for rid, rec in got.items() if rid in visible}
        queries += 1
    chains: dict[int, list[DerivedRecord]] = {}
    if projection.tense == "full" and got:
        chains = await records.chains(list(got))
        queries += 1
        nodes = await visible_record_ids(
            engine, sorted({n.id for chain in chains.values() for n in chain}), channel_pks
        )
        chains = {rid: [n for n in chain if n.id in nodes] for rid, chain in chains.items()}
        queries += 1
    for row in rows:
        for rid in (*chosen.get(row.key, []), *extra.get(row.key, [])):
            rec = got.get(rid)
            if rec is None:
                continue
            chain = chains.get(rid, [rec]) if projection.tense == "full" else [rec]
            row.records.append(RowRecord(rec, chain, via_source=rid in extra.get(row.key, [])))

    empty = [r.key for r in rows if not r.records and r.key != GROUP]
    if empty and cfg.s2_fallback_messages > 0 and match:
        by_speaker = await engine.store.messages.lexical_by_speaker(
            match, channel_pks, empty, cfg.s2_fallback_messages
        )
        pks = [pk for key in empty for pk in by_speaker.get(key, [])]
        messages = await engine.store.messages.get_many(pks) if pks else {}
        queries += 2 if pks else 1
        for row in rows:
            row.fallback = [messages[pk] for pk in by_speaker.get(row.key, []) if pk in messages]
    return S2Result(rows=rows, people=cands.people, queries=queries)


async def support_messages(engine: MemoryEngine, rows: Sequence[Row]) -> dict[str, StoredMessage]:
    """The messages the rows' records cite ("scope|message id" -> message), for Compose to
    number beside the System 1 excerpts."""
    wanted: dict[Scope, set[str]] = {}
    for row in rows:
        for rr in row.records:
            for node in rr.chain:
                wanted.setdefault(node.scope, set()).update(node.from_ids)
    out: dict[str, StoredMessage] = {}
    for scope, ids in wanted.items():
        for mid, msg in (await engine.store.messages.by_ids(scope, sorted(ids))).items():
            out[f"{scope}|{mid}"] = msg
    return out
