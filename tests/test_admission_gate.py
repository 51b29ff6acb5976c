"""One admission gate, in the memory engine, for every entry path (issue 27, defects 3 and 5).

Before, the channel switch, opt-outs and bot filtering were applied by the live dispatcher
only: an import (`MemoryEngine.ingest_many`, what `speakermem import` and backfills call),
a spill replay or any other path stored what the dispatcher would have refused, an edit by
an opted-out member kept its text, and a forgotten person came back with their next message
or the next roster update. Each test here drives a path other than a live message.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.spill import Spill
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import EditEvent, RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from speakermem.memory.store import ChangeStatus, IngestStatus
from tests.conftest import T0, msg

pytestmark = pytest.mark.contract

GENERAL = Scope(platform="test", workspace="w1", channel="general")
QUIET = Scope(platform="test", workspace="w1", channel="quiet")


async def texts(engine: MemoryEngine) -> dict[str, str]:
    rows = await engine.store.db.read(
        "SELECT message_id, text FROM messages WHERE deleted_at IS NULL ORDER BY id"
    )
    return {r[0]: r[1] for r in rows}


async def users(engine: MemoryEngine) -> dict[str, str]:
    rows = await engine.store.db.read("SELECT user_id, display_name FROM users ORDER BY 1")
    return {r[0]: r[1] for r in rows}


async def test_an_import_stores_nothing_of_a_disabled_channel(engine: MemoryEngine) -> None:
    """The issue's "20 of 20 new messages of a disabled channel were stored by import"."""
    gov = Governance(engine)
    await engine.ingest(msg(QUIET, "q0", "Ann", "before memory went off", 0))
    await gov.set_channel(QUIET, False, actor="test")
    outcomes = await engine.ingest_many(
        [msg(QUIET, f"q{i}", "Ann", f"exported note {i}", i) for i in range(1, 21)]
    )
    assert await texts(engine) == {"q0": "before memory went off"}
    assert [o.status.value for o in outcomes] == ["channel_off"] * 20
    await gov.set_channel(QUIET, True, actor="test")
    (again,) = await engine.ingest_many([msg(QUIET, "q1", "Ann", "exported note 1", 1)])
    assert again.status is IngestStatus.STORED


async def test_the_default_switch_applies_to_imports_too(tmp_path: Path) -> None:
    from tests.conftest import make_config

    config = make_config(tmp_path)
    config.governance.channel_default_enabled = False
    engine = await MemoryEngine.open(config)
    try:
        (out,) = await engine.ingest_many([msg(GENERAL, "m1", "Ann", "hello", 0)])
        assert await texts(engine) == {} and out.status.value == "channel_off"
        await Governance(engine).set_channel(GENERAL, True, actor="test")
        (out,) = await engine.ingest_many([msg(GENERAL, "m1", "Ann", "hello", 0)])
        assert out.status is IngestStatus.STORED
    finally:
        await engine.close()


async def test_bots_and_opted_out_members_are_refused_on_every_path(engine: MemoryEngine) -> None:
    gov = Governance(engine)
    await gov.opt_out("test", "w1", "olive", forget=False, actor="test")
    outcomes = await engine.ingest_many(
        [
            msg(GENERAL, "b1", "Deploy", "deployed v1", 0, speaker_is_bot=True),
            msg(GENERAL, "o1", "Olive", "an opted-out member's exported line", 1),
            msg(GENERAL, "a1", "Ann", "a line that stays", 2),
        ]
    )
    assert await texts(engine) == {"a1": "a line that stays"}
    assert [o.status.value for o in outcomes] == ["bot", "opted_out", "stored"]


async def test_an_opted_out_members_edits_keep_no_text(engine: MemoryEngine) -> None:
    """EditEvent had no author: the edit of an opted-out member's message was stored."""
    gov = Governance(engine)
    await engine.ingest(msg(GENERAL, "o1", "Olive", "my old words", 0))
    await gov.opt_out("test", "w1", "olive", forget=False, actor="test")
    # an edit of a message already held: its author is known from the row
    status, _ = await gov.apply_edit(
        EditEvent(scope=GENERAL, message_id="o1", text="new secret words", edited_at=T0)
    )
    assert (await texts(engine))["o1"] == "my old words"
    assert status.value == "opted_out"
    # an edit that arrives before its message: the platform names the author
    status = await engine.edit(
        EditEvent(
            scope=GENERAL,
            message_id="o2",
            text="early secret words",
            edited_at=T0,
            author_id="olive",
        )
    )
    rows = await engine.store.db.read("SELECT count(*) FROM early_changes")
    assert rows[0][0] == 0
    assert status.value == "opted_out"


async def test_an_early_edit_goes_when_its_author_opts_out(engine: MemoryEngine) -> None:
    status = await engine.edit(
        EditEvent(
            scope=GENERAL, message_id="o9", text="early words", edited_at=T0, author_id="olive"
        )
    )
    assert status is ChangeStatus.UNKNOWN  # kept for the message that has not arrived
    await Governance(engine).opt_out("test", "w1", "olive", forget=False, actor="test")
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0


