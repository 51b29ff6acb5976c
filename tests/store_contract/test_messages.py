"""System 1 through the protocol: ingest, placement, edits, deletes, the indexes and reads."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from speakermem.memory.models import DeleteEvent, EditEvent, Scope
from speakermem.memory.search.fts_query import quote
from speakermem.memory.store import ChangeStatus, IngestStatus, Store
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder
from tests.store_contract.conftest import at, embed_pending, pks_of, vector

GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")
SECRET = Scope(platform="test", workspace="w1", channel="secret")


async def ingest(store: Store, *events: object) -> list[IngestStatus]:
    outcomes = await store.messages.ingest(list(events), channel_default=True)  # type: ignore[arg-type]
    return [o.status for o in outcomes]


async def lexical_ids(store: Store, word: str, *scopes: Scope) -> list[str]:
    pks = await pks_of(store, *scopes)
    hits = await store.messages.lexical(quote(word), pks, 50)
    found = await store.messages.get_many([pk for pk, _ in hits])
    return [found[pk].message_id for pk, _ in hits]


async def dense_ids(
    store: Store, embedder: HashEmbedder, text: str, *scopes: Scope, limit: int = 10
) -> list[str]:
    pks = await pks_of(store, *scopes)
    hits = await store.messages.dense(vector(embedder, text), pks, limit, 800)
    found = await store.messages.get_many([pk for pk, _ in hits])
    return [found[pk].message_id for pk, _ in hits]


async def test_a_message_round_trips_with_all_fields(store: Store) -> None:
    event = msg(
        GENERAL,
        "m1",
        "Alice",
        "Lunch at noon? <@bob>",
        0,
        thread_id="t9",
        reply_to="m0",
        addressees=("bob",),
    )
    assert await ingest(store, event) == [IngestStatus.STORED]
    stored = await store.messages.get(GENERAL, "m1")
    assert stored is not None
    assert stored.scope == GENERAL
    assert (stored.speaker_id, stored.speaker_name) == ("alice", "Alice")
    assert stored.text == "Lunch at noon? <@bob>"
    assert stored.ts == T0
    assert (stored.thread_id, stored.reply_to, stored.addressees) == ("t9", "m0", ("bob",))
    assert (stored.session_id, stored.turn_index) == (1, 0)
    assert not stored.deleted
    assert await store.messages.by_ids(GENERAL, ["m1", "zz"]) == {"m1": stored}
    assert await store.messages.get_many([stored.pk]) == {stored.pk: stored}
    assert await store.messages.get(RANDOM, "m1") is None


async def test_replayed_ids_never_duplicate(store: Store) -> None:
    events = [msg(GENERAL, f"m{i}", "Alice", f"word {i}", i) for i in range(30)]
    assert set(await ingest(store, *events)) == {IngestStatus.STORED}
    assert set(await ingest(store, *events, events[3])) == {IngestStatus.DUPLICATE}
    assert await ingest(store, events[0]) == [IngestStatus.DUPLICATE]
    assert (await store.messages.counts())["messages"] == 30
    assert len(await lexical_ids(store, "word", GENERAL)) == 30  # indexed once each
    # the same id in another channel is a different message
    assert await ingest(store, msg(RANDOM, "m0", "Bob", "hi", 0)) == [IngestStatus.STORED]
    counts = await store.messages.counts()
    assert counts["messages"] == 31 and counts["channels_with_messages"] == 2


async def test_sessions_split_on_idle_gaps_with_turn_indexes(store: Store) -> None:
    minutes = [0, 1, 2, 40, 41, 200, 199.5]
    await ingest(store, *(msg(GENERAL, f"m{i}", "Al", f"x{i}", m) for i, m in enumerate(minutes)))
    got = {}
    for i in range(len(minutes)):
        m = await store.messages.get(GENERAL, f"m{i}")
        assert m is not None
        got[i] = (m.session_id, m.turn_index)
    assert got == {0: (1, 0), 1: (1, 1), 2: (1, 2), 3: (2, 0), 4: (2, 1), 5: (3, 0), 6: (3, 1)}
    started = await store.messages.session_started(GENERAL, [1, 2, 3])
    assert started[2] == pytest.approx((T0 + timedelta(minutes=40)).timestamp())
    pks = await pks_of(store, GENERAL)
    assert await store.messages.session_total(pks) == 3
    assert await store.messages.session_sizes([(pks[0], 1), (pks[0], 3)]) == {
        (pks[0], 1): 3,
        (pks[0], 3): 2,
    }
    assert await store.messages.latest_ts(pks) == pytest.approx(
        (T0 + timedelta(minutes=200)).timestamp()
    )
    middle = await store.messages.get(GENERAL, "m1")
    assert middle is not None
    assert [m.message_id for m in await store.messages.neighbours(middle, 1)] == [
        "m0",
        "m1",
        "m2",
    ]


async def test_a_session_break_flag_forces_a_new_session(store: Store) -> None:
    await ingest(
        store,
        msg(GENERAL, "a", "Al", "one", 0),
        msg(GENERAL, "b", "Al", "two", 1, session_break=True),
    )
    b = await store.messages.get(GENERAL, "b")
    assert b is not None and (b.session_id, b.turn_index) == (2, 0)


async def test_the_indexes_follow_edits_and_deletes(store: Store, embedder: HashEmbedder) -> None:
    await ingest(
        store,
        msg(GENERAL, "m1", "Alice", "the marmalade recipe is great", 0),
        msg(GENERAL, "m2", "Bob", "I prefer strawberry jam", 1),
    )
    assert await embed_pending(store, embedder) == 2
    assert await lexical_ids(store, "marmalade", GENERAL) == ["m1"]

    edit = EditEvent(scope=GENERAL, message_id="m1", text="the pancake recipe", edited_at=T0)
    assert await store.messages.edit(edit, channel_default=True) is ChangeStatus.APPLIED
    assert await lexical_ids(store, "marmalade", GENERAL) == []
    assert await lexical_ids(store, "pancake", GENERAL) == ["m1"]
    # the edited message lost its vector until it is embedded again
    assert await store.messages.count_pending_embeddings() == 1
    assert "m1" not in await dense_ids(store, embedder, "pancake recipe", GENERAL)
    assert await embed_pending(store, embedder) == 1
    assert (await dense_ids(store, embedder, "pancake recipe", GENERAL, limit=1)) == ["m1"]
    edited = await store.messages.get(GENERAL, "m1")
    assert edited is not None and edited.edited_at == T0
    # the same edit again changes nothing
    assert await store.messages.edit(edit, channel_default=True) is ChangeStatus.UNCHANGED

    delete = DeleteEvent(scope=GENERAL, message_id="m2")
    assert await store.messages.delete(delete) is ChangeStatus.APPLIED
    assert await lexical_ids(store, "strawberry", GENERAL) == []
    assert "m2" not in await dense_ids(store, embedder, "strawberry jam", GENERAL)
    gone = await store.messages.get(GENERAL, "m2")
    assert gone is not None and gone.deleted and gone.text == ""
    assert set(await store.messages.vectors([gone.pk, edited.pk])) == {edited.pk}
    assert (await store.messages.counts())["deleted"] == 1
    # a replayed create of a deleted message does not bring it back
    again = msg(GENERAL, "m2", "Bob", "I prefer strawberry jam", 1)
    assert await ingest(store, again) == [IngestStatus.DUPLICATE]
    assert await lexical_ids(store, "strawberry", GENERAL) == []
    assert await store.messages.delete(delete) is ChangeStatus.UNCHANGED


async def test_edits_and_deletes_that_come_first_wait_for_their_message(store: Store) -> None:
    early = EditEvent(scope=GENERAL, message_id="e1", text="edited words", edited_at=T0)
    older = EditEvent(
        scope=GENERAL, message_id="e1", text="older words", edited_at=T0 - timedelta(minutes=1)
    )
    assert await store.messages.edit(early, channel_default=True) is ChangeStatus.UNKNOWN
    assert await store.messages.edit(older, channel_default=True) is ChangeStatus.UNKNOWN
    assert await store.messages.delete(DeleteEvent(scope=GENERAL, message_id="d1")) is (
        ChangeStatus.UNKNOWN
    )
    statuses = await ingest(
        store, msg(GENERAL, "e1", "Al", "first words", 0), msg(GENERAL, "d1", "Al", "secret", 1)
    )
    assert statuses == [IngestStatus.STORED, IngestStatus.DELETED]
    edited = await store.messages.get(GENERAL, "e1")
    assert edited is not None and edited.text == "edited words" and edited.edited_at == T0
    deleted = await store.messages.get(GENERAL, "d1")
    assert deleted is not None and deleted.deleted and deleted.text == ""
    assert store.messages.last_receipt is not None
    assert await lexical_ids(store, "secret", GENERAL) == []
    # an edit while the channel is off keeps no text of a message it never stored
    off = EditEvent(scope=RANDOM, message_id="x", text="kept?", edited_at=T0)
    assert await store.messages.edit(off, channel_default=False) is ChangeStatus.CHANNEL_OFF


async def test_vectors_skip_messages_edited_while_embedding(
    store: Store, embedder: HashEmbedder
) -> None:
    await ingest(store, msg(GENERAL, "m1", "Al", "first words", 0))
    items = await store.messages.pending_embeddings(10)
    assert [text for _, _, text in items] == ["Al: first words"]
    edit = EditEvent(scope=GENERAL, message_id="m1", text="changed", edited_at=T0)
    await store.messages.edit(edit, channel_default=True)
    stored = await store.messages.store_vectors(
        items, embedder.embed_sync([t for _, _, t in items])
    )
    assert stored == 0  # a stale vector is refused; the message stays pending
    assert await store.messages.count_pending_embeddings() == 1
    assert (await store.messages.counts())["unembedded"] == 1


async def test_search_is_restricted_to_the_given_channels(
    store: Store, embedder: HashEmbedder
) -> None:
    await ingest(
        store,
        msg(GENERAL, "p1", "Al", "the budget meeting is friday", 0),
        msg(SECRET, "s1", "Bo", "the budget budget budget secret", 0),
    )
    await embed_pending(store, embedder)
    assert await lexical_ids(store, "budget", GENERAL) == ["p1"]
    assert await dense_ids(store, embedder, "budget", GENERAL) == ["p1"]
    assert set(await lexical_ids(store, "budget", GENERAL, SECRET)) == {"p1", "s1"}
    assert await store.messages.lexical(quote("budget"), [], 10) == []
    assert await store.messages.dense(vector(embedder, "budget"), [], 10, 800) == []


async def test_lexical_filters_by_speaker_and_time(store: Store) -> None:
    await ingest(
        store,
        msg(GENERAL, "a", "Alice", "tea at five", 0),
        msg(GENERAL, "b", "Bob", "tea at six", 10),
        msg(GENERAL, "c", "Alice", "tea at seven", 20),
    )
    pks = await pks_of(store, GENERAL)
    by_id = {
        m.pk: m.message_id for m in (await store.messages.by_ids(GENERAL, ["a", "b", "c"])).values()
    }
    hits = await store.messages.lexical(
        quote("tea"), pks, 10, speakers=["alice"], speaker_names=["Alice"]
    )
    assert {by_id[pk] for pk, _ in hits} == {"a", "c"}
    hits = await store.messages.lexical(quote("tea"), pks, 10, since=at(5), until=at(15))
    assert [by_id[pk] for pk, _ in hits] == ["b"]
    grouped = await store.messages.lexical_by_speaker(quote("tea"), pks, ["alice", "bob"], 1)
    assert {s: len(v) for s, v in grouped.items()} == {"alice": 1, "bob": 1}
    assert {by_id[pk] for pk in grouped["bob"]} == {"b"}


async def test_the_lower_case_share_of_a_name_counts_how_people_write_it(store: Store) -> None:
    await ingest(
        store,
        msg(GENERAL, "1", "Al", "ask Big about it", 0),
        msg(GENERAL, "2", "Al", "a big deal", 1),
        msg(GENERAL, "3", "Al", "big big plans", 2),
    )
    seen, share = await store.messages.lowercase_share("big", await pks_of(store, GENERAL))
    assert (seen, share) == (4, 0.75)


async def test_session_term_counts_count_matching_messages_per_session(store: Store) -> None:
    await ingest(
        store,
        msg(GENERAL, "1", "Al", "kayak trip", 0),
        msg(GENERAL, "2", "Bo", "kayak rental", 1),
        msg(GENERAL, "3", "Al", "another kayak", 120),
        msg(GENERAL, "4", "Al", "nothing here", 121),
    )
    pks = await pks_of(store, GENERAL)
    counts = await store.messages.session_term_counts([quote("kayak"), quote("zebra")], pks)
    assert counts[quote("kayak")] == {(pks[0], 1): 2, (pks[0], 2): 1}
    assert counts.get(quote("zebra"), {}) == {}
    # a term matching more than `cap` messages is too common to tell sessions apart
    assert quote("kayak") not in await store.messages.session_term_counts(
        [quote("kayak")], pks, cap=2
    )


async def test_a_failed_batch_stores_nothing_and_keeps_earlier_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ingest(store, msg(GENERAL, "keep", "Al", "already stored", 0))

    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store.channels, "upsert_users", boom)
    with pytest.raises(RuntimeError):
        await ingest(store, *(msg(GENERAL, f"n{i}", "Al", "new words", 1 + i) for i in range(5)))
    monkeypatch.undo()
    assert (await store.messages.counts())["messages"] == 1
    assert await lexical_ids(store, "new", GENERAL) == []
    # and the same batch goes through afterwards, exactly once
    await ingest(store, *(msg(GENERAL, f"n{i}", "Al", "new words", 1 + i) for i in range(5)))
    assert (await store.messages.counts())["messages"] == 6


async def test_dense_search_ranks_by_exact_cosine(store: Store, embedder: HashEmbedder) -> None:
    texts = [f"topic{i} alpha beta" for i in range(50)] + ["gardening tomatoes basil"]
    await ingest(store, *(msg(GENERAL, f"m{i}", "Al", t, i) for i, t in enumerate(texts)))
    await embed_pending(store, embedder)
    pks = await pks_of(store, GENERAL)
    q = vector(embedder, "tomatoes basil gardening")
    hits = await store.messages.dense(q, pks, 3, 800)
    best = await store.messages.get(GENERAL, "m50")
    assert best is not None and hits[0][0] == best.pk
    stored = (await store.messages.vectors([best.pk]))[best.pk]
    assert stored.shape == (384,) and abs(float(np.linalg.norm(stored)) - 1) < 1e-4
    assert hits[0][1] == pytest.approx(float(stored @ q), abs=1e-5)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    corpus = await store.messages.channel_corpus(pks[0])
    assert len(corpus) == 51 and corpus[-1][1:] == ("m50", "Al", "gardening tomatoes basil")


async def test_speaker_dense_scores_only_rare_speakers(
    store: Store, embedder: HashEmbedder
) -> None:
    await ingest(
        store,
        *(msg(GENERAL, f"a{i}", "Alice", f"chatter {i}", i) for i in range(5)),
        msg(GENERAL, "b1", "Bob", "my bike is red", 10),
    )
    await embed_pending(store, embedder)
    pks = await pks_of(store, GENERAL)
    q = vector(embedder, "bike red")
    hits = await store.messages.speaker_dense(q, pks, ["alice", "bob"], 5, max_messages=2)
    bob = await store.messages.get(GENERAL, "b1")
    assert bob is not None and [pk for pk, _ in hits] == [bob.pk]
