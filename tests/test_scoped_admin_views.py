"""Admin views stay in their scope (issue 27, defect 6).

The chat-side `export user` showed an admin every message of a member, those of private
channels the admin cannot read included; `status` counted every workspace's messages and
records. Both now answer for what the asker may see.
"""

from __future__ import annotations

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import CommandInvocation
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Layer, NewRecord, RecordScope, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import T0, msg

pytestmark = pytest.mark.contract

GENERAL = Scope(platform="test", workspace="w1", channel="general")
SECRET = Scope(platform="test", workspace="w1", channel="secret")
OTHER = Scope(platform="test", workspace="w2", channel="general")


def memory(
    text: str, scope: Scope, user: str, readable: tuple[str, ...] | None = None
) -> CommandInvocation:
    return CommandInvocation(
        scope=scope,
        command="memory",
        user_id=user,
        text=text,
        is_admin=True,
        readable_channels=readable,
    )


async def seed(engine: MemoryEngine) -> None:
    await engine.ingest_many(
        [
            msg(GENERAL, "g1", "Alice", "alice says hello in general", 0),
            msg(GENERAL, "g2", "Ann", "ann the admin is here", 1),
            msg(SECRET, "s1", "Alice", "alice's private plan", 2),
            msg(OTHER, "o1", "Zed", "another workspace entirely", 3),
            msg(OTHER, "o2", "Zed", "with two lines", 4),
        ]
    )
    for scope, mid in ((GENERAL, "g1"), (SECRET, "s1")):
        await engine.store.records.add_records(
            scope,
            [
                NewRecord(
                    layer=Layer.CORE,
                    record_scope=RecordScope.PERSON,
                    content=f"Alice wrote {mid}",
                    source="alice",
                    owner="alice",
                    event="",
                    time=T0,
                    session_id=0,
                    from_ids=(mid,),
                    writer_model="test",
                    prompt_version="t1",
                )
            ],
            None,
        )


async def test_chat_export_shows_only_channels_the_admin_can_read(engine: MemoryEngine) -> None:
    await seed(engine)
    d = Dispatcher(engine, RecallPipeline(engine))
    # ann's roster: general only (she never joined #secret)
    reply = await d.memory_command(memory("export user alice", GENERAL, "ann"))
    assert reply.data is not None
    assert [m["message_id"] for m in reply.data["messages"]] == ["g1"]
    assert [r["content"] for r in reply.data["records"]] == ["Alice wrote g1"]
    assert "private plan" not in str(reply.data) and "s1" not in str(reply.data["records"])
    assert reply.data["withheld"] == {"messages": 1, "records": 1}
    assert "left out" in reply.text
    # what the platform says the admin may read counts, when it says
    reply = await d.memory_command(
        memory("export user alice", GENERAL, "ann", readable=("general", "secret"))
    )
    assert reply.data is not None
    assert [m["message_id"] for m in reply.data["messages"]] == ["g1", "s1"]
    assert reply.data["withheld"] == {"messages": 0, "records": 0}


async def test_status_counts_are_the_workspaces_own(engine: MemoryEngine) -> None:
    await seed(engine)
    d = Dispatcher(engine, RecallPipeline(engine))
    reply = await d.memory_command(memory("status", OTHER, "zed"))
    assert reply.data is not None
    status = reply.data["status"]
    assert status["messages"] == 2 and status["records"] == 0
    assert [c["channel"] for c in status["channels"]] == ["test/w2/general"]
    assert "2 messages, 0 active records" in reply.text
    here = (await d.memory_command(memory("status", GENERAL, "ann"))).data
    assert here is not None
    assert here["status"]["messages"] == 3 and here["status"]["records_active"] == 2
    # the store-wide view is the operator's (the CLI), not a workspace's
    everything = await d.governance.status()
    assert everything["messages"] == 5


async def test_writer_usage_in_status_is_the_workspaces_own(engine: MemoryEngine) -> None:
    """The Writer's tokens, cost and backlog in `status` count only the asker's workspace."""
    from speakermem.memory.store import WriterRunLog

    await engine.ingest_many(
        [msg(GENERAL, f"m{i}", "Alice", f"alice talks about topic {i}", i) for i in range(26)]
    )
    (segment,) = await engine.store.segments.due(limit=5)
    run = WriterRunLog(
        model="m", prompt_version="v", started_at=0.0, prompt_tokens=900, completion_tokens=100
    )
    await engine.store.records.commit_segment(segment.id, GENERAL, [], None, run)
    gov = Dispatcher(engine, RecallPipeline(engine)).governance
    here = await gov.status("test", "w1")
    elsewhere = await gov.status("test", "w2")
    assert here["writer_usage"]["runs"] == 1 and here["writer_usage"]["prompt_tokens"] == 900
    assert here["writer_usage"]["messages_written"] == segment.n_messages
    assert elsewhere["writer_usage"]["runs"] == 0
    assert elsewhere["writer_usage"]["prompt_tokens"] == 0
    assert elsewhere["writer_queue"]["oldest_pending_age_s"] is None
