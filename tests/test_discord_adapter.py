"""The Discord adapter with the real discord.py client against the local gateway stand-in.

A real store, the real /recall pipeline (no LLM) and the real Dispatcher; only Discord
itself is replaced (tests/standins/discord_gateway.py). `render_embed` is unit-tested
at the end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import discord
import discord.gateway
import discord.http
import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.settings import Settings
from speakermem.integrations.discord.adapter import (
    DiscordAdapter,
    DiscordStartError,
    build_intents,
)
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import (
    BOT_ID,
    EVERYONE,
    GENERAL,
    GUILD_ID,
    HISTORY,
    OWNER_ID,
    ROLE_MEMBERS,
    SECRET,
    THREAD,
    VIEW,
    default_guild,
    member,
    user,
)

pytestmark = pytest.mark.contract

ALICE = "700000000000000302"  # no roles: cannot read #secret
BOB = "700000000000000303"  # role "members": can read #secret
CARL = "700000000000000304"


def scope(channel: str) -> Scope:
    return Scope(platform="discord", workspace=GUILD_ID, channel=channel)


@dataclass
class Bot:
    standin: DiscordStandIn
    engine: MemoryEngine
    dispatcher: Dispatcher
    adapter: DiscordAdapter

    async def send(self, event: str, data: Any) -> None:
        """Dispatch one gateway event and wait until the adapter has handled it."""
        before = self.adapter.processed
        await self.standin.dispatch(event, data)
        await self.adapter.wait_processed(before + 1)

    async def roster(self, channel: str) -> set[str]:
        return {m.user_id for m in await self.engine.members(scope(channel))}

    async def stored(self, channel: str, message_id: str) -> Any:
        return await self.engine.store.messages.get(scope(channel), message_id)

    async def recall(
        self, question: str, *, member_index: int = 1, channel_id: str = GENERAL
    ) -> dict[str, Any]:
        """Run /recall through the gateway; return the follow-up's first embed."""
        before = len(self.standin.followups)
        payload = self.standin.interaction(
            "recall",
            [{"name": "question", "type": 3, "value": question}],
            member_index=member_index,
            channel_id=channel_id,
        )
        await self.standin.dispatch("INTERACTION_CREATE", payload)
        await until(lambda: len(self.standin.followups) > before)
        return self.standin.followups[-1]["embeds"][0]


