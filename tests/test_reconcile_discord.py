"""Deletion on Discord, through the gateway stand-in: a thread deleted while the bot runs
(THREAD_DELETE) or while it is down, a deleted channel, a guild the bot leaves; and messages
deleted or edited while it was down, reconciled from channel history after the restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.governance_commands import render_status
from speakermem.integrations.discord.adapter import DiscordAdapter
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import GENERAL, GUILD_ID, SECRET, THREAD
from tests.test_discord_adapter import settings_for
from tests.test_governance_forget import fts_hits, table_scan

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

WORDS = ("zorblatt", "quixvane", "mervolin", "plimwick", "dravenox", "tessaloon")
KEPT = "jintrabe"
CHANNEL = Scope(platform="discord", workspace=GUILD_ID, channel=GENERAL)


@dataclass
class Run:
    engine: MemoryEngine
    adapter: DiscordAdapter

    async def stop(self) -> None:
        await self.adapter.stop()
        await self.engine.close()


async def start(standin: DiscordStandIn, tmp_path: Path, **settings: Any) -> Run:
    engine = await MemoryEngine.open(make_config(tmp_path), embedder=HashEmbedder())
    adapter = DiscordAdapter(
        settings_for(standin, tmp_path, **settings),
        Dispatcher(engine, RecallPipeline(engine)),
        engine,
        guild_ready_timeout=0.05,
        ready_timeout=10.0,
    )
    await adapter.start()
    return Run(engine, adapter)


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.05)


async def live_rows(engine: MemoryEngine) -> dict[str, tuple[str, str, str | None]]:
    """message id -> (channel, text, thread id) of every live message."""
    rows = await engine.store.db.read(
        "SELECT message_id, channel, text, thread_id FROM messages WHERE deleted_at IS NULL"
    )
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


async def post_and_store(run: Run, standin: DiscordStandIn, payloads: list[dict]) -> None:
    for payload in payloads:
        assert await standin.post(payload) == "live"
    ids = {p["id"] for p in payloads}

    async def stored() -> bool:
        return ids <= set(await live_rows(run.engine))

    await until(stored)
    await run.engine.embed_pending()


def thread_and_general(standin: DiscordStandIn) -> tuple[list[dict], dict]:
    """Six messages in the thread (one word of WORDS each) and one in #general."""
    thread = [
        standin.message_create(f"thread {i}: the {word} trip", channel_id=THREAD)
        for i, word in enumerate(WORDS)
    ]
    return thread, standin.message_create(f"general: the {KEPT} budget")


async def assert_forgotten(engine: MemoryEngine, ids: set[str], words: tuple[str, ...]) -> None:
    assert not ids & set(await live_rows(engine))
    for word in words:
        assert await fts_hits(engine, word) == [], word
        assert await table_scan(engine, word) == [], word
        dense = await engine.search(word, [CHANNEL], mode="dense", limit=50)
        assert not {h.message.message_id for h in dense} & ids, word


