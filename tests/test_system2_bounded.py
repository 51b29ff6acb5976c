"""System 2 at community scale: the rows' people are few and relevant, and the number of
store queries does not grow with the number of people in the channel."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, LAYER_SCOPE, Layer, NewRecord, RosterMember, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.projection import ALL, Projection, fallback_projection
from speakermem.memory.query.system2 import choose_people, read_rows
from tests.conftest import T0, make_config, msg
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract

SCOPE = Scope(platform="test", workspace="w", channel="big")


def member(uid: str, *, bot: bool = False, left: bool = False) -> RosterMember:
    return RosterMember(
        user_id=uid, display_name=uid.title(), is_bot=bot, left_at=T0 if left else None
    )


def everyone(issue: str = "launch") -> Projection:
    return Projection(issue=issue, rows=[ALL], tense="head", method="fallback")


def test_a_small_team_is_read_whole_and_a_large_one_by_relevance() -> None:
    small = [member(f"p{i}") for i in range(4)] + [member("bot", bot=True)]
    choice = choose_people(everyone(), small, 5)
    assert choice.keys == ["p0", "p1", "p2", "p3", GROUP] and choice.how == "everyone"

    large = [member(f"p{i}") for i in range(500)] + [member("gone", left=True)]
    choice = choose_people(
        everyone(),
        large,
        3,
        evidence_speakers=["p7", "p7", "p9", "gone", "stranger"],
        evidence_addressees=["p9"],
        record_owners=["p42", "p9", "p7"],
    )
    # p9 and p7 are in all three rankings; people who left or are not members never count
    assert choice.keys[:2] == ["p9", "p7"] and choice.keys[2] == "p42"
    assert choice.keys[-1] == GROUP and choice.how == "relevance"
    assert (choice.considered, choice.left_out) == (500, 497)


def test_named_rows_are_capped_in_question_order() -> None:
    roster = [member(f"p{i}") for i in range(20)]
    proj = Projection(
        issue="x", rows=[f"p{i}" for i in range(12)] + [GROUP], tense="head", method="llm"
    )
    choice = choose_people(proj, roster, 5)
    assert choice.keys == ["p0", "p1", "p2", "p3", "p4", GROUP]
    assert choice.left_out == 7 and choice.how == "named"


async def _channel(tmp_path: Path, people: int) -> MemoryEngine:
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    events = [
        msg(
            SCOPE,
            f"m{i}",
            f"P{i % people}",
            f"the launch plan looks {'late' if i % 3 else 'fine'} to me, says number {i}",
            i,
        )
        for i in range(people * 3)
    ]
    await engine.ingest_many(events)
    await engine.embed_pending()
    records = [
        NewRecord(
            layer=Layer.CORE,
            record_scope=LAYER_SCOPE[Layer.CORE],
            content=f"P{p} thinks the launch should wait for the beta {p}",
            source=f"p{(p + 1) % people}" if p % 4 == 0 else f"p{p}",
            owner=f"p{p}",
            event="launch",
            time=T0 + timedelta(minutes=p),
            session_id=1,
            # a record from someone else cites their message too (issue 39's attribution)
            from_ids=(f"m{p}", f"m{(p + 1) % people}") if p % 4 == 0 else (f"m{p}",),
            writer_model="t",
            prompt_version="t",
        )
        for p in range(0, people, 2)  # half the people have a record
    ]
    records.append(
        NewRecord(
            layer=Layer.INSIGHT,
            record_scope=LAYER_SCOPE[Layer.INSIGHT],
            content="The team agreed the launch waits for the beta",
            source=GROUP,
            owner=GROUP,
            event="launch",
            time=T0,
            session_id=1,
            from_ids=("m0", "m1"),
            writer_model="t",
            prompt_version="t",
        )
    )
    vecs = HashEmbedder().embed_sync([r.content for r in records])
    await engine.store.records.add_records(SCOPE, records, vecs)
    return engine


async def _count_reads(engine: MemoryEngine, people: int) -> tuple[int, int, list[str]]:
    """(store reads by System 2, rows' people, their keys) for an ALL question."""
    roster = await engine.members(SCOPE)
    assert len([m for m in roster if not m.is_bot]) == people
    pks = await engine.channel_pks([SCOPE])
    projection = fallback_projection("What does everyone think about the launch plan?", roster)
    assert projection.rows == [ALL]
    hits = await engine.store.messages.lexical("launch", pks, 10)
    evidence = list((await engine.store.messages.get_many([pk for pk, _ in hits])).values())
    db = engine.store.db
    calls = 0
    # every way the store reads: `read`, and on PostgreSQL the prepared search statements
    names = [n for n in ("read", "read_prepared") if hasattr(db, n)]
    originals = {n: getattr(db, n) for n in names}

    def counting(original: Any) -> Any:
        async def read(sql: str, params: object = ()) -> list[object]:
            nonlocal calls
            calls += 1
            return await original(sql, params)  # type: ignore[no-any-return]

        return read

    for n in names:
        setattr(db, n, counting(originals[n]))
    try:
        result = await read_rows(
            engine,
            projection,
            roster,
            pks,
            RecallConfig(),
            query_vector=await engine.embed_query(projection.issue),
            evidence=evidence,
        )
    finally:
        for n in names:
            setattr(db, n, originals[n])
    keys = [r.key for r in result.rows if r.key != GROUP]
    assert calls >= result.queries > 0
    return calls, len(keys), keys


@pytest.mark.parametrize("people", [40, 400])
async def test_all_rows_cost_a_fixed_number_of_queries(tmp_path: Path, people: int) -> None:
    engine = await _channel(tmp_path, people)
    try:
        calls, n_people, keys = await _count_reads(engine, people)
    finally:
        await engine.close()
    # 5 people at most, and at most ~10 store reads, however many people exist (the old
    # per-row loop made 2-4 reads per person: 80-1,600 here)
    assert n_people == RecallConfig().s2_max_people
    assert calls <= 12
    assert all(k.startswith("p") for k in keys)


async def test_the_pack_says_who_was_left_out(tmp_path: Path) -> None:
    engine = await _channel(tmp_path, 60)
    try:
        result = await RecallPipeline(engine).run(
            RecallRequest("What does everyone think about the launch plan?", SCOPE)
        )
    finally:
        await engine.close()
    people = result.trace.s2_people
    assert people["how"] == "relevance" and people["considered"] == 60
    assert people["left_out"] == 55
    # the chosen are the ones the evidence and the records point at
    speakers = {m.speaker_id for m in result.pack.excerpts if m.track == "s1"}
    owners = {rr.record.owner for r in result.rows for rr in r.records}
    chosen = {r.key for r in result.rows if r.key != GROUP}
    assert chosen <= speakers | owners


async def test_explain_shows_who_was_read_and_what_was_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await _channel(tmp_path, 60)
    await engine.close()
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.setenv("SPEAKERMEM_RECALL_S2_PACK_TOKENS", "100")
    monkeypatch.setenv("SPEAKERMEM_RECALL_S1_PACK_TOKENS", "100")
    from speakermem.integrations.cli.main import main

    question = "What does everyone think about the launch plan?"
    db = str(tmp_path / "test.db")
    code = await asyncio.to_thread(
        main, ["--db", db, "recall", question, "--channel", "big", "--explain"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert '"how": "relevance"' in out and '"left_out": 55' in out
    assert "cut to fit" in out and "left out" in out


async def test_the_max_people_setting_bounds_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speakermem.bot.settings import Settings

    monkeypatch.setenv("SPEAKERMEM_RECALL_S2_MAX_PEOPLE", "2")
    cfg = Settings().memory_config().recall
    assert cfg.s2_max_people == 2
    engine = await _channel(tmp_path, 60)
    try:
        result = await RecallPipeline(engine, config=cfg).run(
            RecallRequest("What does everyone think about the launch plan?", SCOPE)
        )
    finally:
        await engine.close()
    assert [r.key for r in result.rows][-1] == GROUP and len(result.rows) == 3
    assert result.trace.s2_people["left_out"] == 58


async def test_the_question_is_embedded_only_when_dense_can_add_a_record(
    tmp_path: Path,
) -> None:
    """Rows short of lexical matches get a dense fill; when their people have no record the
    lexical pass missed, the embedding would change nothing and is not computed."""
    engine = await _channel(tmp_path, 6)  # records of p0, p2, p4 and GROUP, all about "launch"
    try:
        roster = await engine.members(SCOPE)
        pks = await engine.channel_pks([SCOPE])
        asked: list[str] = []

        async def vector() -> object:
            asked.append("embedded")
            return await engine.embed_query("launch")

        async def rows_for(issue: str, people: list[str]) -> dict[str, list[str]]:
            projection = Projection(issue=issue, rows=people, tense="head", method="llm")
            result = await read_rows(
                engine, projection, roster, pks, RecallConfig(), query_vector=vector
            )
            return {r.key: [rr.record.content for rr in r.records] for r in result.rows}

        # p3 owns nothing (and nothing is about p3): the row is short, yet dense has
        # nothing to add
        assert await rows_for("launch", ["p3"]) == {"p3": []}
        assert asked == []
        # p0 owns a record the words "beta plan budget" do not find: dense finds it
        rows = await rows_for("budget", ["p0"])
        assert asked == ["embedded"]
        assert rows["p0"] == ["P0 thinks the launch should wait for the beta 0"]
    finally:
        await engine.close()