async def until(predicate: Callable[[], object], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the stand-in records; nothing to wait on
            await asyncio.sleep(0.01)


def settings_for(standin: DiscordStandIn, tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=tmp_path / "unused.db",
        embedder="none",
        discord_token="standin-token",
        discord_api_url=standin.api_base,
        discord_gateway_url=standin.gateway_url,
        **extra,
    )


class ShardedStandIn(DiscordStandIn):
    """READY for a sharded identify carries ``shard: [id, count]``."""

    async def _send_ready(self, ws: Any) -> None:
        send = ws.send_str

        async def with_shard(text: str) -> None:
            if '"t": "READY"' in text:
                payload = json.loads(text)
                payload["d"]["shard"] = (self.identify or {}).get("shard", [0, 1])
                text = json.dumps(payload)
            await send(text)

        ws.send_str = with_shard
        try:
            await super()._send_ready(ws)
        finally:
            ws.send_str = send


async def start_bot(
    tmp_path: Path,
    guild: dict[str, Any] | None = None,
    standin_cls: type[DiscordStandIn] = DiscordStandIn,
    **extra: Any,
) -> tuple[Bot, Callable[[], Any]]:
    standin = await standin_cls(guild).start()
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    dispatcher = Dispatcher(engine, RecallPipeline(engine))
    adapter = DiscordAdapter(
        settings_for(standin, tmp_path, **extra),
        dispatcher,
        engine,
        guild_ready_timeout=0.05,
        ready_timeout=5.0,
    )
    await adapter.start()
    await adapter.wait_processed(1)  # the GUILD_CREATE sent after READY

    async def close() -> None:
        await adapter.stop()
        await standin.close()
        await engine.close()

    return Bot(standin, engine, dispatcher, adapter), close


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    b, close = await start_bot(tmp_path)
    try:
        yield b
    finally:
        await close()


def message(standin: DiscordStandIn, text: str, **kw: Any) -> dict[str, Any]:
    return standin.message_create(text, **kw)


def member_event(uid: str, name: str, roles: list[str], **kw: Any) -> dict[str, Any]:
    return {**member(user(uid, name), roles=roles, **kw), "guild_id": GUILD_ID}


# --- connection, roster -------------------------------------------------------------------------


@pytest.mark.e2e
async def test_connects_with_the_intents_and_redirects_only_while_running(bot: Bot, tmp_path):
    assert bot.standin.identify is not None
    assert bot.standin.identify["intents"] == build_intents().value
    assert build_intents().members and build_intents().message_content
    assert bot.standin.api_base == discord.http.Route.BASE
    # no command sync on start: that is `speakermem discord-sync`
    assert not any(path.endswith("/commands") for _, path, _ in bot.standin.requests)
    await bot.adapter.stop()
    await bot.adapter.wait_closed()  # returns at once after stop()
    assert discord.http.Route.BASE == "https://discord.com/api/v10"
    assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == "wss://gateway.discord.gg/"


@pytest.mark.e2e
async def test_start_fails_cleanly_when_discord_is_unreachable(tmp_path: Path):
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            discord_token="t",
            discord_api_url="http://127.0.0.1:9/api/v10",
            discord_gateway_url="ws://127.0.0.1:9/gateway",
        )
        adapter = DiscordAdapter(
            settings, Dispatcher(engine, RecallPipeline(engine)), engine, ready_timeout=5.0
        )
        with pytest.raises(DiscordStartError, match="connection failed"):
            await adapter.start()
        assert discord.http.Route.BASE == "https://discord.com/api/v10"  # restored
        no_token = settings.model_copy(update={"discord_token": None})
        with pytest.raises(ValueError, match="SPEAKERMEM_DISCORD_TOKEN"):
            await DiscordAdapter(no_token, adapter.dispatcher, engine).start()
    finally:
        await engine.close()


@pytest.mark.e2e
async def test_guild_create_rosters_follow_channel_permissions(bot: Bot):
    assert await bot.roster(GENERAL) == {OWNER_ID, ALICE, BOB, BOT_ID}
    # #secret: @everyone denied, role "members" allowed, the owner sees everything
    assert await bot.roster(SECRET) == {OWNER_ID, BOB, BOT_ID}
    assert await bot.roster("700000000000000010") == set()  # the category is no channel
    channels = {str(c["scope"]): c for c in await bot.engine.store.channels.all()}
    assert channels[str(scope(GENERAL))]["name"] == "general"
    assert channels[str(scope(GENERAL))]["is_private"] is False
    assert channels[str(scope(SECRET))]["is_private"] is True
    names = {m.user_id: m.display_name for m in await bot.engine.members(scope(GENERAL))}
    assert names[ALICE] == "Ally"  # nick > global name > username


@pytest.mark.e2e
async def test_member_add_update_remove_keep_rosters_live(bot: Bot):
    await bot.send("GUILD_MEMBER_ADD", member_event(CARL, "carl", []))
    assert CARL in await bot.roster(GENERAL)
    assert CARL not in await bot.roster(SECRET)

    # a role that grants #secret → joins it; losing it → leaves it; a nick is a rename
    await bot.send("GUILD_MEMBER_UPDATE", member_event(CARL, "carl", [ROLE_MEMBERS]))
    assert CARL in await bot.roster(SECRET)
    await bot.send("GUILD_MEMBER_UPDATE", member_event(CARL, "carl", [], nick="Carlos"))
    assert CARL not in await bot.roster(SECRET)
    assert CARL in await bot.roster(GENERAL)
    assert await bot.engine.store.channels.find_user("discord", GUILD_ID, "Carlos") == [CARL]

    await bot.send("GUILD_MEMBER_REMOVE", {"guild_id": GUILD_ID, "user": user(CARL, "carl")})
    assert CARL not in await bot.roster(GENERAL)
    left = await bot.engine.members(scope(GENERAL), include_left=True)
    assert any(m.user_id == CARL and m.left_at is not None for m in left)


