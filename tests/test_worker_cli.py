"""Writer workers (`speakermem worker`, `Writer.write_claimed`) and SPEAKERMEM_WRITER_MODE.

Over both backends (contract suite): a worker claims segments with a lease, writes them
through the real client against the scripted LLM server, renews the lease during a slow
call, and gives its segments back when stopped. The CLI runs as a real subprocess.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.scheduler import WriterScheduler
from speakermem.bot.settings import Settings
from speakermem.integrations.cli.commands_worker import work
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.ports import LLM
from speakermem.memory.writer.runner import Writer
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.llm_server import Delay, Handler, LLMServer, Reply

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[1]
FAST = WriterConfig(retry_base_s=0.01, retry_max_s=0.05, concurrency=4)
WINDOW = 5


def llm_for(server: LLMServer) -> OpenAICompatLLM:
    return OpenAICompatLLM(
        server.base_url,
        "test-key",
        "test-model",
        5.0,
        "json_schema",
        max_retries=0,
        backoff_base_s=0.01,
        backoff_max_s=0.02,
    )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(make_config(tmp_path, segment_window=WINDOW), HashEmbedder())
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def llm_server() -> AsyncIterator[LLMServer]:
    async with LLMServer() as server:
        yield server


def _scope(c: int) -> Scope:
    return Scope(platform="test", workspace="w1", channel=f"c{c}")


async def _fill(engine: MemoryEngine, channels: int, windows: int) -> None:
    """`windows` full segments (pending at once) in each of `channels` channels."""
    base = datetime.now(UTC) - timedelta(minutes=5)
    for c in range(channels):
        for i in range(windows * WINDOW):
            await engine.ingest(
                MessageEvent(
                    scope=_scope(c),
                    message_id=f"c{c}-m{i}",
                    speaker_id="alice",
                    speaker_name="Alice",
                    text=f"message {i} in channel {c}",
                    ts=base + timedelta(seconds=i),
                )
            )


async def _segments(engine: MemoryEngine) -> list[Any]:
    return list(
        await engine.store.db.read(
            "SELECT id, state, claimed_by, lease_until, channel FROM segments ORDER BY id"
        )
    )


async def _runs_per_segment(engine: MemoryEngine) -> dict[int, int]:
    rows = await engine.store.db.read(
        "SELECT segment_id, count(*) FROM writer_runs GROUP BY segment_id"
    )
    return {int(r[0]): int(r[1]) for r in rows}


async def test_worker_writes_every_segment_once_in_channel_order(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await _fill(engine, channels=3, windows=2)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        totals = await work(
            writer, "w-a", lease_s=30.0, poll_s=0.05, once=True, stop=asyncio.Event()
        )
    segs = await _segments(engine)
    assert len(segs) == 6
    assert totals["committed"] == 6
    assert all(s[1] == "done" and s[2] == "w-a" for s in segs)
    assert await _runs_per_segment(engine) == {int(s[0]): 1 for s in segs}
    # a channel's second segment was written after its first (claims take the oldest only)
    prompts = [str(r["messages"][-1]["content"]) for r in llm_server.requests]
    for c in range(3):
        first = next(i for i, p in enumerate(prompts) if f"message 0 in channel {c}" in p)
        second = next(i for i, p in enumerate(prompts) if f"message {WINDOW} in channel {c}" in p)
        assert first < second


async def test_lease_is_renewed_during_a_slow_call(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await _fill(engine, channels=1, windows=1)
    llm_server.script(Delay(1.0, Reply(content="{}")))
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        task = asyncio.ensure_future(writer.write_claimed("w-slow", lease_s=0.3))
        await asyncio.sleep(0.7)  # past two lease lengths: only renewals keep it
        stolen = await engine.store.segments.claim("w-other", 0.3)
        outcomes = await task
    assert stolen == []
    assert [o.status for o in outcomes] == ["committed"]
    (seg,) = await _segments(engine)
    assert seg[1] == "done" and seg[2] == "w-slow"
    assert await _runs_per_segment(engine) == {int(seg[0]): 1}


async def test_stopping_a_worker_releases_its_segment(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await _fill(engine, channels=1, windows=1)
    arrived = asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        arrived.set()
        await asyncio.sleep(5.0)
        return Reply(content="{}")

    llm_server.script(Handler(slow))
    stop = asyncio.Event()
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        task = asyncio.ensure_future(
            work(writer, "w-stop", lease_s=60.0, poll_s=0.05, once=False, stop=stop)
        )
        await asyncio.wait_for(arrived.wait(), 5.0)
        (seg,) = await _segments(engine)
        assert seg[2] == "w-stop" and seg[3] is not None  # claimed, the call in flight
        stop.set()
        totals = await asyncio.wait_for(task, 2.0)
    assert sum(totals.values()) == 0
    (seg,) = await _segments(engine)
    assert seg[1] == "pending" and seg[2] is None and seg[3] is None
    assert await _runs_per_segment(engine) == {}
    # at once another worker may take it (no lease to wait out)
    (again,) = await engine.store.segments.claim("w-next", 60.0)
    assert again.id == seg[0]


async def test_an_endpoint_failure_defers_and_ends_the_lease(
    engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await _fill(engine, channels=1, windows=1)
    llm_server.fail_next(1)
    async with llm_for(llm_server) as llm:
        writer = Writer(engine, llm, FAST)
        outcomes = await writer.write_claimed("w-fail", lease_s=60.0)
        assert [o.status for o in outcomes] == ["deferred"]
        (seg,) = await _segments(engine)
        assert seg[1] == "pending" and seg[2] is None and seg[3] is None
        await asyncio.sleep(0.1)  # past the backoff and the breaker
        assert [o.status for o in await writer.write_claimed("w-fail", lease_s=60.0)] == [
            "committed"
        ]


@pytest.mark.parametrize("mode", ["inprocess", "workers"])
async def test_writer_mode_decides_whether_the_bot_writes(
    engine: MemoryEngine, llm_server: LLMServer, mode: str
) -> None:
    await _fill(engine, channels=1, windows=1)
    async with llm_for(llm_server) as llm:
        sched = WriterScheduler(
            engine,
            Writer(engine, llm, FAST),
            idle_seconds=3600,
            write_interval_s=0.05,
            writer_mode=mode,  # type: ignore[arg-type]
        )
        sched.start()
        try:
            sched.kick()
            await asyncio.sleep(0.5)
        finally:
            await sched.shutdown()
    (seg,) = await _segments(engine)
    if mode == "inprocess":
        assert seg[1] == "done" and len(llm_server.requests) == 1 and sched.runs["write"] >= 1
    else:  # the segment waits for a worker; the bot made no LLM call
        assert seg[1] == "pending" and llm_server.requests == [] and sched.runs["write"] == 0


async def test_sqlite_job_lock_always_runs(engine: MemoryEngine, backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("PostgreSQL's job lock is tested across stores in tests/test_pg_cluster.py")
    async with (
        engine.store.locks.try_job("retention") as first,
        engine.store.locks.try_job("retention") as second,
    ):
        assert first and second


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    if "SPEAKERMEM_DB_URL" in os.environ:  # the contract suite's PostgreSQL run
        env["SPEAKERMEM_DB_URL"] = os.environ["SPEAKERMEM_DB_URL"]
    env.update(SPEAKERMEM_EMBEDDER="none", SPEAKERMEM_LOG_LEVEL="WARNING", **extra)
    return env


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "speakermem.integrations.cli.main",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode()


@pytest.mark.e2e
async def test_worker_command_once(
    tmp_path: Path, engine: MemoryEngine, llm_server: LLMServer
) -> None:
    await _fill(engine, channels=2, windows=1)
    db = str(tmp_path / "test.db")
    code, out = await _cli(
        "worker",
        "--once",
        "--id",
        "cli-worker",
        "--lease-s",
        "30",
        "--db",
        db,
        env=_env(SPEAKERMEM_LLM_BASE_URL=llm_server.base_url, SPEAKERMEM_WRITER_WINDOW="5"),
    )
    assert code == 0, out
    assert "worker cli-worker: 2 committed" in out
    segs = await _segments(engine)
    assert [(s[1], s[2]) for s in segs] == [("done", "cli-worker")] * 2
    assert len(llm_server.requests) == 2


@pytest.mark.e2e
async def test_worker_command_needs_an_llm(tmp_path: Path, backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("fails before opening any store")
    code, out = await _cli("worker", "--once", "--db", str(tmp_path / "x.db"), env=_env())
    assert code == 2
    assert "no LLM configured" in out
    assert not (tmp_path / "x.db").exists()


class _NoPlatform:
    """An adapter that connects nowhere: the runtime's platform side is not under test."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("mode", ["inprocess", "workers"])
