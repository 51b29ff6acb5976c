"""Asking where people talk on Slack, end to end: real slack-bolt fed signed Events API
requests, the Web API stand-in, a real store and RecallPipeline (no LLM).

A mention is answered in its thread with permalink citations, and a question in a thread
is about that thread first; a direct message is answered from every channel the asker can
read (named in the answer), private ones only while Slack lists their members; refusals go
to the asker only; and no direct message is ever stored."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.rate_limit import PerMinuteLimiter
from tests.dm_checks import assert_not_stored
from tests.standins.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID
from tests.test_slack_adapter import (
    GENERAL,
    PERMALINK,
    PRIVATE,
    Rig,
    _rig,
    message,
    seed,
    ts,
)

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

DM = "D0ALICE"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r, close = await _rig(tmp_path)
    yield r
    await close()


def mention(channel: str, user: str, text: str, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "app_mention",
        "channel": channel,
        "user": user,
        "text": f"<@{BOT_USER_ID}> {text}",
        "ts": ts(n),
        "event_ts": ts(n),
        "team": TEAM_ID,
        **extra,
    }


def direct(user: str, text: str, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": DM,
        "channel_type": "im",
        "user": user,
        "text": text,
        "ts": ts(n),
        "event_ts": ts(n),
        "team": TEAM_ID,
        **extra,
    }


def posted(rig: Rig) -> list[dict[str, Any]]:
    """What the bot posted, less the one-time memory notice of each channel."""
    return [p for p in rig.standin.posted if not str(p.get("text", "")).startswith("Heads-up")]


def blocks_of(post: dict[str, Any]) -> list[dict[str, Any]]:
    raw = post["blocks"]
    return json.loads(raw) if isinstance(raw, str) else raw


def cited_links(post: dict[str, Any]) -> list[tuple[str, str]]:
    return PERMALINK.findall(json.dumps(blocks_of(post)))


async def test_a_mention_is_answered_in_a_thread_under_it_with_citations(rig: Rig) -> None:
    await seed(rig)
    assert await rig.event(mention(GENERAL, "U1", "when is the trip to Lisbon?", 20), 20) == 200
    [answer] = posted(rig)
    assert answer["channel"] == GENERAL and answer["thread_ts"] == ts(20)
    assert not answer.get("ephemeral")
    links = cited_links(answer)
    assert links and {c for c, _ in links} == {GENERAL}  # the private channel stays out
    assert "Lisbon" in json.dumps(blocks_of(answer))
    assert rig.adapter.stats["mention_answered"] == 1


async def test_a_mention_in_a_thread_answers_there_from_that_thread_first(rig: Rig) -> None:
    await seed(rig)
    parent = message(GENERAL, "U2", "Thread for the offsite venue", 10)
    replies = [
        message(GENERAL, "U1", "The barn works for everyone", 11, thread_ts=ts(10)),
        message(GENERAL, "U3", "Barn it is then, booked", 12, thread_ts=ts(10)),
    ]
    for n, event in enumerate([parent, *replies], start=10):
        assert await rig.event(event, n) == 200
    # Slack sends the mention twice: as the channel message (stored) and as app_mention
    said = message(GENERAL, "U1", f"<@{BOT_USER_ID}> what did we decide?", 13, thread_ts=ts(10))
    assert await rig.event(said, 13) == 200
    question = mention(GENERAL, "U1", "what did we decide?", 13, thread_ts=ts(10))
    assert await rig.event(question, 14) == 200
    [answer] = posted(rig)
    assert answer["thread_ts"] == ts(10)
    thread = {ts(n).replace(".", "") for n in (10, 11, 12)}
    links = cited_links(answer)
    assert links and links[0][1] in thread, links  # the thread's messages answer first
    assert ts(13).replace(".", "") not in {t for _, t in links}  # never the question itself


async def test_a_mention_by_someone_who_cannot_read_the_channel_is_refused_to_them_only(
    rig: Rig,
) -> None:
    await seed(rig)
    assert await rig.event(mention(PRIVATE, "U2", "what is the code word?", 20), 20) == 200
    [refusal] = posted(rig)
    assert refusal.get("ephemeral") and refusal["user"] == "U2"
    assert refusal["thread_ts"] == ts(20)
    assert "pineapple" not in json.dumps(refusal) and not cited_links(refusal)


async def test_a_mention_in_a_private_channel_slack_will_not_list_is_refused(rig: Rig) -> None:
    await seed(rig)
    rig.standin.fail("conversations.members", times=5)
    assert await rig.event(mention(PRIVATE, "U1", "what is the code word?", 20), 20) == 200
    [refusal] = posted(rig)
    assert refusal.get("ephemeral") and "cannot check who is in" in json.dumps(refusal)
    assert "pineapple" not in json.dumps(refusal) and not cited_links(refusal)


async def test_mentions_are_rate_limited_per_member(rig: Rig) -> None:
    await seed(rig)
    rig.dispatcher.asks = PerMinuteLimiter(1)
    await rig.event(mention(GENERAL, "U1", "when is the trip to Lisbon?", 20), 20)
    await rig.event(mention(GENERAL, "U1", "and lunch?", 21), 21)
    await rig.event(mention(GENERAL, "U3", "when is the trip to Lisbon?", 22), 22)
    first, second, third = posted(rig)
    assert cited_links(first) and cited_links(third)
    assert second.get("ephemeral") and "wait" in json.dumps(blocks_of(second))


async def test_recalled_text_is_escaped_in_a_mentions_answer(rig: Rig) -> None:
    evil = message(GENERAL, "U2", "Lisbon <!channel> see <https://evil.example|bank>", 1)
    assert await rig.event(evil, 1) == 200
    await rig.event(mention(GENERAL, "U1", "what about Lisbon?", 2), 2)
    [answer] = posted(rig)
    raw = json.dumps(blocks_of(answer)) + answer["text"]
    assert "<!channel>" not in raw and "<https://evil" not in raw
    assert "&lt;!channel&gt;" in raw


async def test_a_direct_message_answers_from_every_readable_channel_and_is_never_stored(
    rig: Rig,
) -> None:
    await seed(rig)
    before = await rig.counts()
    question = "what is the zanzibar plan for Lisbon and the launch code word?"
    assert await rig.event(direct("U1", question, 30), 30) == 200
    [answer] = posted(rig)
    assert answer["channel"] == DM and "thread_ts" not in answer
    raw = json.dumps(blocks_of(answer))
    assert f"<#{GENERAL}>" in raw and f"<#{PRIVATE}>" in raw  # it names where it looked
    assert {c for c, _ in cited_links(answer)} == {GENERAL, PRIVATE}  # only U1 sees this
    # the bot's own reply in the DM comes back as an event, and asks nothing
    own = direct(BOT_USER_ID, "an answer", 31, bot_id=BOT_ID)
    assert await rig.event(own, 31) == 200
    assert len(posted(rig)) == 1
    assert await rig.counts() == before
    await assert_not_stored(rig.engine, "slack", TEAM_ID, "U1", "zanzibar", DM)


async def test_a_direct_message_leaves_out_a_private_channel_slack_will_not_list(
    rig: Rig,
) -> None:
    await seed(rig)
    rig.standin.fail("conversations.members", times=5)
    await rig.event(direct("U1", "what about the Lisbon launch code word?", 30), 30)
    [answer] = posted(rig)
    raw = json.dumps(blocks_of(answer))
    assert f"<#{GENERAL}>" in raw and f"<#{PRIVATE}>" not in raw
    assert "pineapple" not in raw and {c for c, _ in cited_links(answer)} <= {GENERAL}
    assert rig.adapter.stats["dm_roster_unavailable"] >= 1


async def test_a_direct_message_from_someone_in_no_channel_is_refused(rig: Rig) -> None:
    await seed(rig)
    await rig.event(direct("U4", "zanzibar Lisbon?", 30), 30)
    [answer] = posted(rig)
    assert "no channel you can read" in json.dumps(blocks_of(answer))
    assert not cited_links(answer)
    await assert_not_stored(rig.engine, "slack", TEAM_ID, "U4", "zanzibar", DM)


async def test_edits_and_deletions_in_a_direct_message_are_not_stored_either(rig: Rig) -> None:
    await seed(rig)
    before = await rig.counts()
    edit = {
        "type": "message",
        "subtype": "message_changed",
        "channel": DM,
        "channel_type": "im",
        "message": {"type": "message", "user": "U1", "text": "zanzibar edited", "ts": ts(30)},
        "previous_message": {"type": "message", "user": "U1", "text": "x", "ts": ts(30)},
        "ts": ts(31),
        "event_ts": ts(31),
    }
    assert await rig.event(edit, 31) == 200
    untyped = {**direct("U1", "zanzibar again", 32)}
    untyped.pop("channel_type")  # a D… channel is a direct message even without the type
    assert await rig.event(untyped, 32) == 200
    assert await rig.counts() == before
    assert len(posted(rig)) == 1  # the edit asked nothing; the new message did
    assert not re.search("zanzibar", json.dumps(await rig.engine.stats(), default=str))
    await assert_not_stored(rig.engine, "slack", TEAM_ID, "U1", "zanzibar", DM)


async def test_with_ephemeral_answers_a_mention_is_answered_to_the_asker_only(rig: Rig) -> None:
    await seed(rig)
    rig.adapter.settings.recall_ephemeral = True
    await rig.event(mention(GENERAL, "U1", "when is the trip to Lisbon?", 20), 20)
    [answer] = posted(rig)
    assert answer.get("ephemeral") and answer["user"] == "U1" and cited_links(answer)