async def test_thread_delete_forgets_the_threads_six_messages(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        run = await start(standin, tmp_path)
        try:
            thread, general = thread_and_general(standin)
            await post_and_store(run, standin, [*thread, general])
            rows = await live_rows(run.engine)
            assert {rows[m["id"]] for m in thread} == {
                (GENERAL, m["content"], THREAD) for m in thread
            }
            before = run.adapter.processed
            await standin.dispatch(
                "THREAD_DELETE",
                {"id": THREAD, "guild_id": GUILD_ID, "parent_id": GENERAL, "type": 11},
            )
            await run.adapter.wait_processed(before + 1)
            await assert_forgotten(run.engine, {m["id"] for m in thread}, WORDS)
            assert (await live_rows(run.engine))[general["id"]][1] == general["content"]
            (entry,) = await Governance(run.engine).audit(5, platform="discord")
            assert entry["action"] == "platform-thread-delete" and entry["actor"] == "discord"
            assert entry["receipt"]["messages"] == 6
            assert entry["target"] == f"discord/{GUILD_ID}/{GENERAL}/{THREAD}"
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_a_thread_deleted_while_down_is_forgotten_after_the_restart(
    tmp_path: Path,
) -> None:
    standin = await DiscordStandIn().start()
    try:
        thread, general = thread_and_general(standin)
        run = await start(standin, tmp_path)
        try:
            await post_and_store(run, standin, [*thread, general])
        finally:
            await run.stop()
        standin.delete_channel(THREAD)  # its history is a 404 now; no event reached the bot

        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            await assert_forgotten(run.engine, {m["id"] for m in thread}, WORDS)
            assert (await live_rows(run.engine))[general["id"]][1] == general["content"]
            # the thread was read backwards from the outage: reconciliation's reads
            assert any(c == THREAD and "before" in q for c, q in standin.history_queries)
            status = await Governance(run.engine).status("discord", GUILD_ID)
            (rec,) = [e for e in status["catchup"] if e["kind"] == "reconcile"]
            assert rec["finished"] and rec["detail"]["threads_gone"] == 1
            assert rec["detail"]["deleted"] == 6
            assert "6 deleted, 1 thread(s) gone" in render_status(status).text
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_a_deleted_channel_is_forgotten_live_and_after_downtime(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        thread, general = thread_and_general(standin)
        secret = standin.message_create(f"secret: the {KEPT} plan", channel_id=SECRET)
        run = await start(standin, tmp_path)
        try:
            await post_and_store(run, standin, [*thread, general, secret])
            before = run.adapter.processed
            await standin.dispatch(
                "CHANNEL_DELETE",
                {"id": SECRET, "guild_id": GUILD_ID, "type": 0, "name": "secret", "position": 2},
            )
            await run.adapter.wait_processed(before + 1)
            assert secret["id"] not in await live_rows(run.engine)
            assert general["id"] in await live_rows(run.engine)
            gov = Governance(run.engine)
            (entry,) = await gov.audit(5, platform="discord")
            assert entry["action"] == "platform-channel-delete"
            assert entry["receipt"]["messages"] == 1
            # memory is off there: nothing more is stored or caught up in it
            assert not await gov.channel_enabled(CHANNEL.model_copy(update={"channel": SECRET}))
            assert await gov.channel_enabled(CHANNEL)
        finally:
            await run.stop()

        # #general is deleted while the bot is down, its thread with it
        standin.delete_channel(GENERAL)
        standin.delete_channel(THREAD)
        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            await assert_forgotten(
                run.engine, {general["id"], *(m["id"] for m in thread)}, (*WORDS, KEPT)
            )
            status = await Governance(run.engine).status("discord", GUILD_ID)
            rec = next(
                e
                for e in status["catchup"]
                if e["kind"] == "reconcile" and e["channel"].endswith(GENERAL)
            )
            assert rec["detail"]["channel_gone"]
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_leaving_a_guild_forgets_it_an_outage_does_not(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        run = await start(standin, tmp_path)
        try:
            thread, general = thread_and_general(standin)
            await post_and_store(run, standin, [*thread, general])
            before = run.adapter.processed
            await standin.dispatch("GUILD_DELETE", {"id": GUILD_ID, "unavailable": True})
            await run.adapter.wait_processed(before + 1)
            assert len(await live_rows(run.engine)) == 7  # an outage of the guild: kept

            await standin.dispatch("GUILD_DELETE", {"id": GUILD_ID})
            await run.adapter.wait_processed(before + 2)
            await assert_forgotten(
                run.engine, {general["id"], *(m["id"] for m in thread)}, (*WORDS, KEPT)
            )
            (entry,) = await Governance(run.engine).audit(5, platform="discord")
            assert entry["action"] == "platform-workspace-delete"
            assert entry["receipt"]["messages"] == 7
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_messages_deleted_and_edited_while_down_are_reconciled(tmp_path: Path) -> None:
    standin = await DiscordStandIn().start()
    try:
        thread, general = thread_and_general(standin)
        run = await start(standin, tmp_path)
        try:
            await post_and_store(run, standin, [*thread, general])
        finally:
            await run.stop()
        standin.delete_message(THREAD, thread[0]["id"])
        standin.delete_message(GENERAL, general["id"])
        standin.edit_message(THREAD, thread[1]["id"], "thread 1: the snorkwell trip")

        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            await assert_forgotten(run.engine, {thread[0]["id"], general["id"]}, (WORDS[0], KEPT))
            rows = await live_rows(run.engine)
            assert rows[thread[1]["id"]][1] == "thread 1: the snorkwell trip"
            assert await fts_hits(run.engine, WORDS[1]) == []
            assert rows[thread[2]["id"]][1] == thread[2]["content"]
            (entry,) = [
                e
                for e in await Governance(run.engine).audit(5, platform="discord")
                if e["action"] == "platform-reconcile"
            ]
            assert entry["receipt"]["messages"] == 2 and entry["receipt"]["messages_edited"] == 1
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_reconciliation_stops_at_its_budget_when_history_is_rate_limited(
    tmp_path: Path,
) -> None:
    """discord.py waits out 429s itself: the budget cuts such a wait off and status says
    what was left."""
    standin = await DiscordStandIn().start()
    try:
        thread, general = thread_and_general(standin)
        run = await start(standin, tmp_path)
        try:
            await post_and_store(run, standin, [*thread, general])
        finally:
            await run.stop()
        standin.delete_message(GENERAL, general["id"])
        # catch-up's read (forwards) goes through; reconciliation's first read (backwards)
        # is told to wait 30 s, which discord.py would sleep through
        standin.backward_rate_limits = {GENERAL: [30.0]}
        run = await start(standin, tmp_path, reconcile_budget_s=1.0)
        try:
            assert run.adapter.catchup is not None
            async with asyncio.timeout(15):  # not the 30 s: the budget cut the wait off
                await run.adapter.catchup.wait()
            assert general["id"] in await live_rows(run.engine)  # not checked this time
            status = await Governance(run.engine).status("discord", GUILD_ID)
            (rec,) = [e for e in status["catchup"] if e["kind"] == "reconcile"]
            assert not rec["finished"]
            assert rec["detail"]["checked"] == 0 and rec["detail"]["unchecked"] == 7
            assert rec["detail"]["stopped"] == "time budget spent (waiting on the platform)"
        finally:
            await run.stop()

        run = await start(standin, tmp_path)  # no limit now: the next start resumes
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            assert general["id"] not in await live_rows(run.engine)
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_a_pass_stopped_part_way_records_what_it_did_and_resumes(tmp_path: Path) -> None:
    """Shutdown while a pass waits on a rate limit: the deletion it already applied is in
    an audit receipt marked interrupted, and the next start finishes the window."""
    standin = await DiscordStandIn().start()
    try:
        thread, general = thread_and_general(standin)
        run = await start(standin, tmp_path)
        try:
            await post_and_store(run, standin, [*thread, general])
        finally:
            await run.stop()
        standin.delete_message(GENERAL, general["id"])
        standin.delete_message(THREAD, thread[0]["id"])
        standin.backward_rate_limits = {THREAD: [30.0]}  # the thread's read waits 30 s
        run = await start(standin, tmp_path, reconcile_budget_s=120.0)
        try:
            assert run.adapter.catchup is not None
            reconcile = run.adapter.catchup.catchup.reconcile
            assert reconcile is not None

            async def general_checked() -> bool:
                return general["id"] not in await live_rows(run.engine)

            await until(general_checked)  # #general's own page is done; the thread waits
            assert reconcile.running
        finally:
            await run.stop()  # cancels the pass in its wait
        engine = await MemoryEngine.open(make_config(tmp_path))
        try:
            (entry,) = [
                e
                for e in await Governance(engine).audit(5, platform="discord")
                if e["action"] == "platform-reconcile"
            ]
            assert entry["args"]["interrupted"] is True
            assert entry["receipt"]["messages"] == 1
            assert thread[0]["id"] in await live_rows(engine)  # not checked yet
            status = await Governance(engine).status("discord", GUILD_ID)
            (rec,) = [e for e in status["catchup"] if e["kind"] == "reconcile"]
            assert not rec["finished"]
            assert "reconciling," in render_status(status).text
        finally:
            await engine.close()

        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            assert thread[0]["id"] not in await live_rows(run.engine)
        finally:
            await run.stop()
    finally:
        await standin.close()
