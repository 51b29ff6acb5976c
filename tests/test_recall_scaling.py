"""SPEAKERMEM_RECALL_PROCESSES=auto: the decision from cores and load, and the Recaller that
moves recalls into real spawned recall processes while the bot is busy and back after."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from speakermem.bot.settings import Settings
from speakermem.integrations.recall_scaling import (
    AUTO_IDLE_S,
    AUTO_MAX,
    AUTO_START_RATE,
    AUTO_STOP_RATE,
    AutoRecallProcesses,
    Load,
    auto_processes,
)
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.query.pipeline import RecallRequest
from tests.test_recall_processes import TEAM, CountingPipeline, bot_settings, engine

__all__ = ["engine"]  # the fixture, shared with test_recall_processes


def test_the_decision_from_cores_and_load() -> None:
    busy, calm = AUTO_START_RATE, AUTO_STOP_RATE / 2
    # one core: never (a process would only compete with the bot for it)
    assert auto_processes(Load(cores=1, rate=10 * busy, running=0, quiet_s=0)) == 0
    # busy: as many as the cores allow, up to the cap
    assert auto_processes(Load(cores=2, rate=busy, running=0, quiet_s=0)) == 2
    assert auto_processes(Load(cores=64, rate=busy, running=0, quiet_s=0)) == AUTO_MAX
    # between the thresholds, or quiet for less than the idle time: whatever runs
    assert auto_processes(Load(cores=4, rate=busy / 2, running=0, quiet_s=0)) == 0
    assert auto_processes(Load(cores=4, rate=busy / 2, running=2, quiet_s=0)) == 2
    assert auto_processes(Load(cores=4, rate=calm, running=2, quiet_s=AUTO_IDLE_S - 1)) == 2
    # quiet long enough: back in the bot
    assert auto_processes(Load(cores=4, rate=calm, running=2, quiet_s=AUTO_IDLE_S)) == 0


def test_the_setting_takes_auto_or_a_count() -> None:
    assert Settings(_env_file=None).recall_processes == "auto"  # type: ignore[call-arg]
    assert Settings(_env_file=None, recall_processes="0").recall_processes == 0  # type: ignore[call-arg]
    assert Settings(_env_file=None, recall_processes="3").recall_processes == 3  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(_env_file=None, recall_processes="many")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(_env_file=None, recall_processes="17")  # type: ignore[call-arg]


async def test_busy_moves_recalls_to_processes_and_quiet_brings_them_back(
    engine: MemoryEngine, tmp_path: Path
) -> None:
    stored = [0]
    fallback = CountingPipeline(engine)
    auto = AutoRecallProcesses(
        bot_settings(tmp_path),
        engine,
        fallback=fallback,
        stored=lambda: stored[0],
        cores=2,
    )
    request = RecallRequest("When is the budget review?", TEAM)
    try:
        # quiet: the bot answers itself, nothing starts
        assert await auto.tick(now=0.0) == 0
        stored[0] = 5
        assert await auto.tick(now=1.0) == 0
        await auto.run(request)
        assert fallback.calls == 1 and auto.processes is None
        # busy (100 messages a second): two recall processes start; meanwhile the bot answers
        stored[0] = 105
        assert await auto.tick(now=2.0) == 2
        assert auto._changing is not None
        await auto._changing
        assert auto.processes is not None and len(auto.processes.pids) == 2
        result = await auto.run(request)
        assert fallback.calls == 1  # answered by a child
        assert "Thursday" in result.answer.text
        # the traffic stops; after the idle time the processes stop and the bot answers again
        assert await auto.tick(now=10.0) == 2
        assert await auto.tick(now=20.0) == 2
        assert await auto.tick(now=20.0 + AUTO_IDLE_S) == 0
        await auto._changing
        assert auto.processes is None and auto.started == 1
        await auto.run(request)
        assert fallback.calls == 2
    finally:
        await auto.stop()
    assert auto.processes is None


async def test_one_core_keeps_recall_in_the_bot(engine: MemoryEngine, tmp_path: Path) -> None:
    stored = [0]
    fallback = CountingPipeline(engine)
    auto = AutoRecallProcesses(
        bot_settings(tmp_path),
        engine,
        fallback=fallback,
        stored=lambda: stored[0],
        cores=1,
    )
    try:
        await auto.tick(now=0.0)
        stored[0] = 10_000
        assert await auto.tick(now=1.0) == 0
        assert auto._changing is None and auto.processes is None
    finally:
        await auto.stop()
