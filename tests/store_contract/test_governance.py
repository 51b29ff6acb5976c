"""Governance through the protocol: switches, preferences, the audit log, re-derivation and
the forgetting cascade."""

from __future__ import annotations

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import Scope
from speakermem.memory.search.fts_query import quote
from speakermem.memory.store import IngestStatus, Store
from tests.conftest import msg
from tests.store_contract.conftest import pks_of, record

GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")


async def test_a_channel_switch_turns_ingest_away_and_is_remembered(store: Store) -> None:
    assert await store.governance.set_channel_enabled(GENERAL, False, "admin") is None
    (out,) = await store.messages.ingest([msg(GENERAL, "a", "Al", "hi", 0)], channel_default=True)
    assert out.status is IngestStatus.CHANNEL_OFF
    assert not await store.governance.is_enabled(GENERAL, default=True)
    assert await store.governance.is_enabled(RANDOM, default=True)
    assert await store.governance.channel_switches("test", "w1", ["general", "random"]) == {
        "general": False
    }
    assert await store.governance.set_channel_enabled(GENERAL, True, "admin") is False
    policy = await store.governance.channel_policy(GENERAL)
    assert policy.enabled is True and policy.retention_days is None
    await store.governance.set_channel_retention(GENERAL, 30, "admin")
    await store.governance.set_workspace_retention("test", "w1", 90, "admin")
    assert (await store.governance.channel_policy(GENERAL)).retention_days == 30
    assert await store.governance.workspace_retention() == {("test", "w1"): 90}
    assert [p.scope for p in await store.governance.channel_policies()] == [GENERAL]
    # the notice is claimed once; a failed post releases it
    assert await store.governance.claim_notice(RANDOM)
    assert not await store.governance.claim_notice(RANDOM)
    await store.governance.release_notice(RANDOM)
    assert await store.governance.claim_notice(RANDOM)


async def test_members_opt_out_and_are_found_by_alias(store: Store) -> None:
    await store.messages.ingest([msg(GENERAL, "a", "Alice", "hi", 0)], channel_default=True)
    await store.governance.set_opted_out("test", "w1", "bob", True)
    (out,) = await store.messages.ingest([msg(GENERAL, "b", "Bob", "hi", 1)], channel_default=True)
    assert out.status is IngestStatus.OPTED_OUT
    assert await store.governance.is_opted_out("test", "w1", "bob")
    assert await store.governance.opted_out_count("test", "w1") == 1
    assert await store.governance.add_alias("test", "w1", "alice", "Ally")
    assert not await store.governance.add_alias("test", "w1", "alice", "ally")
    assert await store.governance.user_candidates("test", "w1", "ALLY") == [("alice", "Alice")]
    names = await store.governance.user_names("test", "w1", "alice")
    assert names == {"display_name": "Alice", "is_bot": False, "aliases": ["Ally"]}
    assert await store.governance.remove_alias("test", "w1", "alice", "ally")
    assert await store.governance.user_candidates("test", "w1", "ally") == []
    assert await store.governance.live_message_count("test", "w1", "alice") == 1
    assert await store.governance.has_spoken("test", "w1", "alice")
    assert not await store.governance.has_spoken("test", "w1", "bob")
    assert [r[1] for r in await store.governance.user_messages("test", "w1", "alice")] == ["a"]


async def test_the_audit_log_keeps_who_did_what(store: Store) -> None:
    receipt = Receipt(action="forget")
    receipt.add("messages", 2)
    first = await store.governance.log(
        platform="test",
        workspace="w1",
        actor="admin",
        action="forget",
        target="alice",
        args={"why": "asked"},
        receipt=receipt,
    )
    await store.governance.log(platform="test", workspace="w2", actor="x", action="policy")
    (entry,) = await store.governance.audit(10, platform="test", workspace="w1")
    assert (entry.id, entry.actor, entry.target) == (first, "admin", "alice")
    assert entry.args == {"why": "asked"} and entry.receipt == {"messages": 2}
    assert len(await store.governance.audit(10)) == 2


async def test_forgetting_a_message_withdraws_its_records_and_requeues_supported_heads(
    store: Store,
) -> None:
    await store.messages.ingest(
        [
            msg(GENERAL, "m1", "Alice", "I moved to Lisbon", 0),
            msg(GENERAL, "m2", "Alice", "Lisbon is sunny", 1),
        ],
        channel_default=True,
    )
    (rid,) = await store.records.add_records(
        GENERAL, [record("Alice lives in Lisbon", from_ids=("m1", "m2"))], None
    )
    (m1,) = await store.governance.message_pks(GENERAL, ["m1"])
    assert await store.governance.find_message("test", "w1", "m1") == [GENERAL]
    receipt = await store.governance.forget_messages([m1], Receipt(action="forget"), reason="test")
    assert receipt.counts["records"] == 1 and receipt.counts["rederive_queued"] == 1
    assert await store.records.get_many([rid]) == {}
    forgotten = await store.messages.get(GENERAL, "m1")
    assert forgotten is not None and forgotten.deleted and forgotten.text == ""
    pks = await pks_of(store, GENERAL)
    assert await store.messages.lexical(quote("moved"), pks, 10) == []
    (item,) = await store.governance.due_rederive()
    assert item.scope == GENERAL and item.from_ids == ("m2",) and item.owner == "alice"
    assert await store.governance.rederive_depth("test", "w1") == 1
    await store.governance.defer_rederive(item.id, "llm down", 3600)
    assert await store.governance.due_rederive() == []
    await store.governance.drop_rederive(item.id)
    assert await store.governance.rederive_depth() == 0
    # forgetting it again finds nothing left to do
    again = await store.governance.forget_messages([m1], Receipt(action="forget"), reason="test")
    assert again.counts.get("records", 0) == 0


async def test_the_selections_of_a_forget(store: Store) -> None:
    await store.messages.ingest(
        [
            msg(GENERAL, "a1", "Alice", "one", 0),
            msg(GENERAL, "b1", "Bob", "two", 1),
            msg(RANDOM, "a2", "Alice", "three", 2),
        ],
        channel_default=True,
    )
    (rid,) = await store.records.add_records(
        GENERAL, [record("Alice said one", from_ids=("a1",))], None
    )
    alice = await store.governance.user_message_pks("test", "w1", "alice")
    assert len(alice) == 2
    assert len(await store.governance.channel_message_pks(GENERAL)) == 2
    assert await store.governance.user_record_ids("test", "w1", "alice") == [rid]
    assert await store.governance.channel_record_ids(GENERAL) == [rid]
    (general_pk,) = await pks_of(store, GENERAL)
    t2 = (await store.messages.get(GENERAL, "b1")).ts.timestamp()  # type: ignore[union-attr]
    assert len(await store.governance.expired_message_pks(general_pk, t2)) == 1
    assert {scope for _, scope in await store.governance.channels_with_pk()} == {GENERAL, RANDOM}
    assert [r.id for r in await store.governance.user_records("test", "w1", "alice")] == [rid]
    assert [r.id for r in await store.governance.active_user_records("test", "w1", "alice")] == [
        rid
    ]
    withdrawn = await store.governance.withdraw([rid], Receipt(action="x"), reason="test")
    assert withdrawn.counts["records"] == 1
    assert await store.governance.user_record_ids("test", "w1", "alice") == []
    gone = await store.governance.delete_user_rows("test", "w1", "alice", Receipt(action="x"))
    assert gone.counts["users"] == 1
    assert await store.governance.user_names("test", "w1", "alice") == {
        "display_name": None,
        "is_bot": False,
        "aliases": [],
    }