async def test_a_forgotten_person_stays_out_until_lifted(engine: MemoryEngine) -> None:
    gov = Governance(engine)
    await engine.ingest_many(
        [
            msg(GENERAL, "a1", "Alice", "alice's first line", 0),
            msg(GENERAL, "b1", "Bob", "bob's line", 1),
        ]
    )
    await engine.roster(
        RosterEvent(scope=GENERAL, action=RosterAction.ALIAS, user_id="alice", name="Ally")
    )
    await gov.forget_user("test", "w1", "alice", actor="cli")
    assert await users(engine) == {"bob": "Bob"}
    # a re-import of the old message and a new one of hers: nothing comes back
    outcomes = await engine.ingest_many(
        [
            msg(GENERAL, "a1", "Alice", "alice's first line", 0),
            msg(GENERAL, "a2", "Alice", "alice again after the forget", 5),
        ]
    )
    assert "a2" not in await texts(engine)
    assert [o.status.value for o in outcomes] == ["duplicate", "forgotten"]
    # nor her name through roster updates (an export's users.json, a member update)
    for action, name in (
        (RosterAction.JOIN, "Alice"),
        (RosterAction.RENAME, "Alice A."),
        (RosterAction.ALIAS, "Ally"),
    ):
        await engine.roster(RosterEvent(scope=GENERAL, action=action, user_id="alice", name=name))
    await engine.store.channels.sync_members(GENERAL, [("alice", "Alice", False)])
    assert await users(engine) == {"bob": "Bob"}
    assert await engine.store.db.read("SELECT * FROM user_aliases") == []
    # her membership is kept (it is access, not memory)
    assert "alice" in {m.user_id for m in await engine.members(GENERAL)}
    # nor her edits' text
    status = await engine.edit(
        EditEvent(scope=GENERAL, message_id="a3", text="x", edited_at=T0, author_id="alice")
    )
    assert await texts(engine) == {"b1": "bob's line"}
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    assert status.value == "forgotten"
    assert (await gov.status("test", "w1"))["forgotten_people"] == 1

    # an admin lifts it (audited); what was forgotten stays forgotten
    receipt = await gov.lift_forget("test", "w1", "alice", actor="cli")
    assert receipt.counts == {"forgotten_people": 1}
    assert (await gov.audit(1))[0]["action"] == "forget-lift"
    outcomes = await engine.ingest_many(
        [
            msg(GENERAL, "a1", "Alice", "alice's first line", 0),
            msg(GENERAL, "a4", "Alice", "alice is back", 6),
        ]
    )
    assert [o.status for o in outcomes] == [IngestStatus.DUPLICATE, IngestStatus.STORED]
    assert await texts(engine) == {"b1": "bob's line", "a4": "alice is back"}


async def test_opting_in_lifts_a_forget(engine: MemoryEngine) -> None:
    gov = Governance(engine)
    await engine.ingest(msg(GENERAL, "c1", "Carol", "carol's line", 0))
    await gov.opt_out("test", "w1", "carol", forget=True, actor="test:carol")
    (out,) = await engine.ingest_many([msg(GENERAL, "c2", "Carol", "still out", 1)])
    assert "c2" not in await texts(engine) and out.status.value == "forgotten"
    receipt = await gov.opt_in("test", "w1", "carol", actor="test:carol")
    assert receipt.counts == {"user_prefs": 1, "forgotten_people": 1}
    (out,) = await engine.ingest_many([msg(GENERAL, "c3", "Carol", "carol is back", 2)])
    assert out.status is IngestStatus.STORED
    with pytest.raises(ValueError, match="not forgotten"):
        await gov.lift_forget("test", "w1", "carol", actor="cli")


async def test_a_spill_replay_goes_through_the_gate(engine: MemoryEngine, tmp_path: Path) -> None:
    """Events kept while the store was full are replayed through the same gate: a channel
    switched off meanwhile stores none of them."""
    spill = Spill(tmp_path / "spill.jsonl")
    for i in range(3):
        spill.append(msg(QUIET, f"s{i}", "Ann", f"spilled line {i}", i))
    d = Dispatcher(engine, RecallPipeline(engine), spill=spill)
    await d.governance.set_channel(QUIET, False, actor="test")
    assert await d.replay_spill() == 3
    assert await texts(engine) == {} and d.stats.ignored["channel_off"] == 3


async def test_an_edit_of_an_unknown_message_in_a_disabled_channel_keeps_no_text(
    engine: MemoryEngine,
) -> None:
    await Governance(engine).set_channel(QUIET, False, actor="test")
    status = await engine.edit(
        EditEvent(scope=QUIET, message_id="q1", text="words", edited_at=T0 + timedelta(minutes=1))
    )
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    assert status.value == "channel_off"
