"""The Writer's scheduler, the replay Writer, and export with speaker matching (split from
test_writer.py, whose end-to-end channel and helpers it shares)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.scheduler import WriterScheduler
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.writer.runner import Writer
from tests.conftest import make_config, msg, shared_file
from tests.llm_server import Delay, LLMServer, Reply
from tests.test_writer import (
    FAST,
    NOOP_JSON,
    llm_for,
    run_e2e,
    wait_for,
)

pytestmark = pytest.mark.contract


# ---------------------------------------------------------------- scheduler


@pytest.fixture
async def live_engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    """Window 5 and a 0.6 s session gap, so windows fill and channels go idle quickly."""
    cfg = make_config(tmp_path, segment_window=5, session_gap_minutes=0.01)
    eng = await MemoryEngine.open(cfg, None)
    try:
        yield eng
    finally:
        await eng.close()


async def test_scheduler_flushes_on_kick_closes_idle_and_drains(
    live_engine: MemoryEngine, scope: Scope, llm_server: LLMServer
) -> None:
    engine = live_engine
    llm_server.default = Reply(content=NOOP_JSON)
    gap_s = engine.config.ingest.session_gap_minutes * 60

    def now_msgs(start: int, n: int) -> list[MessageEvent]:
        base = datetime.now(UTC)
        return [
            MessageEvent(
                scope=scope,
                message_id=f"s{start + i}",
                speaker_id="alice",
                speaker_name="Alice",
                text=f"live message {start + i}",
                ts=base + timedelta(milliseconds=i),
            )
            for i in range(n)
        ]

    async def done(n: int) -> bool:
        return (await engine.store.segments.counts())["segments_done"] == n

    async with llm_for(llm_server) as llm:
        sched = WriterScheduler(
            engine,
            Writer(engine, llm, FAST),
            idle_seconds=gap_s,
            write_interval_s=3600,
            idle_check_s=0.05,
        )
        sched.start()
        try:
            await asyncio.sleep(0.1)  # the start-up backlog run finds nothing
            assert llm_server.requests == []
            # a full window: kick() writes it at once (the interval is an hour)
            for ev in now_msgs(0, 5):
                await engine.ingest(ev)
            sched.kick()
            await wait_for(lambda: done(1))
            assert len(llm_server.requests) == 1
            # two messages, then silence: the idle job closes the segment and writes it
            for ev in now_msgs(5, 2):
                await engine.ingest(ev)
            assert (await engine.store.segments.counts())["segments_open"] == 1
            await wait_for(lambda: done(2))
            assert len(llm_server.requests) == 2
            # shutdown drains a flush that is in flight
            llm_server.script(Delay(0.3, Reply(content=NOOP_JSON)))
            for ev in now_msgs(7, 5):
                await engine.ingest(ev)
            sched.kick()
            await wait_for(lambda: len(llm_server.requests) == 3)
        finally:
            await sched.shutdown()
        assert await done(3)
        assert sched.runs["write"] >= 3 and sched.runs["close-idle"] >= 1


async def test_scheduled_runs_take_a_few_segments_each_and_follow_on_at_once(
    live_engine: MemoryEngine, llm_server: LLMServer
) -> None:
    """Behind a backlog a scheduled run takes `run_limit` due segments (what a run holds and
    how long it runs stay bounded), and the next run starts at once, not an interval later."""
    engine = live_engine
    llm_server.default = Reply(content=NOOP_JSON)
    async with llm_for(llm_server) as llm:
        # a fixed limit (ceiling = start): the run size under test does not move meanwhile
        writer = Writer(engine, llm, FAST.model_copy(update={"max_concurrency": 2}))
        backlog = 2 * writer.run_limit + 3
        for c in range(backlog):  # one full window (5 messages) per channel
            where = Scope(platform="test", workspace="w1", channel=f"c{c}")
            await engine.ingest_many(
                [msg(where, f"m{i}", "Alice", f"hi {i}", i / 1000) for i in range(5)]
            )
        assert len(await engine.store.segments.due(limit=1000)) == backlog
        sizes: list[int] = []
        flush_due = writer.flush_due

        async def counted(**kw: Any) -> list[Any]:
            outcomes = await flush_due(**kw)
            sizes.append(len(outcomes))
            return outcomes

        writer.flush_due = counted  # type: ignore[method-assign]
        sched = WriterScheduler(
            engine, writer, idle_seconds=3600, write_interval_s=3600, idle_check_s=3600
        )
        sched.start()

        async def all_done() -> bool:
            return (await engine.store.segments.counts())["segments_done"] == backlog

        try:  # the interval is an hour: only runs that follow on at once get there
            await wait_for(all_done, within_s=20.0)
        finally:
            await sched.shutdown()
    assert sum(sizes) == backlog
    assert max(sizes) == writer.run_limit
    assert len(sizes) >= 3


# ---------------------------------------------------------------- replay writer


@pytest.mark.slow
async def test_replay_writer_on_locomo_dev(tmp_path: Path) -> None:
    from speakermem.memory.datasets.locomo import read_locomo
    from speakermem.memory.writer.replay import replay_observations

    dataset = read_locomo(shared_file("locomo/locomo-dev.json"))
    engine = await MemoryEngine.open(make_config(tmp_path), None)
    try:
        await engine.ingest_many(dataset.messages)
        report = await replay_observations(engine, dataset.observations)
        records = (await engine.store.records.counts())["records"]
    finally:
        await engine.close()
    rejected = sum(report.rejected.values())
    print(
        f"\nreplay locomo-dev: {report.proposed} observations, {report.accepted} accepted, "
        f"rejected {dict(report.rejected)}"
    )
    assert report.proposed == len(dataset.observations) == 1210
    assert report.accepted + rejected == report.proposed
    assert records == report.accepted
    # the attribution rule refuses LoCoMo observations filed under one speaker that cite
    # only the partner's turn (a report about them, not their own words): 28 of 1210
    assert set(report.rejected) <= {"ungrounded", "self_report_not_cited"}
    assert report.rejected.get("self_report_not_cited", 0) <= 0.03 * 1210
    assert report.rejected["ungrounded"] < 0.10 * 1210


# ---------------------------------------------------------------- export + SpeakerLevenshtein

GOLD = [
    {
        "owner": "Alice",
        "source": "Alice",
        "layer": "core",
        "content": "Alice works as a paramedic now; she left the hospital.",
    },
    {
        "owner": "Bob",
        "source": "Bob",
        "layer": "profile",
        "content": "Bob adopted Rex, a golden retriever puppy.",
    },
    {
        "owner": "Carol",
        "source": "Carol",
        "layer": "core",
        "content": "Carol is learning the cello.",
    },
    {
        "owner": "GROUP",
        "source": "Dan",
        "layer": "interaction",
        "content": "The group meets every Friday for board games.",
    },
]


@pytest.mark.sqlite_only("builds its store from an explicit SQLite StoreConfig, then the CLI")
def test_writer_state_exports_and_scores_against_gold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from speakermem.integrations.cli.main import main
    from speakermem.memory.eval.speaker_levenshtein import load_state, speaker_levenshtein

    db = tmp_path / "e2e.db"
    scope = Scope(platform="test", workspace="w1", channel="general")

    async def build() -> None:
        engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
        try:
            async with LLMServer() as server:
                await run_e2e(engine, server, scope)
        finally:
            await engine.close()

    asyncio.run(build())
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    pred_path, gold_path = tmp_path / "pred.json", tmp_path / "gold.json"
    assert main(["records", "--export", str(pred_path), "--db", str(db)]) == 0
    gold_path.write_text(json.dumps(GOLD))
    pred = load_state(pred_path)
    assert sorted((r.owner, r.source, r.layer) for r in pred) == sorted(
        (g["owner"], g["source"], g["layer"]) for g in GOLD
    )
    result = speaker_levenshtein(pred, load_state(gold_path))
    assert set(result.per_owner) == {"alice", "bob", "carol", "GROUP"}
    assert all(s.n_pred == s.n_gold == 1 for s in result.per_owner.values())
    assert 0.5 < result.score < 1.0
    capsys.readouterr()
    assert main(["eval-writer", str(pred_path), str(gold_path)]) == 0
    out = capsys.readouterr().out
    assert f"SpeakerLevenshtein = {result.score:.4f}" in out
    # a swapped owner scores zero for that owner: the coordinates gate the content
    swapped = [dict(g, owner="Bob", source="Bob") if g["owner"] == "Carol" else g for g in GOLD]
    worse = speaker_levenshtein(pred, [type(pred[0]).model_validate(g) for g in swapped])
    assert worse.per_owner["carol"].f1 == 0.0 and worse.score < result.score
