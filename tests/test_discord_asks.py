"""Asking where people talk on Discord, end to end: the real discord.py client against the
gateway stand-in, a real store and RecallPipeline (no LLM).

A mention is answered as a reply with jump-link citations (in a thread, the thread's
messages first); a reply that mentions the bot asks about the replied message; a direct
message is answered from every channel the asker can read in the guilds they share with
the bot (named) and is never stored; the context menu answers ephemerally; and each way
in keeps /recall's access rule and the per-member limit."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.commands import ASK_ABOUT_MESSAGE
from speakermem.bot.rate_limit import PerMinuteLimiter
from speakermem.integrations.discord.adapter import build_intents
from speakermem.integrations.payload import MAX_TEXT_CHARS
from tests.dm_checks import assert_not_stored
from tests.standins.discord_guild import BOT_ID, DM_CHANNEL, GENERAL, GUILD_ID, SECRET, THREAD, user
from tests.test_discord_adapter import Bot, start_bot, until

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

MENTION = f"<@{BOT_ID}>"
JUMP = re.compile(r"https://discord\.com/channels/(\d+)/(\d+)/(\d+)")


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    b, close = await start_bot(tmp_path)
    try:
        yield b
    finally:
        await close()


def answers(bot: Bot) -> list[dict[str, Any]]:
    """Messages the bot sent with an embed (answers; not the memory notice)."""
    return [m for m in bot.standin.sent_messages if m.get("embeds")]


async def say(bot: Bot, text: str, *, member_index: int = 1, **kw: Any) -> dict[str, Any]:
    m = bot.standin.guild["members"][member_index]
    payload = bot.standin.message_create(text, author=m["user"], **kw)
    payload["member"] = {k: v for k, v in m.items() if k != "user"}
    before = bot.adapter.processed
    await bot.standin.post(payload)
    await bot.adapter.wait_processed(before + 1)
    return payload


async def ask(bot: Bot, text: str, **kw: Any) -> dict[str, Any]:
    """Mention the bot; return its answer (the sent message's embed and reference)."""
    before = len(answers(bot))
    bot_user = user(BOT_ID, "speakermem", bot=True)
    await say(bot, f"{MENTION} {text}", mentions=[bot_user, *kw.pop("mentions", [])], **kw)
    await until(lambda: len(answers(bot)) > before)
    return answers(bot)[-1]


def cited(sent: dict[str, Any]) -> list[tuple[str, str, str]]:
    return JUMP.findall(json.dumps(sent["embeds"]))


async def seed(bot: Bot) -> dict[str, dict[str, Any]]:
    out = {
        "trip": await say(bot, "The team trip to Lisbon is booked for May 3rd"),
        "lunch": await say(bot, "Lunch today is at the noodle place", member_index=2),
        "code": await say(
            bot, "The Lisbon launch code word is pineapple", channel_id=SECRET, member_index=2
        ),
        "t1": await say(bot, "Venue: the barn works for everyone", channel_id=THREAD),
        "t2": await say(bot, "Barn it is, booked", channel_id=THREAD, member_index=2),
    }
    return out


async def test_the_bot_asks_for_direct_messages() -> None:
    assert build_intents().dm_messages


async def test_a_mention_is_answered_as_a_reply_with_jump_links(bot: Bot) -> None:
    await seed(bot)
    sent = await ask(bot, "when is the trip to Lisbon?")
    assert sent["channel_id"] == GENERAL
    links = cited(sent)
    assert links and SECRET not in {c for _, c, _ in links}  # alice cannot read #secret
    assert "pineapple" not in json.dumps(sent)
    assert bot.adapter.stats["mention_answered"] == 1


async def test_a_mention_in_a_thread_answers_from_the_thread_first(bot: Bot) -> None:
    seeded = await seed(bot)
    sent = await ask(bot, "what did we decide?", channel_id=THREAD)
    assert sent["channel_id"] == THREAD
    first = cited(sent)[0]
    assert first[2] in {seeded["t1"]["id"], seeded["t2"]["id"]}


async def test_a_reply_that_mentions_the_bot_asks_about_the_replied_message(bot: Bot) -> None:
    seeded = await seed(bot)
    lunch = seeded["lunch"]
    sent = await ask(
        bot,
        "who said this?",
        message_reference={"message_id": lunch["id"], "channel_id": GENERAL},
        referenced_message={k: v for k, v in lunch.items() if k != "member"},
        type=19,
    )
    assert cited(sent)[0][2] == lunch["id"]
    assert bot.adapter.stats["reply_answered"] == 1


async def test_a_mention_where_the_asker_cannot_read_is_refused(bot: Bot) -> None:
    await seed(bot)
    sent = await ask(bot, "what is the code word?", channel_id=SECRET)
    assert not cited(sent) and "pineapple" not in json.dumps(sent)
    assert bot.adapter.stats["mention_refused"] == 1


async def test_mentions_are_rate_limited_per_member(bot: Bot) -> None:
    await seed(bot)
    bot.dispatcher.asks = PerMinuteLimiter(1)
    assert cited(await ask(bot, "when is the trip to Lisbon?"))
    limited = await ask(bot, "and lunch?")
    assert not cited(limited) and "wait" in json.dumps(limited)


async def test_a_direct_message_answers_from_every_readable_channel_and_is_not_stored(
    bot: Bot,
) -> None:
    await seed(bot)
    before = await bot.engine.store.messages.counts()
    dm = bot.standin.direct_message(
        "zanzibar: what is the Lisbon launch code word?", member_index=2
    )
    n = len(answers(bot))
    await bot.standin.post(dm)
    await until(lambda: len(answers(bot)) > n)
    sent = answers(bot)[-1]
    assert sent["channel_id"] == DM_CHANNEL
    raw = json.dumps(sent)
    assert f"<#{GENERAL}>" in raw and f"<#{SECRET}>" in raw  # bob reads both; it says so
    assert SECRET in {c for _, c, _ in cited(sent)}
    assert await bot.engine.store.messages.counts() == before
    await assert_not_stored(
        bot.engine, "discord", GUILD_ID, "700000000000000303", "zanzibar", DM_CHANNEL
    )


async def test_a_direct_message_reads_only_what_the_asker_may(bot: Bot) -> None:
    await seed(bot)
    dm = bot.standin.direct_message("zanzibar: the Lisbon launch code word?", member_index=1)
    n = len(answers(bot))
    await bot.standin.post(dm)
    await until(lambda: len(answers(bot)) > n)
    raw = json.dumps(answers(bot)[-1])
    assert f"<#{GENERAL}>" in raw and f"<#{SECRET}>" not in raw and "pineapple" not in raw
    stranger = bot.standin.direct_message("zanzibar?")
    stranger["author"] = user("700000000000000999", "stranger")
    await bot.standin.post(stranger)
    await until(lambda: len(answers(bot)) > n + 1)
    assert "no channel you can read" in json.dumps(answers(bot)[-1])
    await assert_not_stored(
        bot.engine, "discord", GUILD_ID, "700000000000000302", "zanzibar", DM_CHANNEL
    )


async def test_the_context_menu_answers_ephemerally_about_the_message(bot: Bot) -> None:
    seeded = await seed(bot)
    target = seeded["trip"]
    before = len(bot.standin.followups)
    await bot.standin.dispatch(
        "INTERACTION_CREATE", bot.standin.context_menu(ASK_ABOUT_MESSAGE, target)
    )
    await until(lambda: len(bot.standin.followups) > before)
    reply = bot.standin.followups[-1]
    assert reply["flags"] & 64  # ephemeral
    links = JUMP.findall(json.dumps(reply["embeds"]))
    assert links and links[0][2] == target["id"]
    # alice cannot read #secret: asking about a message there is refused
    secret = seeded["code"]
    await bot.standin.dispatch(
        "INTERACTION_CREATE", bot.standin.context_menu(ASK_ABOUT_MESSAGE, secret)
    )
    await until(lambda: len(bot.standin.followups) > before + 1)
    refused = bot.standin.followups[-1]
    assert refused["flags"] & 64 and "pineapple" not in json.dumps(refused)
    assert not JUMP.findall(json.dumps(refused["embeds"]))


async def test_a_malformed_question_is_skipped_and_the_message_still_stored(bot: Bot) -> None:
    await seed(bot)
    odd = await say(
        bot,
        f"{MENTION} what about this?",
        mentions=[user(BOT_ID, "speakermem", bot=True)],
        message_reference={"message_id": "1"},
        referenced_message={"id": "1", "content": "x" * (MAX_TEXT_CHARS + 1)},
    )
    assert bot.adapter.stats["malformed"] == 1
    assert await bot.stored(GENERAL, odd["id"]) is not None
    assert not answers(bot)


async def test_with_ephemeral_answers_a_mention_points_to_the_private_ways(tmp_path: Path) -> None:
    b, close = await start_bot(tmp_path, recall_ephemeral=True)
    try:
        await seed(b)
        sent = await ask(b, "when is the trip to Lisbon?")
        assert not cited(sent) and "Ask SpeakerMem about this" in json.dumps(sent)
    finally:
        await close()
