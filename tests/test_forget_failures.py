"""Failure paths lose nothing and leak nothing (issue 27, defect 4).

- an acked event the store cannot take because it is locked (StoreBusy), not only full, is
  kept in the spill, and catch-up never moves its cursor past an event it could not keep;
- the spill is written whole or not at all (a disk that fills mid-line leaves no torn
  line), is mode 0600, and a forget takes its words out of it (in the bot, and from the
  CLI while the bot runs);
- a forget that fails part-way is recorded, says so, and is resumed until complete;
- a failed retention run is retried after a short backoff, not a day later;
- `doctor` warns when the spill shares the database's disk.

The store is locked for real: another process holds SQLite's write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from speakermem.bot.catchup import CatchUp
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.scheduler import WriterScheduler
from speakermem.bot.settings import Settings
from speakermem.bot.spill import Spill
from speakermem.integrations.cli.main import main
from speakermem.memory.config import IngestConfig, MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import msg
from tests.test_reliability_store import hold_write_lock

GENERAL = Scope(platform="test", workspace="w1", channel="general")


def config(tmp_path: Path) -> MemoryConfig:
    """A SQLite store that gives up on a held write lock within a tenth of a second."""
    return MemoryConfig(
        store=StoreConfig(db_path=tmp_path / "t.db", busy_timeout_ms=10, lock_wait_s=0.1),
        ingest=IngestConfig(),
    )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(config(tmp_path))
    try:
        yield eng
    finally:
        await eng.close()


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holding the database's write lock (POSIX locks do not conflict
    within one process)."""
    holder = hold_write_lock(db, 60.0)
    try:
        yield
    finally:
        holder.kill()
        holder.wait(10)


async def live(engine: MemoryEngine) -> list[str]:
    rows = await engine.store.db.read(
        "SELECT message_id FROM messages WHERE deleted_at IS NULL ORDER BY id"
    )
    return [r[0] for r in rows]


async def test_a_locked_store_spills_the_event_instead_of_dropping_it(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(tmp_path / "s.jsonl"))
    with locked(engine.store.db.path):
        assert await d.handle(msg(GENERAL, "m1", "Ann", "kept while locked", 0))
    assert d.spill is not None and d.spill.count == 1
    assert d.stats.errors["store_error"] == 1 and d.stats.handled["spilled"] == 1
    assert await live(engine) == []
    assert await d.replay_spill() == 1
    assert await live(engine) == ["m1"] and d.spill.count == 0


class History:
    """A channel's history as pages of three, oldest first (a platform's history API)."""

    platform = "test"

    def __init__(self, events: list[MessageEvent]) -> None:
        self.events = events

    async def pages(
        self, scope: Scope, *, after_id: str | None, after_ts: float | None
    ) -> AsyncIterator[list[MessageEvent]]:
        ids = [e.message_id for e in self.events]
        newer = self.events[ids.index(after_id) + 1 :] if after_id else self.events
        for start in range(0, len(newer), 3):
            yield newer[start : start + 3]


async def test_catch_up_never_moves_past_an_event_it_could_neither_store_nor_keep(
    engine: MemoryEngine,
) -> None:
    """Without a spill to keep it, a locked store stops the channel: the cursor stays at the
    last event stored, and the next run resumes there and stores the rest."""
    history = History([msg(GENERAL, f"h{i}", "Ann", f"history line {i}", i) for i in range(7)])
    d = Dispatcher(engine, RecallPipeline(engine))
    runner = CatchUp(d, engine.store.catchup, history)
    await engine.ingest(history.events[0])
    real = d.handle

    async def locked_at_h4(event: MessageEvent) -> bool:  # another process writes then
        if event.message_id != "h4":
            return await real(event)
        with locked(engine.store.db.path):
            return await real(event)

    d.handle = locked_at_h4  # type: ignore[assignment]
    start = ("h0", history.events[0].ts.timestamp())
    (prog,) = await runner.run({GENERAL: start})
    assert prog.error is not None and not prog.done
    assert await live(engine) == ["h0", "h1", "h2", "h3"]
    (cursor,) = await engine.store.catchup.cursors("test")
    assert cursor.cursor_id == "h3" and not cursor.finished
    # the next run starts from the saved cursor and stores the rest once
    d.handle = real  # type: ignore[method-assign]
    starts = await runner.plan({GENERAL: start})
    assert starts[GENERAL][0] == "h3"
    (prog,) = await runner.run(starts)
    assert prog.done and await live(engine) == [f"h{i}" for i in range(7)]


