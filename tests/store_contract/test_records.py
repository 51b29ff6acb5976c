"""System 2 through the protocol: commits, update chains, provenance, search, the run log."""

from __future__ import annotations

import pytest

from speakermem.memory.models import GROUP, Layer, RecordScope, RecordState, Scope
from speakermem.memory.search.fts_query import quote
from speakermem.memory.store import ChainConflict, LeaseLost, Store, WriterRunLog
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.store_contract.conftest import pks_of, record, vector

GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")


def run(**kw: object) -> WriterRunLog:
    base: dict[str, object] = dict(model="test", prompt_version="writer-v1", started_at=0)
    base.update(kw)
    return WriterRunLog(**base)  # type: ignore[arg-type]


async def closed_segment(store: Store, scope: Scope, *texts: str) -> int:
    await store.messages.ingest(
        [msg(scope, f"m{i + 1}", "Alice", t, i) for i, t in enumerate(texts)], channel_default=True
    )
    await store.segments.close_channel(scope)
    (segment,) = await store.segments.due(limit=1, scope=scope)
    return segment.id


async def test_a_segment_commits_once_with_its_chain_provenance_and_run_log(
    store: Store, embedder: HashEmbedder
) -> None:
    segment = await closed_segment(store, GENERAL, "I am vegetarian", "now vegan")
    first = [record("Alice is vegetarian")]
    log = run(proposed=1, accepted=1, rejected={"ungrounded": 2})
    vectors = embedder.embed_sync(["Alice is vegetarian"])
    (rid,) = await store.records.commit_segment(segment, GENERAL, first, vectors, log)
    # a redo of a done segment commits nothing (crash-safe replays)
    assert await store.records.commit_segment(segment, GENERAL, first, None, log) == []
    assert (await store.segments.counts())["segments_done"] == 1
    update = record("Alice is vegan", supersedes=rid, from_ids=("m2",))
    (rid2,) = await store.records.add_records(GENERAL, [update], None)
    chain = await store.records.chain(rid2)
    assert [r.id for r in chain] == [rid, rid2]
    assert chain[0].state is RecordState.SUPERSEDED and chain[0].superseded_by == rid2
    assert chain[1].supersedes == rid and chain[1].chain_root == rid
    assert await store.records.chains([rid]) == {rid: chain}
    pks = await pks_of(store, GENERAL)
    heads = await store.records.heads(pks, owners=["alice"])
    assert [h.content for h in heads] == ["Alice is vegan"]
    assert await store.records.heads(pks, owners=["bob"]) == []
    with pytest.raises(ChainConflict):
        await store.records.add_records(GENERAL, [record("x", supersedes=rid)], None)
    # provenance: each record cites the message it came from
    m1 = await store.messages.get(GENERAL, "m1")
    assert m1 is not None
    assert await store.governance.records_citing([m1.pk]) == [rid]
    assert await store.governance.record_source_channels([rid, rid2]) == {
        rid: {pks[0]},
        rid2: {pks[0]},
    }
    assert (await store.records.get_many([rid]))[rid].from_ids == ("m1",)
    assert await store.records.channel_of([rid2]) == {rid2: GENERAL.key()}
    stats = await store.records.writer_stats()
    assert stats["flushes"] == 1 and stats["rejected"] == {"ungrounded": 2}
    counts = await store.records.counts()
    assert (counts["records"], counts["active_records"], counts["updates"]) == (2, 1, 1)


async def test_a_worker_that_lost_its_lease_commits_nothing(store: Store) -> None:
    segment = await closed_segment(store, GENERAL, "I am vegetarian")
    (claimed,) = await store.segments.claim("w1", 60, now=1_000.0)
    assert claimed.id == segment
    (taken,) = await store.segments.claim("w2", 60, now=2_000.0)  # w1's lease ran out
    assert taken.id == segment
    with pytest.raises(LeaseLost):
        await store.records.commit_segment(
            segment, GENERAL, [record("Alice is vegetarian")], None, run(), worker_id="w1"
        )
    assert await store.records.commit_segment(
        segment, GENERAL, [record("Alice is vegetarian")], None, run(), worker_id="w2"
    )
    assert (await store.records.counts())["records"] == 1