@pytest.mark.e2e
async def test_channel_overwrite_changes_recompute_the_roster(bot: Bot):
    general = next(c for c in bot.standin.guild["channels"] if c["id"] == GENERAL)
    locked = {
        **general,
        "permission_overwrites": [
            {"id": EVERYONE, "type": 0, "allow": "0", "deny": str(VIEW)},
            {"id": ROLE_MEMBERS, "type": 0, "allow": str(VIEW), "deny": "0"},
        ],
    }
    await bot.send("CHANNEL_UPDATE", locked)
    assert await bot.roster(GENERAL) == {OWNER_ID, BOB, BOT_ID}
    assert await bot.engine.store.channels.is_private(scope(GENERAL))
    await bot.send("CHANNEL_UPDATE", general)
    assert ALICE in await bot.roster(GENERAL)
    assert not await bot.engine.store.channels.is_private(scope(GENERAL))

    # a role's permissions change: @everyone loses VIEW_CHANNEL everywhere
    await bot.send(
        "GUILD_ROLE_UPDATE",
        {"guild_id": GUILD_ID, "role": {"id": EVERYONE, "permissions": str(HISTORY)}},
    )
    assert await bot.roster(GENERAL) == {OWNER_ID}
    assert await bot.roster(SECRET) == {OWNER_ID, BOB, BOT_ID}
    everyone = {"id": EVERYONE, "permissions": str(VIEW | HISTORY)}
    await bot.send("GUILD_ROLE_UPDATE", {"guild_id": GUILD_ID, "role": everyone})
    assert await bot.roster(GENERAL) == {OWNER_ID, ALICE, BOB, BOT_ID}

    new = {**general, "id": "700000000000000014", "name": "random", "position": 3}
    await bot.send("CHANNEL_CREATE", new)
    assert await bot.roster("700000000000000014") == {OWNER_ID, ALICE, BOB, BOT_ID}
    await bot.send("CHANNEL_DELETE", new)
    assert await bot.roster("700000000000000014") == set()


@pytest.mark.e2e
async def test_reconnect_reconciles_members_who_left_while_offline(tmp_path: Path):
    b, close = await start_bot(tmp_path)
    await close()
    guild = default_guild()
    guild["members"] = [m for m in guild["members"] if m["user"]["id"] != BOB]
    guild["member_count"] = len(guild["members"])
    b, close = await start_bot(tmp_path, guild)
    try:
        assert await b.roster(SECRET) == {OWNER_ID, BOT_ID}
        assert BOB not in await b.roster(GENERAL)
    finally:
        await close()


# --- messages -----------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_stop_drains_a_backlog_for_as_long_as_it_keeps_moving(bot: Bot):
    """A backlog longer than one drain window is applied in full on stop, not dropped."""
    real_many, real_one = bot.dispatcher.handle_many, bot.dispatcher.handle

    async def slow_many(events: Any) -> None:
        await asyncio.sleep(0.2)  # a slow disk: each transaction takes a while
        await real_many(events)

    async def slow_one(event: Any) -> None:
        await asyncio.sleep(0.2)
        await real_one(event)

    bot.dispatcher.handle_many = slow_many  # type: ignore[method-assign]
    bot.dispatcher.handle = slow_one  # type: ignore[method-assign]
    sent = []
    for i in range(8):  # an edit after each create ends its burst: 16 slow steps
        m = message(bot.standin, f"backlog note {i}")
        sent.append(m)
        await bot.standin.dispatch("MESSAGE_CREATE", m)
        edit = {**m, "content": f"backlog note {i} (edited)", "edited_timestamp": m["timestamp"]}
        await bot.standin.dispatch("MESSAGE_UPDATE", edit)
    await until(lambda: bot.adapter.processed + bot.adapter.intake.queue.qsize() >= 15)
    # 16 steps of 0.2 s (3.2 s) against windows of 1 s: the old fixed drain would have left
    # most of the backlog behind, while one step (a PostgreSQL commit on a loaded CI machine
    # beside the 0.2 s) stays well inside a window (0.3 s windows flaked there)
    await bot.adapter.stop(drain_timeout=1.0, drain_limit=20.0)
    for m in sent:
        stored = await bot.stored(GENERAL, m["id"])
        assert stored is not None and stored.text.endswith("(edited)")


