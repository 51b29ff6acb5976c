"""The interaction graph and the console's reads through the protocol."""

from __future__ import annotations

from speakermem.memory.interactions import NameIndex
from speakermem.memory.models import Scope
from speakermem.memory.store import Store
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.store_contract.conftest import embed_pending, pks_of, record, vector

GENERAL = Scope(platform="test", workspace="w1", channel="general")

NAMES = NameIndex.build([("alice", "Alice", ()), ("bob", "Bob", ())])


async def seed(store: Store) -> int:
    await store.messages.ingest(
        [
            msg(GENERAL, "1", "Alice", "Bob, did you fix the bike?", 0),
            msg(GENERAL, "2", "Bob", "yes Alice, new brakes", 1, reply_to="1"),
            msg(GENERAL, "3", "Alice", "great, thanks", 2),
        ],
        channel_default=True,
    )
    (pk,) = await pks_of(store, GENERAL)
    return pk


async def test_the_graph_reads_each_message_once_and_links_replies(store: Store) -> None:
    pk = await seed(store)
    assert await store.interactions.behind() == [(pk, GENERAL)]
    assert await store.interactions.update(pk, NAMES) == 3
    assert await store.interactions.update(pk, NAMES) == 0  # up to date
    assert await store.interactions.behind() == []
    by_id = await store.messages.by_ids(GENERAL, ["1", "2", "3"])
    one, two = by_id["1"].pk, by_id["2"].pk
    addressed = await store.interactions.addressees([one, two])
    assert {uid for uid, _ in addressed[one]} == {"bob"}
    assert {uid for uid, _ in addressed[two]} == {"alice"}
    assert (await store.interactions.parents([two]))[two][0] == one
    replies = (await store.interactions.replies([one]))[one]
    assert replies[0][0] == two


async def test_relation_dense_ranks_what_one_person_was_told(
    store: Store, embedder: HashEmbedder
) -> None:
    pk = await seed(store)
    await store.interactions.update(pk, NAMES)
    await embed_pending(store, embedder)
    hits = await store.interactions.relation_dense(
        vector(embedder, "bike"), [pk], "bob", ["alice"], 5, max_messages=10
    )
    by_id = await store.messages.by_ids(GENERAL, ["1", "2"])
    assert {pk for pk, _ in hits} == {by_id["1"].pk, by_id["2"].pk}
    assert (
        await store.interactions.relation_dense(
            vector(embedder, "bike"), [pk], "bob", ["alice"], 5, max_messages=0
        )
        == []
    )


async def test_the_console_reads(store: Store) -> None:
    pk = await seed(store)
    await store.interactions.update(pk, NAMES)
    await store.records.add_records(
        GENERAL,
        [record("Bob fixed the bike", owner="bob", source="alice", from_ids=("1",))],
        None,
    )
    assert await store.console.active_records_per_channel() == {pk: 1}
    people = {c.person: (c.about, c.provided) for c in await store.console.record_people(pk)}
    assert people == {"bob": (1, 0), "alice": (0, 1)}
    recs, total = await store.console.person_records([pk], "bob", limit=10)
    assert total == 1 and recs[0].content == "Bob fixed the bike"
    said, n = await store.console.speaker_messages([pk], "alice", limit=1)
    assert n == 2 and [m.message_id for m in said] == ["3"]
    assert await store.console.on_roster([pk], "alice")
    assert not await store.console.on_roster([pk], "carol")
    edges = await store.console.addressee_edges(pk, last_messages=10, limit=10)
    assert ("alice", "bob", 1) in edges
    page, count = await store.console.people("test", "w1", query="bo", limit=10)
    assert count == 1 and page[0].user_id == "bob" and not page[0].opted_out
