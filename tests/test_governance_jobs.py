"""Background governance work: the scheduler's retention job, and the Writer's re-derivation of
records withdrawn while other support remained (real client against the LLM test server)."""

from __future__ import annotations

import json

import pytest

from speakermem.bot.scheduler import WriterScheduler
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.writer.runner import Writer
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, LLMServer, Reply
from tests.test_governance_forget import GENERAL, seed
from tests.test_writer import FAST, llm_for, refs_by_text, user_prompt, wait_for

pytestmark = pytest.mark.contract


async def test_scheduler_applies_retention_on_start(engine: MemoryEngine) -> None:
    await engine.ingest_many(
        [
            msg(GENERAL, "old", "Alice", "ancient history", 0),
            msg(GENERAL, "new", "Alice", "fresh news", 3650 * 24 * 60),
        ]
    )
    gov = Governance(engine)
    await gov.set_retention("test", "w1", "general", 365, actor="cli")
    sched = WriterScheduler(engine, None, idle_seconds=3600, governance=gov)
    sched.start()
    try:

        async def gone() -> bool:
            rows = await engine.store.db.read(
                "SELECT message_id FROM messages WHERE deleted_at IS NULL"
            )
            return {r[0] for r in rows} == {"new"}

        await wait_for(gone, within_s=20.0)  # starts 1 s after start; CI machines are slow

        async def audited() -> bool:  # the receipt goes in after the last forget batch
            latest = await gov.audit(1)
            return bool(latest) and latest[0]["actor"] == "scheduler"

        await wait_for(audited, within_s=20.0)
        assert sched.runs["retention"] == 1
        audit = await gov.audit(5)
        assert audit[0]["actor"] == "scheduler" and audit[0]["receipt"]["messages"] == 1
    finally:
        await sched.shutdown()
    # without a governance service there is no retention job
    bare = WriterScheduler(engine, None, idle_seconds=3600)
    bare.start()
    try:
        assert bare._scheduler.get_job("retention") is None
    finally:
        await bare.shutdown()


async def test_writer_rederives_from_the_remaining_messages(
    engine: MemoryEngine, embedder: HashEmbedder, llm_server: LLMServer
) -> None:
    await seed(engine, embedder)
    gov = Governance(engine)
    await gov.forget_message(GENERAL, "b1", actor="cli")  # queues GROUP/bob from b2
    assert (await gov.status())["writer_queue"]["rederive"] == 1
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        # an outage defers the entry; it stays queued
        llm_server.fail_next(1)
        (deferred,) = await writer.rederive_due()
        assert deferred.status == "deferred"
        assert (await gov.status())["writer_queue"]["rederive"] == 1
        async with engine.store.db.transaction() as tx:  # due again now
            await tx.execute("UPDATE rederive_queue SET next_attempt_at = NULL")

        def answer(body: dict) -> Reply:
            ref = refs_by_text(user_prompt(body))["Alice and I fixed the dravenox together"]
            action = {
                "type": "ADD",
                "layer": "interaction",
                "source": "bob",
                "owner": "GROUP",
                "content": "Alice and Bob fixed the dravenox together.",
                "refs": [ref],
            }
            return Reply(content=json.dumps({"actions": [action]}))

        llm_server.default = Handler(answer)
        (done,) = await writer.rederive_due()
    assert done.status == "committed" and len(done.record_ids) == 1
    prompt = user_prompt(llm_server.requests[-1])
    assert "plimwick" not in prompt  # the forgotten message is not shown to the Writer
    (new,) = (await engine.store.records.get_many(done.record_ids)).values()
    assert new.from_ids == ("b2",) and new.owner == "GROUP"
    assert (await gov.status())["writer_queue"]["rederive"] == 0
    assert await writer.rederive_due() == []
