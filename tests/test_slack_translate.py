"""Slack payload → event translation: the conventions and the malformed-payload policy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from speakermem.bot.events import (
    CommandInvocation,
    DeleteEvent,
    EditEvent,
    MessageEvent,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.integrations.payload import PayloadError
from speakermem.integrations.slack.translate import (
    SlackAsk,
    ask_of,
    deleted_channel,
    display_name,
    mentioned_users,
    translate_command,
    translate_event,
)

TEAM = "T0TEAM"
NAMES = {"U1": "ally", "U2": "bob"}


def body(event: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "event_callback", "team_id": TEAM, "event": event, **extra}


def msg(**fields: Any) -> dict[str, Any]:
    base = {
        "type": "message",
        "channel": "C1",
        "user": "U1",
        "text": "hi",
        "ts": "1700000000.000100",
    }
    base.update(fields)
    return base


def test_plain_message():
    ev = translate_event(body(msg(text="hello <@U2> and <@U3|carl>")), user_names=NAMES)
    assert isinstance(ev, MessageEvent)
    assert ev.scope == Scope(platform="slack", workspace=TEAM, channel="C1")
    assert ev.message_id == "1700000000.000100"
    assert ev.speaker_id == "U1" and ev.speaker_name == "ally"
    assert ev.ts == datetime(2023, 11, 14, 22, 13, 20, 100, tzinfo=UTC)
    assert ev.addressees == ("U2", "U3")
    assert ev.thread_id is None and ev.reply_to is None
    assert not ev.speaker_is_bot


def test_inner_event_and_explicit_team():
    ev = translate_event(msg(), team_id="T9", user_names={})
    assert isinstance(ev, MessageEvent)
    assert ev.scope.workspace == "T9"
    assert ev.speaker_name == "U1"  # unknown user: the id


def test_team_from_event_field_when_body_lacks_it():
    ev = translate_event(msg(team="T7"))
    assert ev is not None and ev.scope.workspace == "T7"


def test_missing_team_is_an_error():
    with pytest.raises(PayloadError, match="team"):
        translate_event(msg())


def test_thread_reply_sets_thread_and_addressee():
    ev = translate_event(
        body(
            msg(
                user="U2",
                ts="1700000100.000200",
                thread_ts="1700000000.000100",
                parent_user_id="U1",
                text="me too",
            )
        ),
        user_names=NAMES,
    )
    assert isinstance(ev, MessageEvent)
    assert ev.scope.channel == "C1"
    assert ev.thread_id == ev.reply_to == "1700000000.000100"
    assert ev.addressees == ("U1",)


def test_thread_parent_has_no_thread_id_and_self_is_not_addressee():
    parent = translate_event(body(msg(thread_ts="1700000000.000100", text="<@U1> note to self")))
    assert isinstance(parent, MessageEvent)
    assert parent.thread_id is None and parent.addressees == ()
    own_reply = translate_event(
        body(msg(ts="1700000001.000000", thread_ts="1700000000.000100", parent_user_id="U1"))
    )
    assert isinstance(own_reply, MessageEvent) and own_reply.addressees == ()


def test_thread_broadcast_is_a_message():
    ev = translate_event(
        body(msg(subtype="thread_broadcast", ts="1700000100.1", thread_ts="1700000000.000100"))
    )
    assert isinstance(ev, MessageEvent) and ev.thread_id == "1700000000.000100"


def test_user_profile_supplies_name():
    ev = translate_event(
        body(msg(user="U9", user_profile={"display_name": "", "real_name": "Nine Nines"}))
    )
    assert isinstance(ev, MessageEvent) and ev.speaker_name == "Nine Nines"


@pytest.mark.parametrize(
    "fields",
    [
        {"subtype": "bot_message", "user": None, "bot_id": "B1", "username": "deploy"},
        {"bot_id": "B1", "bot_profile": {"name": "helper"}},
    ],
)
def test_bot_messages_are_flagged(fields: dict[str, Any]):
    payload = msg(**fields)
    payload = {k: v for k, v in payload.items() if v is not None}
    ev = translate_event(body(payload))
    assert isinstance(ev, MessageEvent) and ev.speaker_is_bot
    assert ev.speaker_name in ("deploy", "ally", "U1", "helper")


def test_file_share_without_text_gets_a_placeholder():
    ev = translate_event(body(msg(subtype="file_share", text="", files=[{"title": "map.png"}])))
    assert isinstance(ev, MessageEvent) and ev.text == "[shared file: map.png]"


def test_message_changed_is_an_edit():
    ev = translate_event(
        body(
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": "C1",
                "hidden": True,
                "ts": "1700000500.000000",
                "message": {
                    "type": "message",
                    "user": "U1",
                    "text": "new text",
                    "ts": "1700000000.000100",
                    "edited": {"user": "U1", "ts": "1700000400.000000"},
                },
                "previous_message": {
                    "type": "message",
                    "text": "old text",
                    "ts": "1700000000.000100",
                },
            }
        )
    )
    assert isinstance(ev, EditEvent)
    assert ev.message_id == "1700000000.000100" and ev.text == "new text"
    assert ev.edited_at == datetime.fromtimestamp(1700000400, tz=UTC)


def test_message_changed_without_text_change_is_ignored():
    same = {"type": "message", "user": "U1", "text": "same", "ts": "1700000000.000100"}
    ev = translate_event(
        body(
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": "C1",
                "message": {**same, "attachments": [{"title": "unfurl"}]},
                "previous_message": same,
            }
        )
    )
    assert ev is None


def test_tombstone_is_a_delete():
    ev = translate_event(
        body(
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": "C1",
                "message": {
                    "type": "message",
                    "subtype": "tombstone",
                    "text": "This message was deleted.",
                    "ts": "1700000000.000100",
                    "user": "USLACKBOT",
                },
            }
        )
    )
    assert isinstance(ev, DeleteEvent) and ev.message_id == "1700000000.000100"


def test_message_deleted():
    ev = translate_event(
        body(
            {
                "type": "message",
                "subtype": "message_deleted",
                "channel": "C1",
                "deleted_ts": "1700000000.000100",
                "ts": "1700000600.000000",
            }
        )
    )
    assert ev == DeleteEvent(
        scope=Scope(platform="slack", workspace=TEAM, channel="C1"),
        message_id="1700000000.000100",
    )


@pytest.mark.parametrize(
    "subtype", ["channel_join", "channel_leave", "channel_topic", "pinned_item", "totally_new"]
)
def test_other_subtypes_are_ignored(subtype: str):
    assert translate_event(body(msg(subtype=subtype))) is None


def test_direct_messages_are_ignored():
    assert translate_event(body(msg(channel="D1", channel_type="im"))) is None
    ev = translate_event(body(msg(channel="G1", channel_type="mpim")))
    assert isinstance(ev, MessageEvent)


@pytest.mark.parametrize("kind", ["app_mention", "reaction_added", "team_join"])
def test_other_event_types_are_ignored(kind: str):
    assert translate_event(body({"type": kind, "user": "U1"})) is None


def test_member_joined_and_left():
    joined = translate_event(
        body(
            {
                "type": "member_joined_channel",
                "user": "U2",
                "channel": "C1",
                "channel_type": "C",
                "team": TEAM,
                "event_ts": "1700000700.000100",
            }
        ),
        user_names=NAMES,
    )
    assert isinstance(joined, RosterEvent)
    assert joined.action == RosterAction.JOIN and joined.name == "bob"
    assert joined.at == datetime.fromtimestamp(1700000700.0001, tz=UTC)
    left = translate_event(
        body({"type": "member_left_channel", "user": "U2", "channel": "C1", "team": TEAM})
    )
    assert isinstance(left, RosterEvent) and left.action == RosterAction.LEAVE
    assert left.scope.channel == "C1"


def test_user_change_is_a_workspace_rename():
    ev = translate_event(
        body(
            {
                "type": "user_change",
                "user": {
                    "id": "U1",
                    "team_id": TEAM,
                    "name": "alice",
                    "profile": {"display_name": "Ally B", "real_name": "Alice B"},
                },
            }
        )
    )
    assert isinstance(ev, RosterEvent)
    assert ev.action == RosterAction.RENAME and ev.name == "Ally B"
    assert ev.scope == Scope(platform="slack", workspace=TEAM, channel="*")


@pytest.mark.parametrize(
    "payload, match",
    [
        ("not a dict", "expected an object"),
        ({"event": "x"}, "'event' must be an object"),
        ({"event": {"type": 3}}, "'type' must be a string"),
        (body(msg(channel=None)), "'channel'"),
        (body(msg(ts=None)), "'ts'"),
        (body(msg(ts="yesterday")), "bad Slack timestamp"),
        (body(msg(user=None)), "neither 'user' nor 'bot_id'"),
        (body(msg(text=123)), "text must be a string"),
        (body(msg(text="x" * 40_001)), "limit is 40000"),
        (body(msg(text="bad \udcff bytes")), "not valid UTF-8"),
        (body(msg(subtype=5)), "subtype"),
        (body({"type": "message", "subtype": "message_changed", "channel": "C1"}), "message"),
        (body({"type": "message", "subtype": "message_deleted", "channel": "C1"}), "deleted_ts"),
        (body({"type": "member_joined_channel", "channel": "C1"}), "'user'"),
        (body({"type": "user_change", "user": "U1"}), "'user' must be an object"),
    ],
)
def test_malformed_payloads_raise(payload: Any, match: str):
    with pytest.raises(PayloadError, match=match):
        translate_event(payload)


def test_payload_error_is_a_value_error():
    assert issubclass(PayloadError, ValueError)


def test_text_at_the_limit_is_accepted():
    ev = translate_event(body(msg(text="x" * 40_000)))
    assert isinstance(ev, MessageEvent) and len(ev.text) == 40_000


def test_helpers():
    assert mentioned_users("<@U1> <@W2|x> <@U1> <#C1> <!here>") == ["U1", "W2"]
    assert display_name({"name": "n", "profile": {"display_name": " ", "real_name": "R"}}) == "R"
    assert display_name({"name": "n"}) == "n"
    assert display_name({}) is None


def command_form(**extra: str) -> dict[str, str]:
    form = {
        "command": "/recall",
        "text": "  where is the trip?  ",
        "user_id": "U1",
        "user_name": "alice",
        "channel_id": "C1",
        "team_id": TEAM,
        "response_url": "https://hooks.slack.invalid/commands/1/2/3",
        "trigger_id": "123.456.abc",
    }
    form.update(extra)
    return form


def test_translate_command():
    inv = translate_command(command_form())
    assert isinstance(inv, CommandInvocation)
    assert inv.command == "recall"
    assert inv.text == "where is the trip?"
    assert inv.user_id == "U1" and inv.user_name == "alice"
    assert inv.scope == Scope(platform="slack", workspace=TEAM, channel="C1")
    assert inv.options["response_url"] == "https://hooks.slack.invalid/commands/1/2/3"
    assert inv.options["trigger_id"] == "123.456.abc"


@pytest.mark.parametrize("missing", ["command", "user_id", "channel_id", "team_id"])
def test_translate_command_missing_fields(missing: str):
    form = command_form()
    del form[missing]
    with pytest.raises(PayloadError, match=missing):
        translate_command(form)


def test_translate_command_bad_text():
    with pytest.raises(PayloadError):
        translate_command(command_form(text="x" * 20_001))
    with pytest.raises(PayloadError, match="UTF-8"):
        translate_command(command_form(text="\ud800"))
    assert translate_command(command_form(text="")).text == ""


def test_deleted_channel_names_the_channel_of_channel_and_group_deleted():
    for kind in ("channel_deleted", "group_deleted"):
        body = {"team_id": TEAM, "event": {"type": kind, "channel": "C9"}}
        assert deleted_channel(body) == Scope(platform="slack", workspace=TEAM, channel="C9")
    assert deleted_channel({"team_id": TEAM, "event": {"type": "channel_archive"}}) is None
    assert deleted_channel({"team_id": TEAM, "event": {"type": "message", "text": "x"}}) is None
    with pytest.raises(PayloadError, match="channel"):
        deleted_channel({"team_id": TEAM, "event": {"type": "channel_deleted"}})


# ---- questions: mentions and direct messages (ask_of) ---------------------------------------


def _ask(event: dict[str, Any]) -> SlackAsk | None:
    return ask_of(body(event), bot_user_id="UBOT", bot_id="BBOT")


def test_a_mention_is_a_question_with_its_thread():
    mention = msg(type="app_mention", text="<@UBOT> what?", thread_ts="1700000000.000001")
    ask = _ask(mention)
    assert ask == SlackAsk(
        team=TEAM,
        channel="C1",
        user="U1",
        text="<@UBOT> what?",
        ts="1700000000.000100",
        thread_ts="1700000000.000001",
    )
    assert translate_event(body(mention)) is None  # never an event to store


def test_a_direct_message_is_a_question_and_never_an_event():
    for event in (msg(channel="D1", channel_type="im"), msg(channel="D1")):
        ask = _ask(event)
        assert ask is not None and ask.direct and ask.channel == "D1"
        assert translate_event(body(event)) is None
    # a mention inside a direct message is answered once, as the direct message
    assert _ask(msg(type="app_mention", channel="D1", channel_type="im")) is None


def test_what_asks_nothing():
    assert _ask(msg()) is None  # a channel message
    assert _ask(msg(channel="D1", channel_type="im", user="UBOT")) is None  # the bot itself
    assert _ask(msg(channel="D1", channel_type="im", bot_id="B9")) is None  # any bot
    assert _ask(msg(channel="D1", channel_type="im", subtype="message_changed")) is None
    assert _ask({"type": "user_change"}) is None
    with pytest.raises(PayloadError):
        _ask(msg(type="app_mention", ts="yesterday"))
    with pytest.raises(PayloadError):
        ask_of({"event": "nope"}, bot_user_id=None, bot_id=None)
