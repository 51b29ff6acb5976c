"""The payload rules and renderings of the new ways of asking, as pure functions: which
Discord messages ask the bot, and how a direct answer names the channels it searched on
Slack (channel links) and Discord (channel mentions inside the embed limits)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from speakermem.integrations.discord.ask_payloads import ask_of
from speakermem.integrations.discord.render import (
    FIELD_VALUE_LIMIT,
    SEARCHED,
    TOTAL_LIMIT,
    render_embed,
)
from speakermem.integrations.payload import PayloadError
from speakermem.integrations.slack.render import render_blocks, searched_line
from speakermem.memory.models import Scope
from speakermem.memory.query.answer import Citation, RecallAnswer

BOT = "900"


def create(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "1",
        "channel_id": "20",
        "guild_id": "10",
        "type": 0,
        "content": f"<@{BOT}> what?",
        "author": {"id": "5", "username": "ann"},
        "member": {"roles": ["77"]},
        "mentions": [{"id": BOT}],
    }
    base.update(extra)
    return base


def test_which_discord_messages_ask_the_bot() -> None:
    mention = ask_of(create(), bot_id=BOT, channel_parent={})
    assert mention is not None and mention.kind == "mention" and mention.roles == ("77",)
    assert mention.scope == Scope(platform="discord", workspace="10", channel="20")
    in_thread = ask_of(create(channel_id="21"), bot_id=BOT, channel_parent={"21": "20"})
    assert in_thread is not None and in_thread.thread_id == "21"
    assert in_thread.scope is not None and in_thread.scope.channel == "20"
    reply = ask_of(
        create(
            type=19,
            message_reference={"message_id": "0"},
            referenced_message={"id": "0", "content": "ship Friday"},
        ),
        bot_id=BOT,
        channel_parent={},
    )
    assert reply is not None and reply.kind == "reply" and reply.replied_id == "0"
    assert reply.replied_text == "ship Friday"
    dm = ask_of(create(guild_id=None, mentions=[]), bot_id=BOT, channel_parent={})
    assert dm is not None and dm.kind == "dm" and dm.scope is None
    for quiet in (
        create(mentions=[]),  # a channel message that does not mention the bot
        create(author={"id": "6", "bot": True}),  # bots never ask
        create(author={"id": BOT}),  # nor the bot itself
        create(webhook_id="3"),
        create(type=7),  # a join
        create(mentions=[{"id": BOT}], message_reference={"message_id": "0", "type": 1})
        | {
            "guild_id": None,
            "author": {"id": BOT},
        },
    ):
        assert ask_of(quiet, bot_id=BOT, channel_parent={}) is None
    assert ask_of(create(), bot_id=None, channel_parent={}) is None  # not ready: nothing
    with pytest.raises(PayloadError):
        ask_of(create(author="ann"), bot_id=BOT, channel_parent={})


def _answer(n: int) -> RecallAnswer:
    scope = Scope(platform="discord", workspace="10", channel="20")
    when = datetime(2024, 3, 1, tzinfo=UTC)
    return RecallAnswer(
        text="Friday [1].",
        citations=[
            Citation(n=i + 1, scope=scope, message_id=str(i), speaker="Ann", time=when)
            for i in range(n)
        ],
    )


def test_a_direct_answer_names_its_channels_within_discords_limits() -> None:
    many = [str(10**17 + i) for i in range(300)]
    embed = render_embed(_answer(40), searched=[*many, "not-an-id"])
    fields = embed["fields"]
    assert isinstance(fields, list) and fields[0]["name"] == SEARCHED
    value = fields[0]["value"]
    assert f"<#{many[0]}>" in value and "more" in value and "not-an-id" not in value
    assert len(value) <= FIELD_VALUE_LIMIT and fields[1]["name"] == "Sources"
    total = sum(len(str(f["name"])) + len(str(f["value"])) for f in fields)
    assert total + len(str(embed["description"])) + len(embed["footer"]["text"]) <= TOTAL_LIMIT  # type: ignore[index]
    refused = render_embed(RecallAnswer(text="no", refused=True), searched=many)
    assert "fields" not in refused


def test_a_direct_answer_names_its_channels_on_slack() -> None:
    line = searched_line(["C1", "C2", "C1", "<!channel>"])
    assert line == "Searched the channels you can read: <#C1>, <#C2>."
    assert "and 5 more" in searched_line([f"C{i}" for i in range(45)])
    blocks = render_blocks(_answer(1), {}, searched=["C1"])
    assert blocks[1]["type"] == "context" and "<#C1>" in str(blocks[1])
    assert "Searched" not in str(
        render_blocks(RecallAnswer(text="x", refused=True), {}, searched=["C1"])
    )