async def test_the_runtime_honours_writer_mode(
    tmp_path: Path,
    engine: MemoryEngine,
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    from speakermem.bot.settings import load_settings
    from speakermem.integrations import app, runtime

    await _fill(engine, channels=1, windows=1)
    monkeypatch.setattr(runtime, "build_adapters", lambda *a: [_NoPlatform()])
    built: list[OpenAICompatLLM] = []

    def build_llm(settings: Settings) -> LLM | None:
        llm = real_build_llm(settings)
        assert isinstance(llm, OpenAICompatLLM)
        built.append(llm)
        return llm

    real_build_llm = app.build_llm
    monkeypatch.setattr(app, "build_llm", build_llm)
    settings = load_settings(
        db_path=tmp_path / "test.db",
        embedder="none",
        llm_base_url=llm_server.base_url,
        llm_max_retries=0,
        writer_window=WINDOW,
        writer_mode=mode,
        slack_bot_token="xoxb-unused",
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(runtime.run(settings, stop=stop))
    if mode == "inprocess":
        # the write job's first run comes 50 ms after the start: wait for its segment (on a
        # busy machine that can take longer than any fixed pause)
        for _ in range(600):  # at most 30 s
            if (await _segments(engine))[0][1] == "done":
                break
            await asyncio.sleep(0.05)
    else:
        await asyncio.sleep(1.0)  # well past the 50 ms at which in-process writing starts
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    (seg,) = await _segments(engine)
    if mode == "inprocess":
        assert seg[1] == "done" and len(llm_server.requests) == 1
    else:
        assert seg[1] == "pending" and llm_server.requests == []
    # the bot's LLM client ends with the bot (its connections closed on this loop)
    assert len(built) == 1 and built[0]._client.is_closed()


async def test_a_worker_works_the_rederive_queue_unless_another_holds_it(
    tmp_path: Path, llm_server: LLMServer, backend: str
) -> None:
    from speakermem.memory.governance.service import Governance
    from tests.test_governance_forget import GENERAL, seed

    embedder = HashEmbedder()
    eng = await MemoryEngine.open(make_config(tmp_path), embedder)
    other = await MemoryEngine.open(make_config(tmp_path), embedder)  # another process
    try:
        await seed(eng, embedder)
        gov = Governance(eng)
        await gov.forget_message(GENERAL, "b1", actor="cli")  # queues a re-derivation
        assert (await gov.status())["writer_queue"]["rederive"] == 1
        async with llm_for(llm_server) as llm:
            writer = Writer(eng, llm, FAST)
            async with other.store.locks.try_job("rederive") as held:
                assert held
                skipped = await work(
                    writer, "w-r", lease_s=30.0, poll_s=0.05, once=True, stop=asyncio.Event()
                )
            # PostgreSQL: another process held the job, so this worker left the queue alone;
            # SQLite has one process per file and no such lock
            left = (await gov.status())["writer_queue"]["rederive"]
            assert (left, skipped["rederive-committed"]) == (
                (1, 0) if backend == "postgres" else (0, 1)
            )
            writer = Writer(eng, llm, FAST)
            totals = await work(
                writer, "w-r", lease_s=30.0, poll_s=0.05, once=True, stop=asyncio.Event()
            )
        assert (await gov.status())["writer_queue"]["rederive"] == 0
        assert totals["rederive-committed"] == (1 if backend == "postgres" else 0)
    finally:
        await other.close()
        await eng.close()
