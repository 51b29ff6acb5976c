"""The console's read model (memory/console.py over memory/store/console.py) on both store
backends: channel summaries, records by person, a record's sources and chain, the addressee
graph, a workspace's people, a person's messages, health."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from speakermem.memory.console import ConsoleReads
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import (
    GROUP,
    Layer,
    NewRecord,
    RecordScope,
    RosterAction,
    RosterEvent,
    Scope,
)
from tests.conftest import msg

pytestmark = pytest.mark.contract

GEN = Scope(platform="test", workspace="w1", channel="general")
OPS = Scope(platform="test", workspace="w1", channel="ops")
T = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def record(
    content: str, owner: str, source: str, ids: tuple[str, ...], **extra: object
) -> NewRecord:
    layer = Layer.INSIGHT if owner == GROUP else Layer.PROFILE
    return NewRecord(
        layer=layer,
        record_scope=RecordScope.GROUP if owner == GROUP else RecordScope.PERSON,
        content=content,
        source=source,
        owner=owner,
        event="plan",
        time=T + timedelta(minutes=len(content)),
        session_id=None,
        from_ids=ids,
        writer_model="test",
        prompt_version="t1",
        **extra,  # type: ignore[arg-type]
    )


async def _store(engine: MemoryEngine) -> dict[str, int]:
    for scope, people in ((GEN, ["ann", "ben", "cy"]), (OPS, ["ben"])):
        for uid in people:
            await engine.roster(
                RosterEvent(
                    scope=scope, action=RosterAction.JOIN, user_id=uid, name=uid.title(), at=T
                )
            )
    await engine.roster(
        RosterEvent(scope=GEN, action=RosterAction.ALIAS, user_id="ben", name="Benji")
    )
    texts = [
        ("m1", "Ann", "Ben, the picnic moves to Sunday"),
        ("m2", "Ben", "Ann, Sunday works for the picnic"),
        ("m3", "Cy", "Ann, I bring the lemonade"),
        ("m4", "Ann", "Great, Cy and Ben, see you Sunday"),
    ]
    for i, (mid, who, text) in enumerate(texts):
        await engine.ingest(msg(GEN, mid, who, text, i))
    await engine.ingest(msg(OPS, "o1", "Ben", "deploy at noon", 10))
    await engine.infer_interactions()
    rid = (
        await engine.store.records.add_records(
            GEN, [record("Ben likes Sunday", "ben", "ben", ("m2",))], None
        )
    )[0]
    rid2 = (
        await engine.store.records.add_records(
            GEN,
            [record("Ben likes Sundays best", "ben", "ann", ("m2", "m4"), supersedes=rid)],
            None,
        )
    )[0]
    await engine.store.records.add_records(
        GEN, [record("The picnic is on Sunday", GROUP, "ann", ("m1",))], None
    )
    ops = (
        await engine.store.records.add_records(
            OPS, [record("Ben deploys", "ben", "ben", ("o1",))], None
        )
    )[0]
    return {"first": rid, "head": rid2, "ops": ops}


async def test_channel_summaries_and_detail(engine: MemoryEngine) -> None:
    await _store(engine)
    reads = ConsoleReads(engine)
    await Governance(engine).set_channel(OPS, False, actor="t")
    by = {c.scope: c for c in await reads.channels([GEN, OPS])}
    assert by[GEN].messages == 4 and by[GEN].records == 2 and by[GEN].members == 3 and by[GEN].on
    assert by[OPS].records == 1 and not by[OPS].on
    assert [c.scope for c in await reads.channels([GEN])] == [GEN]
    assert await reads.channels([]) == []
    detail = await reads.channel(GEN)
    assert detail is not None and detail.retention_days is None and detail.last_message_at
    await Governance(engine).set_retention("test", "w1", None, 30, actor="t")
    detail = await reads.channel(GEN)
    assert detail is not None and (detail.retention_days, detail.retention_from) == (
        30,
        "workspace",
    )
    assert await reads.channel(Scope(platform="test", workspace="w1", channel="nope")) is None


async def test_records_by_person_with_sources_and_chain(engine: MemoryEngine) -> None:
    ids = await _store(engine)
    reads = ConsoleReads(engine)
    people, names = await reads.record_people(GEN)
    counts = {p.person: (p.about, p.provided) for p in people}
    assert counts == {"ben": (1, 0), "ann": (0, 2), GROUP: (1, 0)}
    assert names["ben"] == "Ben" and names[GROUP] == "the group"
    page, total = await reads.person_records([GEN, OPS], "ben", limit=1)
    assert total == 2 and len(page) == 1
    rest, _ = await reads.person_records([GEN, OPS], "ben", limit=5, offset=1)
    assert {r.id for r in page + rest} == {ids["head"], ids["ops"]}
    view = await reads.record(ids["head"])
    assert view is not None
    assert [s.message_id for s in view.sources] == ["m2", "m4"]
    assert view.sources[0].speaker_name == "Ben" and "Sunday" in view.sources[0].text
    assert [r.id for r in view.chain] == [ids["first"], ids["head"]]
    assert await reads.record(10**9) is None


async def test_graph_people_and_messages(engine: MemoryEngine) -> None:
    await _store(engine)
    reads = ConsoleReads(engine)
    graph = await reads.graph(GEN)
    pairs = {(e.speaker, e.addressee): e.messages for e in graph.edges}
    assert pairs.get(("ann", "ben"), 0) >= 1 and pairs.get(("cy", "ann"), 0) >= 1
    assert all(a != b for a, b in pairs)
    small = await reads.graph(GEN, last_messages=1)
    assert sum(e.messages for e in small.edges) <= 2  # only m4 counts

    rows, total = await reads.people("test", "w1", limit=2)
    assert total == 3 and [r.user_id for r in rows] == ["ann", "ben"]
    rows, total = await reads.people("test", "w1", query="benj")
    assert [r.user_id for r in rows] == ["ben"] and rows[0].aliases == ("Benji",)
    rows, total = await reads.people("test", "w1", within=[OPS])
    assert [r.user_id for r in rows] == ["ben"] and total == 1
    rows, total = await reads.people("test", "w1", query="100%_")
    assert total == 0
    await Governance(engine).opt_out("test", "w1", "cy", forget=False, actor="t")
    rows, _ = await reads.people("test", "w1", query="cy")
    assert rows[0].opted_out

    assert await reads.on_roster([OPS], "ben") and not await reads.on_roster([OPS], "ann")
    messages, n = await reads.speaker_messages([GEN, OPS], "ben", limit=1)
    assert n == 2 and messages[0].message_id == "o1"
    person = await reads.person("test", "w1", "ben")
    assert person is not None and person.aliases == ["Benji"]
    assert await reads.person("test", "w1", "nobody") is None


async def test_health_reads_the_queue_and_probes_the_llm_once_per_ttl(engine: MemoryEngine) -> None:
    await _store(engine)
    calls = 0

    async def probe() -> bool:
        nonlocal calls
        calls += 1
        return True

    reads = ConsoleReads(engine, llm_probe=probe)
    first = await reads.health()
    second = await reads.health()
    assert first.llm_configured and first.llm_reachable is True and calls == 1
    assert second.db_bytes > 0 and first.writer_pending >= 0
    assert (await ConsoleReads(engine).health()).llm_reachable is None


async def test_counts_come_from_a_snapshot_recounted_in_the_background(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _store(engine)
    reads = ConsoleReads(engine)
    assert (await reads.channels([GEN]))[0].messages == 4
    await engine.ingest(msg(GEN, "m5", "Cy", "one more about the picnic", 20))
    assert (await reads.channels([GEN]))[0].messages == 4  # the snapshot, fresh enough
    monkeypatch.setattr("speakermem.memory.console.COUNTS_TTL_S", 0.0)
    assert (await reads.channels([GEN]))[0].messages == 4  # stale: served, recount started
    refresh = reads._counts._refresh
    assert refresh is not None
    await refresh
    assert (await reads.channels([GEN]))[0].messages == 5
    await Governance(engine).forget_message(GEN, "m5", actor="t")
    reads.counts_changed()
    assert (await reads.channels([GEN]))[0].messages == 4  # dropped: counted again now