async def test_a_commit_drops_records_citing_forgotten_messages(store: Store) -> None:
    await store.messages.ingest([msg(GENERAL, "m1", "Alice", "I swim", 0)], channel_default=True)
    dropped: dict[str, int] = {}
    ids = await store.records.add_records(
        GENERAL, [record("Alice swims", from_ids=("nope",))], None, dropped=dropped
    )
    assert ids == [] and sum(dropped.values()) == 1


async def test_records_search_by_words_and_vectors(store: Store, embedder: HashEmbedder) -> None:
    await store.messages.ingest(
        [
            msg(GENERAL, "m1", "Alice", "x", 0),
            msg(GENERAL, "m2", "Bob", "z", 1),
            msg(RANDOM, "m1", "Bob", "y", 0),
        ],
        channel_default=True,
    )
    texts = ["Alice keeps bees", "Alice plays the cello", "Bob told Alice about bees"]
    recs = [
        record(texts[0]),
        record(texts[1]),
        record(texts[2], owner="alice", source="bob", from_ids=("m2",)),  # his own message
    ]
    ids = await store.records.add_records(GENERAL, recs, embedder.embed_sync(texts))
    (other,) = await store.records.add_records(
        RANDOM, [record("Bob keeps bees", owner="bob")], embedder.embed_sync(["Bob keeps bees"])
    )
    pks = await pks_of(store, GENERAL)
    hits = await store.records.lexical(quote("bees"), pks, 10)
    assert {rid for rid, _ in hits} == {ids[0], ids[2]}
    assert all(score < 0 for _, score in hits)  # lower is better, as FTS5's bm25()
    assert [r for r, _ in await store.records.lexical(quote("bees"), pks, 10, source="bob")] == [
        ids[2]
    ]
    both = await pks_of(store, GENERAL, RANDOM)
    assert {r for r, _ in await store.records.lexical(quote("bees"), both, 10)} == {
        ids[0],
        ids[2],
        other,
    }
    assert await store.records.lexical_by_owner(quote("cello"), pks, ["alice"], 5) == {
        "alice": [ids[1]]
    }
    assert await store.records.lexical_by_source(quote("bees"), pks, ["bob"], 5) == {
        "bob": [ids[2]]
    }
    assert await store.records.matching_owners(quote("bees"), both, 5) in (
        ["alice", "bob"],
        ["bob", "alice"],
    )
    dense = await store.records.dense(vector(embedder, "Alice plays the cello"), pks, 1)
    assert [rid for rid, _ in dense] == [ids[1]] and dense[0][1] == pytest.approx(1.0, abs=1e-4)
    latest = await store.records.latest_owned(pks, ["alice"], 2)
    assert len(latest) == 2 and set(latest) <= set(ids)
    among = await store.records.dense_among(vector(embedder, "bees"), ids)
    assert {rid for rid, _ in among} == set(ids)
    assert [s for _, s in among] == sorted((s for _, s in among), reverse=True)
    assert {r.id for r in await store.records.by_owner_name("alice")} == set(ids)


async def test_a_group_record_is_not_a_persons(store: Store) -> None:
    await store.messages.ingest([msg(GENERAL, "m1", "Alice", "x", 0)], channel_default=True)
    group = record(
        "the group likes hiking",
        owner=GROUP,
        source="alice",
        layer=Layer.INSIGHT,
        record_scope=RecordScope.GROUP,
    )
    assert await store.records.add_records(GENERAL, [group], None)
    pks = await pks_of(store, GENERAL)
    assert await store.records.matching_owners(quote("hiking"), pks, 5) == []


async def test_a_failed_run_is_logged(store: Store) -> None:
    segment = await closed_segment(store, GENERAL, "words")
    await store.records.log_failed_run(segment, GENERAL, run(outcome="llm_error", error="down"))
    stats = await store.records.writer_stats()
    assert stats["flushes"] == 1 and stats["failed_flushes"] == 1
