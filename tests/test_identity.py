"""Identity that cannot be borrowed (issue 39): two people of one name are told apart in
the pack and the citations every surface renders, and a message shows the name its author
had when writing it, with the current one when it changed."""

from __future__ import annotations

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.identity import identities
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import T0, msg

SCOPE = Scope(platform="test", workspace="w1", channel="budget")


def test_a_shared_name_gets_handles_and_a_rename_shows_both_names() -> None:
    who = identities(
        {"alice": "Alice", "mallory": "Alice", "bob": "Bob", "al": "Alicia"},
        [("al", "Al"), ("bob", "Bob")],
    )
    assert who.person("alice") == "Alice (@alice)" and who.person("mallory") == "Alice (@mallory)"
    assert who.person("bob") == "Bob"
    assert who.author("mallory", "Alice") == "Alice (@mallory)"
    assert who.author("al", "Al") == "Al (now Alicia)"
    # a name shared only at the time of a message is still told apart
    then = identities({"bob": "Bob", "eve": "Eve"}, [("eve", "Bob")])
    assert then.author("eve", "Bob") == "Bob (@eve) (now Eve)"
    assert then.person("bob") == "Bob (@bob)"


@pytest.mark.contract
async def test_recall_tells_the_two_alices_apart(engine: MemoryEngine) -> None:
    mallory = msg(SCOPE, "m1", "Alice", "I will pay the whole overrun myself", 2)
    await engine.ingest_many(
        [
            msg(SCOPE, "a1", "Alice", "I oppose the budget increase for the overrun", 0),
            mallory.model_copy(update={"speaker_id": "mallory"}),
            msg(SCOPE, "r1", "Rob", "the overrun is big", 3),
        ]
    )
    await engine.roster(
        RosterEvent(scope=SCOPE, action=RosterAction.RENAME, user_id="rob", name="Robert", at=T0)
    )
    await engine.embed_pending()
    result = await RecallPipeline(engine).run(RecallRequest("who talked about the overrun?", SCOPE))
    speakers = {c.speaker for c in result.answer.citations} | {
        e.speaker for e in result.pack.excerpts
    }
    assert {"Alice (@alice)", "Alice (@mallory)"} <= speakers
    assert "Rob (now Robert)" in speakers
    assert "Alice (@mallory)" in result.answer.text
    asked = await RecallPipeline(engine).run(RecallRequest("what did Alice say?", SCOPE))
    assert asked.answer.text.endswith(
        "(More than one person here goes by that name: Alice (@alice), Alice (@mallory).)"
    )


@pytest.mark.contract
async def test_the_console_record_view_tells_the_authors_apart(engine: MemoryEngine) -> None:
    from speakermem.memory.console import ConsoleReads
    from speakermem.memory.models import GROUP, Layer, NewRecord, RecordScope

    mallory = msg(SCOPE, "m1", "Alice", "I will pay the whole overrun myself", 2)
    await engine.ingest_many(
        [
            msg(SCOPE, "a1", "Alice", "I oppose the budget increase for the overrun", 0),
            mallory.model_copy(update={"speaker_id": "mallory"}),
        ]
    )
    (rid,) = await engine.store.records.add_records(
        SCOPE,
        [
            NewRecord(
                layer=Layer.INTERACTION,
                record_scope=RecordScope.GROUP,
                content="Alice opposed the increase; the other Alice will pay the overrun.",
                source=GROUP,
                owner=GROUP,
                event="budget",
                time=T0,
                session_id=0,
                from_ids=("a1", "m1"),
                writer_model="test",
                prompt_version="t1",
            )
        ],
        None,
    )
    view = await ConsoleReads(engine).record(rid)
    assert view is not None
    assert [s.speaker_name for s in view.sources] == ["Alice (@alice)", "Alice (@mallory)"]
    assert view.names["mallory"] == "Alice (@mallory)"
