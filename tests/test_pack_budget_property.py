"""Property: the evidence pack never exceeds s1_pack_tokens + s2_pack_tokens, whatever the data.

Two levels. `compose` alone over random excerpts, rows, records, update chains, support
messages, names and budgets (fast, many examples). Then the whole /recall pipeline (no LLM)
over random rosters, record sets and questions on a real SQLite store (fewer examples).
"""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speakermem.memory.config import MemoryConfig, RecallConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import (
    GROUP,
    LAYER_SCOPE,
    DerivedRecord,
    Layer,
    MessageEvent,
    NewRecord,
    RecordState,
    Scope,
    StoredMessage,
)
from speakermem.memory.query.compose import approx_tokens, compose, render_pack
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.system2 import Row, RowRecord
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.slow

SCOPE = Scope(platform="test", workspace="w", channel="c")
T0 = datetime(2024, 1, 1, tzinfo=UTC)
WORDS = "launch budget venue deadline review plan design beta release party we our the".split()

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=2_500
)
names = st.text(min_size=1, max_size=300).filter(lambda s: s.strip() != "")


def stored(i: int, text: str, speaker: str, name: str) -> StoredMessage:
    return StoredMessage(
        pk=i + 1,
        scope=SCOPE,
        message_id=f"m{i}",
        thread_id=None,
        speaker_id=speaker,
        speaker_name=name,
        text=text,
        ts=T0 + timedelta(minutes=i),
        session_id=1,
        turn_index=i,
        reply_to=None,
        addressees=(),
        edited_at=None,
    )


def derived(rid: int, content: str, owner: str, source: str, from_ids: list[str]) -> DerivedRecord:
    layer = Layer.INSIGHT if owner == GROUP else Layer.CORE
    return DerivedRecord(
        id=rid,
        scope=SCOPE,
        layer=layer,
        record_scope=LAYER_SCOPE[layer],
        content=content or "x",
        source=source,
        owner=owner,
        event="",
        time=T0,
        session_id=None,
        state=RecordState.ACTIVE,
        from_ids=tuple(from_ids),
        chain_root=rid,
        writer_model="t",
        prompt_version="t",
    )


@st.composite
def packs(draw: st.DrawFn) -> dict[str, object]:
    n_msgs = draw(st.integers(0, 40))
    people = draw(st.lists(names, min_size=1, max_size=12))
    msgs = [
        stored(i, draw(texts), f"u{i % len(people)}", people[i % len(people)])
        for i in range(n_msgs)
    ]
    s1 = (
        draw(st.lists(st.sampled_from(msgs), max_size=15, unique_by=lambda m: m.pk)) if msgs else []
    )
    rid = 0
    rows: list[Row] = []
    for key in draw(st.lists(st.sampled_from([*range(len(people)), -1]), max_size=20, unique=True)):
        owner = GROUP if key == -1 else f"u{key}"
        label = "GROUP" if key == -1 else people[key]
        row = Row(key=owner, label=label)
        for _ in range(draw(st.integers(0, 5))):
            chain = []
            for _ in range(draw(st.integers(1, 6))):
                rid += 1
                cited = [f"m{draw(st.integers(0, max(n_msgs - 1, 0)))}"] if n_msgs else ["gone"]
                chain.append(derived(rid, draw(texts), owner, owner, cited))
            row.records.append(RowRecord(chain[-1], chain, via_source=draw(st.booleans())))
        if not row.records and owner != GROUP and msgs:
            row.fallback = draw(
                st.lists(st.sampled_from(msgs), max_size=3, unique_by=lambda m: m.pk)
            )
        rows.append(row)
    return {
        "s1": s1,
        "rows": rows,
        "support": {f"{m.scope}|{m.message_id}": m for m in msgs},
        "names": {f"u{i}": n for i, n in enumerate(people)},
        "tense": draw(st.sampled_from(["head", "full"])),
        "s1_budget": draw(st.integers(100, 3_000)),
        "s2_budget": draw(st.integers(100, 3_000)),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packs())
