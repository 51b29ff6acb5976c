"""/recall through the Discord adapter and its pure parts (split from test_discord_adapter.py,
whose stand-in gateway fixtures it shares)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import discord
import discord.gateway
import discord.http
import pytest

from speakermem.integrations.discord.adapter import (
    GuildState,
)
from speakermem.integrations.discord.render import (
    DESCRIPTION_LIMIT,
    FIELD_LIMIT,
    FIELD_VALUE_LIMIT,
    TOTAL_LIMIT,
    render_embed,
)
from speakermem.memory.config import RecallConfig
from speakermem.memory.query.answer import Citation, RecallAnswer
from speakermem.memory.query.pipeline import RecallPipeline
from tests.standins.discord_guild import (
    BOT_ID,
    GENERAL,
    GUILD_ID,
    OWNER_ID,
    ROLE_MEMBERS,
    SECRET,
    THREAD,
    default_guild,
)
from tests.test_discord_adapter import (
    ALICE,
    BOB,
    Bot,
    ShardedStandIn,
    bot,  # noqa: F401
    post,
    scope,
    start_bot,
)

pytestmark = pytest.mark.contract


# --- /recall ------------------------------------------------------------------------------------


def linked_ids(embed: dict[str, Any]) -> set[tuple[str, str]]:
    """(channel, message) of every jump link in the embed."""
    text = embed.get("description", "") + "".join(f["value"] for f in embed.get("fields", []))
    return set(re.findall(rf"https://discord\.com/channels/{GUILD_ID}/(\d+)/(\d+)", text))


@pytest.mark.e2e
async def test_recall_defers_then_follows_up_with_jump_links(bot: Bot):  # noqa: F811
    budget = await post(bot, "the cabin budget is 300 euros per person")
    mountains = await post(bot, "I prefer the mountains anyway", author_index=2)
    assert (await bot.stored(GENERAL, mountains)).speaker_name == "bob"
    thread_msg = await post(bot, "cabin budget confirmed by the host", channel_id=THREAD)

    embed = await bot.recall("what is the cabin budget?")
    assert bot.adapter.stats["interaction_rebuilt"] == 0  # the raw payload was used
    assert bot.standin.interaction_callbacks[0]["type"] == 5  # deferred first
    assert not (bot.standin.interaction_callbacks[0].get("data") or {}).get("flags")
    assert embed["title"] == "what is the cabin budget?"
    assert (GENERAL, budget) in linked_ids(embed)
    assert (THREAD, thread_msg) in linked_ids(embed)  # thread messages jump into the thread
    assert re.search(
        rf"\[\[\d+\]\]\(https://discord\.com/channels/{GUILD_ID}/", embed["description"]
    )
    assert embed["fields"][0]["name"] == "Sources"
    assert "Ally" in embed["fields"][0]["value"] and "#general" in embed["fields"][0]["value"]


@pytest.mark.e2e
@pytest.mark.parametrize("recall_scope", ["channel", "workspace"])
async def test_recall_never_cites_a_channel_the_asker_cannot_read(bot: Bot, recall_scope: str):  # noqa: F811
    bot.dispatcher.pipeline = RecallPipeline(bot.engine, config=RecallConfig(scope=recall_scope))
    secret = await post(
        bot, "the surprise party budget is 900 euros", author_index=2, channel_id=SECRET
    )
    await post(bot, "what budget? no idea about any party", author_index=2)

    embed = await bot.recall("what is the surprise party budget?", member_index=1)
    assert all(channel != SECRET for channel, _ in linked_ids(embed))
    assert "900" not in str(embed)

    # bob can read #secret, and asking there finds it…
    embed = await bot.recall(
        "what is the surprise party budget?", member_index=2, channel_id=SECRET
    )
    assert (SECRET, secret) in linked_ids(embed)
    # …but a private channel's memory never answers in another channel
    embed = await bot.recall("what is the surprise party budget?", member_index=2)
    assert all(channel != SECRET for channel, _ in linked_ids(embed))


class _Forgetful(dict):  # type: ignore[type-arg]
    def __setitem__(self, key: Any, value: Any) -> None:
        pass


@pytest.mark.e2e
async def test_recall_without_the_raw_payload_rebuilds_it_from_the_interaction(bot: Bot):  # noqa: F811
    bot.adapter.intake.interactions = _Forgetful()  # type: ignore[assignment]
    secret = await post(bot, "the vault code is 4321", author_index=2, channel_id=SECRET)
    embed = await bot.recall("what is the vault code?", member_index=2, channel_id=SECRET)
    assert bot.adapter.stats["interaction_rebuilt"] == 1
    assert (SECRET, secret) in linked_ids(embed)  # bob's role came through
    embed = await bot.recall("what is the vault code?", member_index=1, channel_id=SECRET)
    assert not linked_ids(embed) and bot.standin.interaction_callbacks[-1]["data"]["flags"] & 64


@pytest.mark.e2e
async def test_recall_where_the_asker_cannot_read_is_refused_privately(bot: Bot):  # noqa: F811
    await post(bot, "the secret code is swordfish", author_index=2, channel_id=SECRET)
    embed = await bot.recall("what is the secret code?", member_index=1, channel_id=SECRET)
    assert bot.standin.interaction_callbacks[-1]["data"]["flags"] & 64  # ephemeral
    assert "swordfish" not in str(embed) and not linked_ids(embed)
    assert "cannot read" in embed["description"]


@pytest.mark.e2e
async def test_recall_ephemeral_setting(tmp_path: Path):
    b, close = await start_bot(tmp_path, recall_ephemeral=True)
    try:
        await b.recall("anything?")
        assert b.standin.interaction_callbacks[-1]["data"]["flags"] & 64
        assert b.standin.followups[-1]["flags"] & 64
    finally:
        await close()


@pytest.mark.e2e
async def test_sharded_client(tmp_path: Path):
    b, close = await start_bot(tmp_path, standin_cls=ShardedStandIn, discord_shard_count=1)
    try:
        assert isinstance(b.adapter.client, discord.AutoShardedClient)
        assert b.standin.identify is not None and b.standin.identify["shard"] == [0, 1]
        assert await b.roster(SECRET) == {OWNER_ID, BOB, BOT_ID}
        mid = await post(b, "sharded hello")
        assert await b.stored(GENERAL, mid) is not None
    finally:
        await close()


# --- pure parts ---------------------------------------------------------------------------------


def test_guild_state_permissions():
    state = GuildState.from_guild_create(default_guild())
    assert set(state.text_channels()) == {GENERAL, SECRET}
    assert state.readable(ALICE) == (GENERAL,)
    assert set(state.readable(BOB)) == {GENERAL, SECRET}
    assert set(state.readable(ALICE, roles=[ROLE_MEMBERS])) == {GENERAL, SECRET}
    assert state.parents() == {THREAD: GENERAL}
    assert state.is_private(SECRET) and not state.is_private(GENERAL)
    assert state.complete


def _citation(n: int, channel: str = GENERAL, speaker: str = "Ally") -> Citation:
    return Citation(
        n=n,
        scope=scope(channel),
        message_id=str(800000000000000000 + n),
        speaker=speaker,
        time=datetime(2024, 3, 1, 9, 30, tzinfo=UTC),
    )


def _size(embed: dict[str, Any]) -> int:
    fields = embed.get("fields", [])
    return (
        len(embed.get("title", ""))
        + len(embed.get("description", ""))
        + sum(len(f["name"]) + len(f["value"]) for f in fields)
        + len(embed.get("footer", {}).get("text", ""))
    )


def test_render_links_markers_and_lists_sources():
    answer = RecallAnswer(
        text="Here is what I found:\n• Ally: “budget 300” [1][2]\n• [9] is unknown",
        citations=[_citation(1), _citation(2, speaker="b*o*b")],
    )
    embed: dict[str, Any] = render_embed(
        answer, {2: "https://example.invalid/2"}, channel_names={GENERAL: "general"}
    )
    url1 = f"https://discord.com/channels/{GUILD_ID}/{GENERAL}/800000000000000001"
    assert f"[[1]]({url1})[[2]](https://example.invalid/2)" in embed["description"]
    assert "\\[9\\]" in embed["description"]
    value = embed["fields"][0]["value"]
    assert value.splitlines()[0].startswith(f"[[1]]({url1}) Ally · #general · 2024-03-01 09:30")
    assert "b\\*o\\*b" in value
    assert discord.Embed.from_dict(embed).description == embed["description"]


def test_render_escapes_links_people_wrote():
    answer = RecallAnswer(text="“[free nitro](https://evil.invalid)” [1]", citations=[_citation(1)])
    embed: dict[str, Any] = render_embed(answer)
    assert "](https://evil.invalid)" not in embed["description"].replace("\\]", "")
    assert "\\[free nitro\\](https://evil.invalid)" in embed["description"]


def test_render_respects_discord_limits():
    citations = [_citation(n, speaker="x" * 200) for n in range(1, 200)]
    text = " ".join(f"word{i} [{(i % 199) + 1}]" for i in range(3000))
    embed: dict[str, Any] = render_embed(
        RecallAnswer(text=text, citations=citations), question="q" * 1000
    )
    assert len(embed["title"]) <= 256
    assert len(embed["description"]) <= DESCRIPTION_LIMIT
    assert len(embed["fields"]) <= FIELD_LIMIT
    assert all(len(f["value"]) <= FIELD_VALUE_LIMIT for f in embed["fields"])
    assert _size(embed) <= TOTAL_LIMIT
    assert embed["fields"][-1]["value"].endswith("more")
    # a cut never leaves half a link behind
    assert not re.search(r"\]\([^)]*$", embed["description"])
    discord.Embed.from_dict(embed)


def test_render_cut_never_leaves_a_dangling_escape():
    for pad in ("", "x"):
        embed: dict[str, Any] = render_embed(RecallAnswer(text=pad + "[" * 5000))
        body = embed["description"].removesuffix("…")
        assert len(embed["description"]) <= DESCRIPTION_LIMIT
        assert (len(body) - len(body.rstrip("\\"))) % 2 == 0


def test_render_refusal_and_empty_answers():
    embed = render_embed(RecallAnswer(text="Sorry: you cannot read x.", refused=True))
    assert embed["color"] == 0xED4245 and "fields" not in embed and "footer" not in embed
    assert render_embed(RecallAnswer(text=""))["description"] == "(no answer)"