@pytest.mark.e2e
async def test_stop_gives_up_on_a_backlog_that_does_not_move(bot: Bot):
    stuck = asyncio.Event()

    async def never(events: Any) -> None:
        await stuck.wait()

    bot.dispatcher.handle_many = never  # type: ignore[method-assign]
    for i in range(3):
        await bot.standin.dispatch("MESSAGE_CREATE", message(bot.standin, f"stuck {i}"))
    await until(lambda: bot.adapter.intake.queue.qsize() + bot.adapter.processed >= 1)
    started = asyncio.get_running_loop().time()
    await bot.adapter.stop(drain_timeout=0.3, drain_limit=20.0)
    assert asyncio.get_running_loop().time() - started < 5.0  # one window, not the limit
    stuck.set()


@pytest.mark.e2e
async def test_create_update_delete_change_the_store(bot: Bot):
    m = message(bot.standin, "we booked the cabin near the glacier")
    await bot.send("MESSAGE_CREATE", m)
    stored = await bot.stored(GENERAL, m["id"])
    assert stored is not None and stored.speaker_name == "Ally" and stored.thread_id is None

    edit = {**m, "content": "we booked the lodge by the lake", "edited_timestamp": m["timestamp"]}
    await bot.send("MESSAGE_UPDATE", edit)
    hits = await bot.engine.search("lodge lake", [scope(GENERAL)], mode="lexical")
    assert [h.message.message_id for h in hits] == [m["id"]]
    assert not await bot.engine.search("glacier", [scope(GENERAL)], mode="lexical")

    await bot.send("MESSAGE_DELETE", {"id": m["id"], "channel_id": GENERAL, "guild_id": GUILD_ID})
    assert (await bot.stored(GENERAL, m["id"])).deleted
    assert not await bot.engine.search("lodge", [scope(GENERAL)], mode="lexical")


@pytest.mark.e2e
async def test_edit_and_delete_of_messages_discord_py_never_saw(bot: Bot):
    # stored before this process (an import, an earlier run): not in any client cache
    old = MessageEvent(
        scope=scope(GENERAL),
        message_id="600000000000000001",
        speaker_id=BOB,
        speaker_name="bob",
        text="the ferry leaves at noon",
        ts=datetime(2024, 1, 2, tzinfo=UTC),
    )
    await bot.engine.ingest(old)
    partial = {
        "id": old.message_id,
        "channel_id": GENERAL,
        "guild_id": GUILD_ID,
        "content": "the ferry leaves at nine",
        "edited_timestamp": "2024-01-02T10:00:00+00:00",
    }
    await bot.send("MESSAGE_UPDATE", partial)
    assert (await bot.stored(GENERAL, old.message_id)).text == "the ferry leaves at nine"
    # an embed unfurl (no edited_timestamp) is not an edit
    await bot.send("MESSAGE_UPDATE", {**partial, "content": "x", "edited_timestamp": None})
    assert (await bot.stored(GENERAL, old.message_id)).text == "the ferry leaves at nine"
    await bot.send(
        "MESSAGE_DELETE_BULK",
        {"ids": [old.message_id], "channel_id": GENERAL, "guild_id": GUILD_ID},
    )
    assert (await bot.stored(GENERAL, old.message_id)).deleted


