"""A workspace admin's console shows their workspace's numbers only (issue #40, item 7):
the overview's Writer, re-derive and embedding backlogs (the database's size is the
operator's), and retention receipts in the audit log, as `/memory status` scopes them."""

from __future__ import annotations

import pytest

from speakermem.memory.console import ConsoleReads
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope
from tests.conftest import msg

pytestmark = pytest.mark.contract

MINE = Scope(platform="test", workspace="w1", channel="general")
THEIRS = Scope(platform="test", workspace="w2", channel="general")


async def test_overview_health_of_an_admin_counts_their_workspace_only(
    engine: MemoryEngine,
) -> None:
    await engine.ingest_many(
        [msg(THEIRS, f"t{i}", "Zed", f"zed talks about topic {i}", i) for i in range(26)]
        + [msg(MINE, "m1", "Ann", "ann says hello", 30)]
    )
    assert await engine.store.segments.due(limit=5)  # their workspace has Writer work waiting
    reads = ConsoleReads(engine)
    everything = await reads.health()
    mine = await reads.health([("test", "w1")])
    theirs = await reads.health([("test", "w2")])
    assert everything.writer_pending >= 1 and mine.writer_pending == 0
    assert theirs.writer_pending == everything.writer_pending
    assert mine.embed_pending + theirs.embed_pending == everything.embed_pending
    assert mine.embed_pending < theirs.embed_pending
    assert everything.db_bytes and mine.db_bytes is None  # the file holds every workspace


async def test_retention_receipts_are_each_workspaces_own(engine: MemoryEngine) -> None:
    await engine.ingest_many(
        [msg(MINE, f"m{i}", "Ann", f"ann line {i}", i) for i in range(3)]
        + [msg(THEIRS, f"t{i}", "Zed", f"zed line {i}", i) for i in range(5)]
    )
    gov = Governance(engine)
    for workspace in ("w1", "w2"):  # the messages are from 2024: long past a day
        await gov.set_retention("test", workspace, None, 1, actor="admin")
    receipt = await gov.apply_retention(actor="cli")
    assert receipt.counts["messages"] == 8  # the run's own answer still counts them all

    def applied(entries: list[dict[str, object]]) -> list[dict[str, object]]:
        return [e for e in entries if e["action"] == "retention-apply"]

    mine = applied(await gov.audit(50, platform="test", workspace="w1"))
    theirs = applied(await gov.audit(50, platform="test", workspace="w2"))
    assert [e["workspace"] for e in mine] == ["test/w1"]
    assert mine[0]["receipt"]["messages"] == 3  # type: ignore[index]
    assert [e["receipt"]["messages"] for e in theirs] == [5]  # type: ignore[index]
    # the operator's view has both, and nothing store-wide that double counts
    assert sorted(e["workspace"] for e in applied(await gov.audit(50))) == ["test/w1", "test/w2"]
