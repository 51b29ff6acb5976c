"""SPEAKERMEM_DISCORD_SHARD_IDS: N processes each run their own range of the shards.

Against the sharded gateway stand-in (tests/standins/discord_shards.py), which serves one
connection per shard and routes each guild's events to its shard's connection by
Discord's rule ``(guild_id >> 22) % shard_count``: one process running two shards opens
two connections and stores from both; two processes given a shard each share one store
(both backends), each gets only its shards' guilds and catches up only their history; a
shard closed with a resumable code resumes alone, one that must identify anew catches up
its own guilds from history while the other shard stays connected. The settings' parsing
and errors last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import discord
import pytest
from pydantic import ValidationError

import speakermem.integrations.discord.adapter as adapter_module
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.settings import Settings, parse_shard_ids
from speakermem.integrations.discord.adapter import DiscordAdapter
from speakermem.integrations.discord.connection import make_client
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.discord_guild import member, user
from tests.standins.discord_shards import (
    ShardedGateway,
    general_of,
    guild_id_on,
    shard_of,
    sharded_guild,
)
from tests.test_discord_adapter import CARL, settings_for


@pytest.fixture
def no_identify_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """discord.py waits 5 s before each IDENTIFY after a client's first (Discord's default
    identify rate limit); the stand-in enforces none, so the tests skip the wait."""

    async def hook(self: discord.Client, shard_id: int | None, *, initial: bool = False) -> None:
        return None

    monkeypatch.setattr(discord.AutoShardedClient, "before_identify_hook", hook)


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polls the store
            await asyncio.sleep(0.02)


@dataclass
class Process:
    """One bot process: its own engine (on the shared store) and adapter."""

    engine: MemoryEngine
    adapter: DiscordAdapter

    async def stop(self) -> None:
        try:
            await self.adapter.stop()
        finally:
            await self.engine.close()


async def start_process(
    standin: ShardedGateway, tmp_path: Path, shard_ids: str | None, ready_timeout: float = 10.0
) -> Process:
    """A bot process on the store of `tmp_path` (the same one for every process of a test:
    the SQLite file, or the test's PostgreSQL database) running `shard_ids`."""
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    extra: dict[str, Any] = {"discord_shard_count": standin.shard_count}
    if shard_ids is not None:
        extra["discord_shard_ids"] = shard_ids
    adapter = DiscordAdapter(
        settings_for(standin, tmp_path, **extra),
        Dispatcher(engine, RecallPipeline(engine)),
        engine,
        guild_ready_timeout=0.05,
        ready_timeout=ready_timeout,
    )
    try:
        await adapter.start()
    except BaseException:
        await engine.close()
        raise
    assert isinstance(adapter.client, discord.AutoShardedClient)
    mine = adapter.client.shard_ids or range(standin.shard_count)
    await adapter.wait_processed(sum(len(standin.guilds_of(s)) for s in mine))  # GUILD_CREATEs
    return Process(engine, adapter)


@contextlib.asynccontextmanager
async def processes(
    standin: ShardedGateway, tmp_path: Path, *shard_ids: str | None
) -> AsyncIterator[list[Process]]:
    """Processes started in order and stopped in reverse (each restores the endpoints it
    found, so the last one started must stop first)."""
    async with contextlib.AsyncExitStack() as stack:
        started = []
        for ids in shard_ids:
            proc = await start_process(standin, tmp_path, ids)
            stack.push_async_callback(proc.stop)
            started.append(proc)
        yield started


async def stored(engine: MemoryEngine) -> list[tuple[str, str]]:
    """(guild, message id) of every stored Discord message, duplicates included."""
    rows = await engine.store.db.read(
        "SELECT c.workspace, m.message_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.platform = ?",
        ("discord",),
    )
    return [(str(r[0]), str(r[1])) for r in rows]


def member_post(standin: ShardedGateway, guild_id: str, text: str) -> dict[str, Any]:
    """A MESSAGE_CREATE by alice in `guild_id`'s #general."""
    m = standin.guilds[guild_id]["members"][1]
    return standin.message_create(
        text,
        author=m["user"],
        channel_id=general_of(guild_id),
        member={k: v for k, v in m.items() if k != "user"},
    )


def gateway(*guilds_per_shard: int) -> ShardedGateway:
    """A stand-in with `guilds_per_shard[s]` guilds on shard s."""
    count = len(guilds_per_shard)
    guilds = [
        sharded_guild(guild_id_on(s, count, n), f"guild {s}.{n}")
        for s, many in enumerate(guilds_per_shard)
        for n in range(many)
    ]
    return ShardedGateway(guilds, count)


def history_reads(standin: ShardedGateway) -> list[str]:
    """The channel of every catch-up history read (GET /channels/{id}/messages?after=), in
    order. Reconciliation's reads (``before=``) are tested in test_reconcile_discord.py."""
    return [channel for channel, query in standin.history_queries if "after" in query]


def on_shard(standin: ShardedGateway, shard: int) -> list[str]:
    return [g["id"] for g in standin.guilds_of(shard)]


# --- real connections, one per shard ------------------------------------------------------------


@pytest.mark.e2e
def test_stand_in_guilds_land_on_their_shards():
    standin = gateway(2, 1, 1)
    assert [shard_of(g, 3) for g in standin.guilds] == [0, 0, 1, 2]
    assert on_shard(standin, 1) == [guild_id_on(1, 3)]
    first = next(iter(standin.guilds.values()))
    general = general_of(first["id"])
    assert general in {c["id"] for c in first["channels"]}
    assert standin.channel_guild[general] == first["id"]


@pytest.mark.e2e
async def test_one_process_runs_two_shards_over_two_connections(
    tmp_path: Path, no_identify_wait: None
):
    standin = await gateway(1, 1).start()
    try:
        async with processes(standin, tmp_path, "0-1") as (proc,):
            assert sorted(standin.identified_shards) == [[0, 2], [1, 2]]
            first, second = standin.sessions[0].ws, standin.sessions[1].ws
            assert first is not None and second is not None and first is not second
            assert set(proc.adapter.guilds) == set(standin.guilds)
            assert await proc.adapter.connected()
            posted = [member_post(standin, gid, f"hello from {gid}") for gid in standin.guilds]
            for payload in posted:
                assert await standin.post(payload) == "live"

            async def both_in() -> bool:
                return len(await stored(proc.engine)) == 2

            await until(both_in)
            assert sorted(await stored(proc.engine)) == sorted(
                (p["guild_id"], p["id"]) for p in posted
            )
    finally:
        await standin.close()


@pytest.mark.e2e
@pytest.mark.contract
async def test_two_processes_each_get_their_shard_and_store_once(tmp_path: Path, backend: str):
    standin = await gateway(2, 1).start()
    try:
        async with processes(standin, tmp_path, "0", "1") as (zero, one):
            assert standin.identified_shards == [[0, 2], [1, 2]]
            assert set(zero.adapter.guilds) == set(on_shard(standin, 0))
            assert set(one.adapter.guilds) == set(on_shard(standin, 1))
            posted = [
                member_post(standin, gid, f"message {i} in {gid}")
                for i in range(10)
                for gid in standin.guilds
            ]
            for payload in posted:
                assert await standin.post(payload) == "live"

            async def all_in() -> bool:
                return len(await stored(zero.engine)) == len(posted)

            await until(all_in)
            rows = await stored(one.engine)  # the other process's engine, the same store
            assert sorted(rows) == sorted((p["guild_id"], p["id"]) for p in posted)
            assert len(set(rows)) == len(rows)
            # each process received (and stored) only its own shard's guilds' messages
            per_shard = {s: sum(shard_of(p["guild_id"], 2) == s for p in posted) for s in (0, 1)}
            assert zero.adapter.stats["MESSAGE_CREATE"] == per_shard[0] == 20
            assert one.adapter.stats["MESSAGE_CREATE"] == per_shard[1] == 10
    finally:
        await standin.close()


@pytest.mark.e2e
@pytest.mark.contract
async def test_each_process_catches_up_only_its_shards_guilds(tmp_path: Path, backend: str):
    standin = await gateway(1, 2).start()
    try:
        async with processes(standin, tmp_path, "0", "1") as (zero, _one):
            seen = [member_post(standin, gid, f"seen in {gid}") for gid in standin.guilds]
            for payload in seen:
                assert await standin.post(payload) == "live"

            async def seen_in() -> bool:
                return len(await stored(zero.engine)) == len(seen)

            await until(seen_in)
        # both processes are down; every guild gets a message only channel history has
        away = {
            gid: standin.add_history(general_of(gid), f"while away, in {gid}", datetime.now(UTC))
            for gid in standin.guilds
        }
        gets: Counter[str] = Counter()
        for ids in ("0", "1"):
            async with processes(standin, tmp_path, ids) as (proc,):
                assert proc.adapter.catchup is not None
                await proc.adapter.catchup.wait()
                reads = Counter(history_reads(standin))
                assert set(reads - gets) == {general_of(g) for g in on_shard(standin, int(ids))}
                gets = reads
                rows = set(await stored(proc.engine))
        # each channel's history was read once, by the process running its guild's shard
        assert set(gets.values()) == {1}
        assert rows == {(p["guild_id"], p["id"]) for p in seen} | {
            (gid, m["id"]) for gid, m in away.items()
        }
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_a_dropped_shard_resumes_alone_while_the_other_stays_live(
    tmp_path: Path, no_identify_wait: None
):
    standin = await gateway(1, 1).start()
    try:
        async with processes(standin, tmp_path, "0-1") as (proc,):
            assert proc.adapter.catchup is not None
            runs = proc.adapter.catchup.runs
            (g0,), (g1,) = on_shard(standin, 0), on_shard(standin, 1)
            standin.accepting.clear()  # shard 0's reconnect waits until the test lets it in
            await standin.close_shard(0, 4000)  # resumable: discord.py RESUMEs the session

            async def down() -> bool:
                return not await proc.adapter.connected()

            await until(down)  # /healthz: one shard's socket is closed
            away = member_post(standin, g0, "while shard 0 is away")
            assert await standin.post(away) == "missed"
            carried = member_post(standin, g1, "shard 1 carries on")
            assert await standin.post(carried) == "live"

            async def carried_in() -> bool:
                return await stored(proc.engine) == [(g1, carried["id"])]

            await until(carried_in)  # stored while shard 0 is still down
            assert not standin.sessions[0].identified.is_set()
            standin.accepting.set()
            await asyncio.wait_for(standin.sessions[0].identified.wait(), 20)

            async def both_in() -> bool:
                return len(await stored(proc.engine)) == 2

            await until(both_in)
            assert (g0, away["id"]) in await stored(proc.engine)
            assert await proc.adapter.connected()
            zero, one = standin.sessions[0], standin.sessions[1]
            assert (zero.identifies, zero.resumes, zero.replayed) == (1, 1, 1)
            assert (one.identifies, one.resumes) == (1, 0)  # never dropped
            # the replay covered the gap: no catch-up pass, no history read
            assert proc.adapter.catchup.runs == runs
            assert history_reads(standin) == []
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_a_shard_that_cannot_resume_catches_up_from_history(
    tmp_path: Path, no_identify_wait: None
):
    standin = await gateway(1, 1).start()
    try:
        async with processes(standin, tmp_path, "0-1") as (proc,):
            assert proc.adapter.catchup is not None
            (g0,), (g1,) = on_shard(standin, 0), on_shard(standin, 1)
            before = [member_post(standin, g, f"before, in {g}") for g in (g0, g1)]
            for payload in before:  # where each channel stands: catch-up starts after it
                assert await standin.post(payload) == "live"

            async def before_in() -> bool:
                return len(await stored(proc.engine)) == len(before)

            await until(before_in)
            runs = proc.adapter.catchup.runs
            standin.resumable = False  # the RESUME gets INVALID_SESSION: shard 0 identifies anew
            await standin.close_shard(0, 4000)
            gap = [member_post(standin, g0, f"gap {i}") for i in range(3)]
            for payload in gap:
                assert await standin.post(payload) == "missed"
            await asyncio.wait_for(standin.sessions[0].identified.wait(), 20)
            assert standin.sessions[0].identifies == 2  # a new session: nothing replayed

            async def gap_in() -> bool:
                return len(await stored(proc.engine)) == len(before) + len(gap)

            await until(gap_in)  # only channel history has them
            await proc.adapter.catchup.wait()
            assert proc.adapter.catchup.runs == runs + 1
            assert sorted(await stored(proc.engine)) == sorted(
                (p["guild_id"], p["id"]) for p in before + gap
            )
            # shard 1 never dropped: only shard 0's channel history was read
            assert history_reads(standin) == [general_of(g0)]
            assert standin.sessions[1].identifies == 1
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_members_of_a_guild_are_asked_for_over_its_shards_connection(
    tmp_path: Path, no_identify_wait: None
):
    standin = gateway(1, 1)
    (g1,) = on_shard(standin, 1)
    standin.guilds[g1]["member_count"] += 1  # incomplete: asked for on first use
    carl = member(user(CARL, "carl"))
    standin.chunk_members = [*standin.guilds[g1]["members"], carl]
    await standin.start()
    try:
        async with processes(standin, tmp_path, "0-1") as (proc,):
            recall = standin.interaction(
                "recall",
                [{"name": "question", "type": 3, "value": "who planned the trip?"}],
                channel_id=general_of(g1),
            )
            recall["guild_id"] = recall["channel"]["guild_id"] = g1
            await standin.dispatch("INTERACTION_CREATE", recall)  # over shard 1's connection

            async def carl_in() -> bool:
                members = await proc.engine.members(
                    Scope(platform="discord", workspace=g1, channel=general_of(g1))
                )
                return CARL in {m.user_id for m in members}

            await until(carl_in)
            assert [str(r["guild_id"]) for r in standin.member_requests] == [g1]
            assert standin.member_request_shards == [1]
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_start_waits_for_the_identify_spacing_of_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # discord.py's default hook spaces IDENTIFYs 5 s apart; here 1 s, so three shards are
    # ready over 2 s after the first, past the 1.5 s ready timeout unless start() allows
    # for the spacing
    spacing = 1.0

    async def spaced(self: discord.Client, shard_id: int | None, *, initial: bool = False) -> None:
        if not initial:
            await asyncio.sleep(spacing)

    monkeypatch.setattr(discord.AutoShardedClient, "before_identify_hook", spaced)
    monkeypatch.setattr(adapter_module, "IDENTIFY_SPACING_S", spacing)
    standin = await gateway(1, 1, 1).start()
    try:
        proc = await start_process(standin, tmp_path, None, ready_timeout=1.5)
        try:
            assert [s for s, _ in sorted(standin.identified_shards)] == [0, 1, 2]
            assert set(proc.adapter.guilds) == set(standin.guilds)
        finally:
            await proc.stop()
    finally:
        await standin.close()


# --- the settings and the client they build ----------------------------------------------------


def settings(**extra: Any) -> Settings:
    return Settings(_env_file=None, **extra)  # type: ignore[call-arg]


def built_client(**extra: Any) -> discord.Client:
    """The client the adapter would connect (never connected here: nothing to close)."""
    return make_client(settings(**extra), guild_ready_timeout=2.0)


def test_range_builds_client_for_those_shards():
    # the client the adapter builds for a range out of a larger count (connections to two
    # shards of two are tested above)
    client = built_client(discord_shard_count=4, discord_shard_ids="1-2")
    assert isinstance(client, discord.AutoShardedClient)
    assert client.shard_ids == [1, 2] and client.shard_count == 4


def test_without_ids_the_client_runs_every_shard():
    client = built_client(discord_shard_count=3)
    assert isinstance(client, discord.AutoShardedClient)
    assert client.shard_ids is None and client.shard_count == 3


@pytest.mark.parametrize(
    ("text", "ids"),
    [("0-3", (0, 1, 2, 3)), ("0,2", (0, 2)), ("4, 0-1", (0, 1, 4)), ("2,2-3", (2, 3))],
)
def test_parse_shard_ids(text: str, ids: tuple[int, ...]):
    assert parse_shard_ids(text) == ids


def test_shard_ids_from_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_COUNT", "3")
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_IDS", "0,2")
    assert settings().discord_shard_ids == (0, 2)
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_IDS", "")
    assert settings().discord_shard_ids is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"discord_shard_count": 3, "discord_shard_ids": "3"}, "[3] outside 0-2"),
        ({"discord_shard_count": 4, "discord_shard_ids": "2-5"}, "[4, 5] outside 0-3"),
        ({"discord_shard_ids": "0-1"}, "needs SPEAKERMEM_DISCORD_SHARD_COUNT"),
        ({"discord_shard_count": 4, "discord_shard_ids": "a-b"}, "'a-b' in shard ids"),
        ({"discord_shard_count": 4, "discord_shard_ids": "3-1"}, "must be ascending"),
        ({"discord_shard_count": 4, "discord_shard_ids": "0,,1"}, "empty item"),
    ],
)
def test_invalid_shard_ids_are_readable(extra: dict[str, Any], message: str):
    with pytest.raises(ValidationError) as caught:
        settings(**extra)
    assert message in str(caught.value)
