"""Catch-up after downtime against the Discord stand-in: REST history, paged, rate-limited,
resumable; a gateway session that RESUMEs needs none, a new session catches up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.integrations.discord.adapter import DiscordAdapter
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import GENERAL, GUILD_ID
from tests.test_discord_adapter import settings_for

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

# two days back: the 300 messages' 50 minutes never reach today, so the progress line shows
# a full date whatever the time of day the test runs
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
CHANNEL = Scope(platform="discord", workspace=GUILD_ID, channel=GENERAL)


@dataclass
class Run:
    engine: MemoryEngine
    adapter: DiscordAdapter

    async def stop(self) -> None:
        await self.adapter.stop()
        await self.engine.close()


async def start(standin: DiscordStandIn, tmp_path: Path) -> Run:
    engine = await MemoryEngine.open(make_config(tmp_path))
    adapter = DiscordAdapter(
        settings_for(standin, tmp_path),
        Dispatcher(engine, RecallPipeline(engine)),
        engine,
        guild_ready_timeout=0.05,
        ready_timeout=10.0,
    )
    await adapter.start()
    return Run(engine, adapter)


async def message_ids(engine: MemoryEngine) -> list[str]:
    rows = await engine.store.db.read(
        "SELECT m.message_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.channel = ?",
        (GENERAL,),
    )
    return [r[0] for r in rows]


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.05)


def live(standin: DiscordStandIn, msg: dict[str, Any]) -> dict[str, Any]:
    return {**msg, "guild_id": GUILD_ID, "member": {"roles": [], "nick": None}}


RETRY_AFTER_S = 0.3
CLOCK_SLACK_S = 0.02
"""An event loop may wake a sleeper up to its clock resolution early."""


def waited_out(standin: DiscordStandIn, since: int) -> float:
    """Seconds between the first history GET after `since` (the one answered 429) and the
    next GET of that same page."""
    queries, times = standin.history_queries[since:], standin.history_times[since:]
    again = next(i for i in range(1, len(queries)) if queries[i] == queries[0])
    return times[again] - times[0]


async def test_300_messages_posted_while_down_are_stored_exactly_once(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        first = standin.add_history(GENERAL, "before the outage", T0)
        run = await start(standin, tmp_path)
        await standin.dispatch("MESSAGE_CREATE", live(standin, first))

        async def first_stored() -> bool:
            return len(await message_ids(run.engine)) == 1

        await until(first_stored)  # GUILD_CREATE and the message
        assert await message_ids(run.engine) == [first["id"]]
        await run.stop()

        # the bot is down: 300 messages arrive, history answers 429 once on the way
        posted = [
            standin.add_history(GENERAL, f"while down {i}", T0 + timedelta(seconds=10 * (i + 1)))
            for i in range(300)
        ]
        standin.history_rate_limits = [RETRY_AFTER_S]
        asked_before = len(standin.history_queries)
        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            ids = await message_ids(run.engine)
            assert len(ids) == 301 == len(set(ids))
            assert set(ids) == {first["id"], *(m["id"] for m in posted)}
            # paged with after=, 100 at a time, and the 429 was waited out, not skipped: the
            # refused page was asked again, Retry-After later
            gets = [r for r in standin.requests if r[0] == "GET" and r[1].endswith("/messages")]
            assert len(gets) >= 4
            assert waited_out(standin, asked_before) >= RETRY_AFTER_S - CLOCK_SLACK_S
            lines = run.adapter.catchup.lines()
            assert lines == [
                f"#general caught up to {T0 + timedelta(seconds=3000):%Y-%m-%d %H:%M}, 300 messages"
            ]
            cursor = (await run.engine.store.catchup.cursors("discord"))[0]
            assert cursor.finished and cursor.cursor_id == posted[-1]["id"]
            # a late gateway replay of one of them changes nothing
            before = run.adapter.processed
            await standin.dispatch("MESSAGE_CREATE", live(standin, posted[5]))
            await run.adapter.wait_processed(before + 1)
            assert len(await message_ids(run.engine)) == 301
        finally:
            await run.stop()
    finally:
        await standin.close()


def forward_pages(standin: DiscordStandIn) -> int:
    """History pages asked for with after= (catch-up's); reconciliation, which may still be
    reading backwards (before=) after the start-up pass, does not count."""
    return sum(1 for _, query in standin.history_queries if "after" in query)


async def test_resume_replays_and_new_session_catches_up(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        first = standin.add_history(GENERAL, "start", T0)
        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await standin.dispatch("MESSAGE_CREATE", live(standin, first))

            async def first_stored() -> bool:
                return len(await message_ids(run.engine)) == 1

            await until(first_stored)
            # the start-up catch-up counts as run when it starts: let it finish its pages
            # before counting the history requests a RESUME must not add to
            await run.adapter.catchup.wait()
            runs = run.adapter.catchup.runs

            # 1. the connection drops and the session RESUMEs: the gateway replays what was
            #    missed, so no history is fetched
            missed = standin.add_history(GENERAL, "missed, replayed", T0 + timedelta(minutes=1))
            pages_before = forward_pages(standin)
            standin.resumable = True
            await standin.close_gateway(4000)
            await asyncio.wait_for(standin.identified.wait(), 20)
            assert standin.resumes == 1
            before = run.adapter.processed
            await standin.dispatch("MESSAGE_CREATE", live(standin, missed))
            await run.adapter.wait_processed(before + 1)
            await asyncio.sleep(0.3)
            assert run.adapter.catchup.runs == runs
            assert forward_pages(standin) == pages_before

            # 2. it drops again and cannot resume: a new session, nothing replayed; catch-up
            gap = [
                standin.add_history(GENERAL, f"gap {i}", T0 + timedelta(minutes=2, seconds=i))
                for i in range(30)
            ]
            standin.resumable = False
            await standin.close_gateway(4000)

            async def all_in() -> bool:
                return len(await message_ids(run.engine)) == 32

            await until(all_in)
            await run.adapter.catchup.wait()
            assert run.adapter.catchup.runs == runs + 1
            ids = await message_ids(run.engine)
            assert len(ids) == len(set(ids)) == 32
            assert {m["id"] for m in gap} <= set(ids)
        finally:
            await run.stop()
    finally:
        await standin.close()