@pytest.mark.e2e
async def test_thread_messages_map_to_the_parent_channel(bot: Bot):
    m = message(bot.standin, "thread: we leave friday", channel_id=THREAD)
    await bot.send("MESSAGE_CREATE", m)
    stored = await bot.stored(GENERAL, m["id"])
    assert stored is not None and stored.thread_id == THREAD
    assert await bot.stored(THREAD, m["id"]) is None
    # a thread created later, and a private thread (whose readers are not modelled)
    new_thread = {**bot.standin.guild["threads"][0], "id": "700000000000000020"}
    private = {**new_thread, "id": "700000000000000021", "type": 12}
    await bot.send("THREAD_CREATE", new_thread)
    await bot.send("THREAD_CREATE", private)
    m2 = message(bot.standin, "later thread", channel_id="700000000000000020")
    m3 = message(bot.standin, "private thread words", channel_id="700000000000000021")
    await bot.send("MESSAGE_CREATE", m2)
    await bot.send("MESSAGE_CREATE", m3)
    assert (await bot.stored(GENERAL, m2["id"])).thread_id == "700000000000000020"
    assert await bot.stored(GENERAL, m3["id"]) is None
    assert bot.adapter.stats["private_thread_skipped"] == 1


@pytest.mark.e2e
async def test_bot_messages_are_not_stored(bot: Bot):
    own = message(bot.standin, "I am the bot", author=bot.standin.bot_user)
    other = message(bot.standin, "another bot", author=user("700000000000000999", "b", bot=True))
    hook = message(bot.standin, "webhook post", webhook_id="700000000000000998")
    for m in (own, other, hook):
        await bot.send("MESSAGE_CREATE", m)
        assert await bot.stored(GENERAL, m["id"]) is None
    assert bot.adapter.stats["bot_message_skipped"] == 3


@pytest.mark.e2e
async def test_malformed_payloads_are_skipped_and_the_client_keeps_going(bot: Bot):
    good = message(bot.standin, "still listening")
    no_author = {k: v for k, v in message(bot.standin, "x").items() if k != "author"}
    bad_types = [
        no_author,
        {**message(bot.standin, "x"), "content": 12345},
        {**message(bot.standin, "x"), "id": ["not", "an", "id"]},
        {**message(bot.standin, "x"), "timestamp": "yesterday"},
        {**message(bot.standin, "x"), "mentions": "everyone"},
        message(bot.standin, "y" * 50_000),  # longer than any platform allows
    ]
    for payload in bad_types:
        await bot.send("MESSAGE_CREATE", payload)
    await bot.send(
        "MESSAGE_UPDATE",
        {
            "id": "1",
            "channel_id": GENERAL,
            "content": ["x"],
            "guild_id": GUILD_ID,
            "edited_timestamp": "now",
        },
    )
    await bot.send("MESSAGE_DELETE", {"channel_id": GENERAL, "guild_id": GUILD_ID})
    await bot.send("GUILD_MEMBER_ADD", {"guild_id": GUILD_ID, "user": "carl"})
    await bot.send(
        "GUILD_MEMBER_UPDATE", {"guild_id": GUILD_ID, "user": {"id": CARL}, "roles": "admin"}
    )
    await bot.send(
        "CHANNEL_UPDATE",
        {
            "id": GENERAL,
            "guild_id": GUILD_ID,
            "type": 0,
            "permission_overwrites": [{"id": "1", "type": 7}],
        },
    )
    await bot.send("MESSAGE_CREATE", [1, 2, 3])
    assert bot.adapter.stats["malformed"] >= 11
    assert bot.adapter.client is not None and not bot.adapter.client.is_closed()
    await bot.send("MESSAGE_CREATE", good)
    assert (await bot.stored(GENERAL, good["id"])).text == "still listening"
    assert await bot.roster(GENERAL) == {OWNER_ID, ALICE, BOB, BOT_ID}  # unchanged


async def post(bot: Bot, text: str, *, author_index: int = 1, channel_id: str = GENERAL) -> str:
    m = bot.standin.guild["members"][author_index]
    member_fields = {k: v for k, v in m.items() if k != "user"}
    payload = message(
        bot.standin, text, author=m["user"], channel_id=channel_id, member=member_fields
    )
    await bot.send("MESSAGE_CREATE", payload)
    return str(payload["id"])