@pytest.mark.e2e
def test_a_disk_that_fills_mid_line_leaves_the_spill_whole(tmp_path: Path) -> None:
    """RLIMIT_FSIZE caps the file a few bytes into the next line (the kernel writes part of
    it, then refuses): the append fails, the file is cut back, and it reads as before."""
    path = tmp_path / "s.jsonl"
    script = textwrap.dedent(
        f"""
        import os, resource, signal, sys
        from speakermem.bot.spill import Spill
        from tests.conftest import msg
        from speakermem.memory.models import Scope
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        scope = Scope(platform="test", workspace="w1", channel="general")
        spill = Spill({str(path)!r})
        spill.append(msg(scope, "a", "Ann", "first line", 1))
        size = os.path.getsize({str(path)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, size + 20))
        try:
            spill.append(msg(scope, "b", "Ann", "x" * 400, 2))
        except OSError as exc:
            print("refused", exc.errno)
        print(os.path.getsize({str(path)!r}) == size, spill.count)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        check=True,
    ).stdout.split()
    assert out[0] == "refused" and out[-2:] == ["True", "1"]
    again = Spill(path)
    assert again.count == 1 and [e.message_id for e in again.read()] == ["a"]  # type: ignore[union-attr]
    assert path.stat().st_mode & 0o777 == 0o600


async def test_a_forget_takes_its_words_out_of_the_spill(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(tmp_path / "s.jsonl"))
    await d.handle(msg(GENERAL, "a0", "Alice", "alice before the lock", 0))
    with locked(engine.store.db.path):
        for i, who in enumerate(("Alice", "Bob", "Alice", "Bob")):
            assert await d.handle(msg(GENERAL, f"x{i}", who, f"vorpalgrin {who} {i}", i + 1))
    assert d.spill is not None and d.spill.count == 4
    await d.governance.forget_user("test", "w1", "alice", actor="cli")
    text = (tmp_path / "s.jsonl").read_text()
    assert "Alice" not in text and text.count("vorpalgrin Bob") == 2
    assert await d.replay_spill() == 2 and await live(engine) == ["x1", "x3"]


async def test_a_platform_deletion_takes_its_words_out_of_the_spill(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    """Messages found deleted on the platform (reconciliation) and a deleted channel leave
    the spill too, not only the store."""
    from speakermem.memory.governance.deletions import PlatformDeletions
    from speakermem.memory.governance.policy import Receipt

    other = Scope(platform="test", workspace="w1", channel="other")
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(tmp_path / "s.jsonl"))
    with locked(engine.store.db.path):
        for i in range(3):
            assert await d.handle(msg(GENERAL, f"g{i}", "Ann", f"snarkleberry general {i}", i))
        assert await d.handle(msg(other, "o1", "Ann", "snarkleberry other channel", 5))
    assert d.spill is not None and d.spill.count == 4
    deletions = PlatformDeletions(d.governance)
    await deletions.forget_messages(GENERAL, ["g1"], Receipt(action="t"), reason="reconcile")
    text = (tmp_path / "s.jsonl").read_text()
    assert "general 1" not in text and "general 0" in text and "general 2" in text
    await deletions.channel_deleted(other, actor="platform")
    assert "other channel" not in (tmp_path / "s.jsonl").read_text()
    assert await d.replay_spill() == 2 and await live(engine) == ["g0", "g2"]


async def test_a_redelivered_forgotten_message_gets_no_copy_in_the_spill(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    """While events wait in the spill, a new one goes behind them; a redelivery (catch-up,
    a retried event) of a forgotten person's message, or of a forgotten message, is turned
    away there too instead of waiting in the spill with its words."""
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(tmp_path / "s.jsonl"))
    await d.handle(msg(GENERAL, "a0", "Alice", "frobnitzel alice stored", 0))
    await d.handle(msg(GENERAL, "b0", "Bob", "frobnitzel bob stored", 1))
    await d.governance.forget_user("test", "w1", "alice", actor="cli")
    await d.governance.forget_message(GENERAL, "b0", actor="cli")
    with locked(engine.store.db.path):
        assert await d.handle(msg(GENERAL, "b1", "Bob", "bob while locked", 2))
    assert d.spill is not None and d.spill.count == 1
    for event in (
        msg(GENERAL, "a0", "Alice", "frobnitzel alice stored", 0),
        msg(GENERAL, "a9", "Alice", "frobnitzel alice new", 3),
        msg(GENERAL, "b0", "Bob", "frobnitzel bob stored", 1),
    ):
        assert await d.handle(event)  # accounted for: turned away
    assert "frobnitzel" not in (tmp_path / "s.jsonl").read_text() and d.spill.count == 1
    assert d.stats.ignored["forgotten"] == 1 and d.stats.ignored["duplicate"] == 2


async def test_a_message_deleted_before_it_was_stored_gets_no_copy_in_the_spill(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    """A delete that arrives while its message still waits in the spill takes the words out
    and leaves an early tombstone; the message's redelivery (catch-up) finds it and is not
    kept in the spill again."""
    from speakermem.bot.events import DeleteEvent

    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(tmp_path / "s.jsonl"))
    with locked(engine.store.db.path):
        assert await d.handle(msg(GENERAL, "k1", "Ann", "kept while locked", 0))
        assert await d.handle(msg(GENERAL, "k2", "Ann", "glimmerwort soon deleted", 1))
    assert await d.handle(DeleteEvent(scope=GENERAL, message_id="k2"))
    assert d.spill is not None and "glimmerwort" not in (tmp_path / "s.jsonl").read_text()
    assert await d.handle(msg(GENERAL, "k2", "Ann", "glimmerwort soon deleted", 1))
    assert "glimmerwort" not in (tmp_path / "s.jsonl").read_text()
    assert d.stats.ignored["deleted"] == 1
    assert await d.replay_spill() == 1 and await live(engine) == ["k1"]


async def test_the_cli_forget_clears_the_running_bots_spill(
    engine: MemoryEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spill_path = tmp_path / "speakermem.bot.spill.jsonl"
    d = Dispatcher(engine, RecallPipeline(engine), spill=Spill(spill_path))
    await d.handle(msg(GENERAL, "a0", "Alice", "known to the store", 0))
    with locked(engine.store.db.path):
        await d.handle(msg(GENERAL, "a1", "Alice", "quillfort secret", 1))
        await d.handle(msg(GENERAL, "b1", "Bob", "bob's words", 2))
    monkeypatch.setenv("SPEAKERMEM_SPILL_PATH", str(spill_path))
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    code = await asyncio.to_thread(
        main, ["--db", str(engine.store.db.path), "forget", "user", "alice", "--yes"]
    )
    assert code == 0
    assert "quillfort" not in spill_path.read_text() and "bob's words" in spill_path.read_text()
    assert await d.replay_spill() == 1 and await live(engine) == ["b1"]


async def test_a_partial_forget_is_recorded_and_resumed_until_complete(
    engine: MemoryEngine,
) -> None:
    from speakermem.memory.governance.service import ForgetIncomplete

    gov = Governance(engine)
    await engine.ingest_many(
        [msg(GENERAL, "a1", "Alice", "zorblatt here", 0), msg(GENERAL, "b1", "Bob", "hi", 1)]
    )
    failures = [OSError(28, "No space left on device")]

    async def spill_on_a_full_disk(forgotten: object) -> None:
        if failures:
            raise failures.pop()

    gov.forget_hooks.append(spill_on_a_full_disk)
    with pytest.raises(ForgetIncomplete) as failed:
        await gov.forget_user("test", "w1", "alice", actor="cli")
    assert "did not complete" in str(failed.value) and not failed.value.receipt.complete
    assert "INCOMPLETE" in failed.value.receipt.summary()
    status = await gov.status("test", "w1")
    assert [j["action"] for j in status["forgets_incomplete"]] == ["forget-user"]
    (entry,) = await gov.audit(5)
    assert entry["args"] == {"complete": False}
    assert await live(engine) == ["a1", "b1"]  # the cascade had not run yet

    # the scheduler's housekeeping run resumes it
    scheduler = WriterScheduler(engine, None, idle_seconds=60, governance=gov)
    await scheduler._retention()
    assert await live(engine) == ["b1"]
    assert (await gov.status("test", "w1"))["forgets_incomplete"] == []
    done = (await gov.audit(5))[0]
    assert done["action"] == "forget-user" and done["args"]["resumed"] > 0
    assert "complete" not in done["args"] and done["receipt"]["messages"] == 1


async def test_a_failed_retention_run_is_retried_soon_with_backoff(
    engine: MemoryEngine,
) -> None:
    gov = Governance(engine)
    await engine.ingest(msg(GENERAL, "old", "Ann", "an old line", 0))  # 2024: long expired
    await gov.set_retention("test", "w1", None, 30, actor="test")
    scheduler = WriterScheduler(
        engine, None, idle_seconds=60, governance=gov, retention_retry_s=0.2
    )
    scheduler.start()
    try:
        with locked(engine.store.db.path):
            deadline = time.monotonic() + 10
            while scheduler.retention_failures == 0:
                assert time.monotonic() < deadline, "the first retention run never failed"
                await asyncio.sleep(0.05)
        failed_at = time.monotonic()
        while await live(engine):
            assert time.monotonic() - failed_at < 5, "retention was not retried soon"
            await asyncio.sleep(0.05)
    finally:
        await scheduler.shutdown()
    assert scheduler.runs["retention"] >= 2 and scheduler.retention_failures == 0


def test_doctor_warns_when_the_spill_shares_the_databases_disk(tmp_path: Path) -> None:
    from speakermem.integrations.doctor import spill_check

    beside = Settings(_env_file=None, db_path=tmp_path / "x.db")  # type: ignore[call-arg]
    check = spill_check(beside)
    assert check.status == "warn" and "SPEAKERMEM_SPILL_PATH" in (check.fix or "")
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem here")
    elsewhere = Settings(  # type: ignore[call-arg]
        _env_file=None, db_path=tmp_path / "x.db", spill_path=other / f"spill-{os.getpid()}"
    )
    assert spill_check(elsewhere).status == "ok"