def test_composed_pack_never_exceeds_the_two_budgets(case: dict[str, object]) -> None:
    s1_budget, s2_budget = int(case["s1_budget"]), int(case["s2_budget"])  # type: ignore[call-overload]
    pack = compose(
        "q?",
        case["tense"],  # type: ignore[arg-type]
        case["s1"],  # type: ignore[arg-type]
        case["rows"],  # type: ignore[arg-type]
        case["support"],  # type: ignore[arg-type]
        case["names"],  # type: ignore[arg-type]
        s1_budget=s1_budget,
        s2_budget=s2_budget,
    )
    text = render_pack(pack)
    assert pack.tokens == approx_tokens(text) <= s1_budget + s2_budget
    # what is kept stays consistent: numbered once, citations point at existing excerpts,
    # S1 evidence keeps its order (only the tail is ever left out)
    assert [e.n for e in pack.excerpts] == list(range(1, len(pack.excerpts) + 1))
    kept_s1 = pack.s1_message_ids()
    assert kept_s1 == [m.message_id for m in case["s1"]][: len(kept_s1)]  # type: ignore[attr-defined]
    for row in pack.rows:
        for rec in row.records:
            assert all(pack.excerpt(n) is not None for n in rec.excerpts)
    # anything left out is said
    found_rows = len(case["rows"])  # type: ignore[arg-type]
    if len(pack.rows) < found_rows or len(kept_s1) < len(case["s1"]):  # type: ignore[arg-type]
        assert any(c.startswith("left out") for c in pack.cut)


async def _recall_case(
    tmp: Path,
    roster: list[str],
    records: list[tuple[int, int, str]],
    question: str,
    budgets: tuple[int, int],
) -> tuple[int, int, int, list[str]]:
    cfg = MemoryConfig(store=StoreConfig(db_path=tmp / "p.db"))
    engine = await MemoryEngine.open(cfg, HashEmbedder())
    try:
        events = [
            MessageEvent(
                scope=SCOPE,
                message_id=f"m{i}",
                speaker_id=f"u{i % len(roster)}",
                speaker_name=roster[i % len(roster)],
                text=f"{WORDS[i % len(WORDS)]} {WORDS[(i * 7) % len(WORDS)]} " * (1 + i % 30),
                ts=T0 + timedelta(minutes=i),
            )
            for i in range(max(len(roster) * 2, 10))
        ]
        await engine.ingest_many(events)
        await engine.embed_pending()
        new = [
            NewRecord(
                layer=Layer.INSIGHT if owner < 0 else Layer.CORE,
                record_scope=LAYER_SCOPE[Layer.INSIGHT if owner < 0 else Layer.CORE],
                content=content,
                source=GROUP if owner < 0 else f"u{source % len(roster)}",
                owner=GROUP if owner < 0 else f"u{owner % len(roster)}",
                event="",
                time=T0,
                session_id=None,
                from_ids=(f"m{(owner * 3 + source) % len(events)}",),
                writer_model="t",
                prompt_version="t",
            )
            for owner, source, content in records
        ]
        if new:
            vecs = HashEmbedder().embed_sync([r.content for r in new])
            await engine.store.records.add_records(SCOPE, new, vecs)
        rc = RecallConfig(s1_pack_tokens=budgets[0], s2_pack_tokens=budgets[1])
        result = await RecallPipeline(engine, config=rc).run(RecallRequest(question, SCOPE))
        people = [r.key for r in result.rows if r.key != GROUP]
        return result.pack.tokens, approx_tokens(render_pack(result.pack)), len(people), people
    finally:
        await engine.close()


record_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=400).map(" ".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    roster=st.lists(
        st.text(alphabet="abcdefghij ", min_size=2, max_size=40).filter(lambda s: s.strip()),
        min_size=1,
        max_size=60,
        unique_by=lambda s: s.strip().casefold(),
    ),
    records=st.lists(st.tuples(st.integers(-1, 80), st.integers(0, 80), record_text), max_size=60),
    words=st.lists(st.sampled_from([*WORDS, "everyone", "team", "what", "who"]), max_size=12),
    named=st.lists(st.integers(0, 59), max_size=4),
    budgets=st.tuples(st.integers(100, 2_000), st.integers(100, 2_000)),
)
def test_recall_pack_is_bounded_for_random_rosters_records_and_questions(
    roster: list[str],
    records: list[tuple[int, int, str]],
    words: list[str],
    named: list[int],
    budgets: tuple[int, int],
) -> None:
    who = [roster[i % len(roster)].strip() for i in named]
    question = " ".join([*words[:6], *who, *words[6:]]) + "?"
    with tempfile.TemporaryDirectory() as tmp:
        tokens, rendered, n_people, _ = asyncio.run(
            _recall_case(Path(tmp), roster, records, question, budgets)
        )
    assert tokens == rendered <= sum(budgets)
    assert n_people <= RecallConfig().s2_max_people
