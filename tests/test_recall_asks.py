"""The recall options the new ways of asking use: a question asked in a thread is about that
thread first, and a direct message draws on every channel the asker can read (private ones
too: only the asker sees the answer), names them, and refuses when there is none.

Real store on both backends, the real pipeline without an LLM (extractive answers)."""

from __future__ import annotations

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest
from speakermem.memory.query.thread_focus import thread_first
from tests.conftest import T0, msg

pytestmark = pytest.mark.contract

GENERAL = Scope(platform="slack", workspace="T1", channel="CGEN")
SECRET = Scope(platform="slack", workspace="T1", channel="CSEC")
OFF = Scope(platform="slack", workspace="T1", channel="COFF")
THREAD = "m10"


def test_thread_first_puts_the_thread_ahead_and_keeps_each_part_in_order() -> None:
    assert thread_first([1, 7, 2, 8, 3], [9, 8, 7], size=10) == [7, 8, 9, 1, 2, 3]
    assert thread_first([1, 2, 3], [], size=10) == [1, 2, 3]
    assert thread_first([1, 7, 2], [9, 7], size=2) == [7, 9]


async def _channel(engine: MemoryEngine) -> None:
    events = [
        msg(GENERAL, "m1", "Ann", "We decided the logo will be blue, decided and done", 1),
        msg(GENERAL, "m2", "Bo", "decided: blue logo it is", 2),
        msg(GENERAL, THREAD, "Cy", "Thread: the launch date", 10),
        msg(GENERAL, "m11", "Ann", "Friday works for me", 11, thread_id=THREAD, reply_to=THREAD),
        msg(GENERAL, "m12", "Bo", "Agreed, Friday then", 12, thread_id=THREAD, reply_to=THREAD),
    ]
    for event in events:
        await engine.ingest(event)


async def test_a_question_in_a_thread_is_answered_from_that_thread_first(
    engine: MemoryEngine,
) -> None:
    await _channel(engine)
    pipeline = RecallPipeline(engine)
    question = "what did we decide?"
    plain = (await pipeline.run(RecallRequest(question, GENERAL))).answer
    in_thread = (await pipeline.run(RecallRequest(question, GENERAL, thread=THREAD))).answer
    thread_ids = {THREAD, "m11", "m12"}
    assert plain.citations and plain.citations[0].message_id not in thread_ids
    assert in_thread.citations
    assert in_thread.citations[0].message_id in thread_ids
    assert {c.message_id for c in in_thread.citations} >= thread_ids
    # a mention is stored like any message: the one that asks is never its own evidence
    asked = msg(GENERAL, "m13", "Cy", "what did we decide?", 13, thread_id=THREAD)
    await engine.ingest(asked)
    with_question = RecallRequest(question, GENERAL, thread=THREAD)
    cited = {c.message_id for c in (await pipeline.run(with_question)).answer.citations}
    assert "m13" in cited
    without = RecallRequest(question, GENERAL, thread=THREAD, asked_in="m13")
    cited = {c.message_id for c in (await pipeline.run(without)).answer.citations}
    assert "m13" not in cited and cited >= thread_ids


async def test_a_direct_question_draws_on_every_readable_channel_and_names_them(
    engine: MemoryEngine,
) -> None:
    await engine.ingest(msg(GENERAL, "g1", "Ann", "The budget is ten thousand", 1))
    await engine.ingest(msg(SECRET, "s1", "Bo", "The secret budget is nine thousand", 2))
    await engine.ingest(msg(OFF, "o1", "Cy", "The off budget is eight thousand", 3))
    await engine.set_channel_meta(SECRET, name="secret", is_private=True)
    await engine.store.governance.set_channel_enabled(OFF, False, "admin")
    for scope in (GENERAL, SECRET, OFF):
        await engine.roster(
            RosterEvent(scope=scope, action=RosterAction.JOIN, user_id="u1", name="U", at=T0)
        )
    pipeline = RecallPipeline(engine)
    # a channel question leaves the private channel out (its audience is the channel)
    here = (await pipeline.run(RecallRequest("budget", GENERAL, asker="u1"))).answer
    assert {c.scope for c in here.citations} == {GENERAL}
    # a direct one draws on both readable channels whose memory is on (the roster's)
    direct = (await pipeline.run(RecallRequest("budget", GENERAL, asker="u1", direct=True))).answer
    assert set(direct.searched) == {GENERAL, SECRET}
    assert {c.scope for c in direct.citations} == {GENERAL, SECRET}
    # the platform's list wins over the roster when given
    only = RecallRequest("budget", GENERAL, asker="u1", readable=[SECRET], direct=True)
    assert (await pipeline.run(only)).answer.searched == [SECRET]
    # nothing readable, or no asker: refused (fail closed)
    for req in (
        RecallRequest("budget", GENERAL, asker="u9", direct=True),
        RecallRequest("budget", GENERAL, asker="u1", readable=[OFF], direct=True),
        RecallRequest("budget", GENERAL, direct=True),
    ):
        with pytest.raises(AccessDenied):
            await pipeline.run(req)
