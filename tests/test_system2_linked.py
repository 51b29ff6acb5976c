"""System 2 rows complement System 1: records citing a reply of (or the turn answered by) the
verbatim evidence rank up, and records whose support the evidence already holds rank down."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import LAYER_SCOPE, Layer, NewRecord, Scope, StoredMessage
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.projection import Projection
from speakermem.memory.query.system2 import rank_row, read_rows
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract

SCOPE = Scope(platform="test", workspace="w", channel="kayaks")


def test_rank_row_fuses_and_puts_new_evidence_first() -> None:
    owned = {1, 2, 3, 4}
    # lexical alone
    assert rank_row([1, 2, 3], [], [], owned, 2) == [1, 2]
    # a record linked to the evidence, and first by dense, overtakes the lexical order
    assert rank_row([1, 2, 3], [3], [3], owned, 2)[0] == 3
    # records of other rows never enter
    assert rank_row([9, 1], [9], [9], owned, 2) == [1]
    # support already in the pack: those records go last
    assert rank_row([1, 2, 3], [], [], owned, 2, novel=lambda rid: rid != 1) == [2, 3]


def record(
    content: str, owner: str, cites: str, minutes: int, source: str | None = None
) -> NewRecord:
    return NewRecord(
        layer=Layer.CORE,
        record_scope=LAYER_SCOPE[Layer.CORE],
        content=content,
        source=source or owner,
        owner=owner,
        event="kayak",
        time=T0 + timedelta(minutes=minutes),
        session_id=1,
        from_ids=(cites,),
        writer_model="t",
        prompt_version="t",
    )


async def _channel(tmp_path: Path) -> tuple[MemoryEngine, dict[str, StoredMessage], dict[str, int]]:
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    events = [
        msg(SCOPE, "m0", "Ana", "we should rent kayaks for the lake trip", 0),
        msg(
            SCOPE, "m1", "Ben", "kayaks are fine by me, I paddled a lot as a kid", 1, reply_to="m0"
        ),
        msg(SCOPE, "m2", "Ana", "the weather looks good for saturday", 2),
        msg(SCOPE, "m3", "Ben", "my old kayak club had a summer cabin", 30),
        msg(SCOPE, "m4", "Ana", "bring sunscreen", 31),
    ]
    await engine.ingest_many(events)
    await engine.embed_pending()
    names = interaction_names(await engine.members(SCOPE))
    (pk,) = await engine.channel_pks([SCOPE])
    while await engine.store.interactions.update(pk, names):
        pass
    stored = await engine.store.messages.by_ids(SCOPE, [e.message_id for e in events])
    recs = [
        # most words in common with the issue, but cites what System 1 already has
        # (Ana's message: her view of Ben, so she is its source)
        record("Ben likes kayaks and kayak trips, kayaks every summer", "ben", "m0", 0, "ana"),
        record("Ben paddled kayaks as a kid", "ben", "m1", 1),
        record("Ben was in a kayak club", "ben", "m3", 2),
    ]
    ids = await engine.store.records.add_records(
        SCOPE, recs, HashEmbedder().embed_sync([r.content for r in recs])
    )
    return engine, stored, dict(zip(("covered", "linked", "other"), ids, strict=True))


async def _row(engine: MemoryEngine, evidence: list[StoredMessage], k: int = 1) -> list[int]:
    roster = await engine.members(SCOPE)
    pks = await engine.channel_pks([SCOPE])
    projection = Projection(issue="kayaks", rows=["ben"], tense="head", method="llm")
    cfg = RecallConfig(s2_k=k, s2_source_k=0)
    result = await read_rows(
        engine, projection, roster, pks, cfg, query_vector=None, evidence=evidence
    )
    (row,) = result.rows
    return [rr.record.id for rr in row.records]


async def test_rows_prefer_records_linked_to_the_evidence_that_add_to_it(tmp_path: Path) -> None:
    engine, stored, ids = await _channel(tmp_path)
    try:
        # no evidence yet: the best lexical match
        assert await _row(engine, []) == [ids["covered"]]
        # the evidence holds m0: the record citing its reply (m1) adds what S1 lacks
        assert await _row(engine, [stored["m0"]]) == [ids["linked"]]
        # m0 and m1 both in the evidence: only the third record adds anything
        assert await _row(engine, [stored["m0"], stored["m1"]]) == [ids["other"]]
        # citing(): the records of the given owners that cite the given messages
        cites = await engine.store.records.citing([stored["m1"].pk, stored["m3"].pk], ["ben"])
        assert sorted(cites) == sorted(
            [(ids["linked"], stored["m1"].pk), (ids["other"], stored["m3"].pk)]
        )
        assert await engine.store.records.citing([stored["m1"].pk], ["ana"]) == []
    finally:
        await engine.close()


async def test_the_pack_covers_more_with_linked_records(tmp_path: Path) -> None:
    engine, _, ids = await _channel(tmp_path)
    try:
        cfg = RecallConfig(top_k=1, s2_k=1, s2_source_k=0)
        result = await RecallPipeline(engine, config=cfg).run(
            RecallRequest("Who wants to rent kayaks for the lake trip?", SCOPE),
            answer=False,
        )
    finally:
        await engine.close()
    s1 = result.pack.s1_message_ids()
    assert s1 == ["m0"]
    # Ben's row holds the record citing m1, the reply to the evidence: the pack holds both
    rows = {r.key: [rr.record.id for rr in r.records] for r in result.rows}
    assert rows["ben"] == [ids["linked"]]
    assert set(result.pack.all_message_ids()) >= {"m0", "m1"}
