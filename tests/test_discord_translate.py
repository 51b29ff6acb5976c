"""Discord payload → event translation and the VIEW_CHANNEL permission computation."""

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
from speakermem.integrations.discord.translate import (
    ADMINISTRATOR,
    READ_CHANNEL,
    VIEW_CHANNEL,
    ChannelPerms,
    GuildPerms,
    Overwrite,
    can_read_channel,
    interaction_recall,
    member_add,
    member_remove,
    member_roles,
    member_update,
    message_create,
    message_delete,
    message_delete_bulk,
    message_update,
    perms_from_guild_create,
    readable_channels,
)
from speakermem.integrations.payload import PayloadError
from tests.standins.discord_guild import (
    CATEGORY,
    GENERAL,
    OWNER_ID,
    ROLE_ADMIN,
    ROLE_MEMBERS,
    SECRET,
    THREAD,
    default_guild,
)

G = "111"
PARENTS = {"555": "222"}


def author(uid: str = "10", **extra: Any) -> dict[str, Any]:
    return {"id": uid, "username": "alice", "global_name": "Alice", "discriminator": "0", **extra}


def create(**fields: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": "9001",
        "channel_id": "222",
        "guild_id": G,
        "type": 0,
        "content": "hello",
        "author": author(),
        "member": {"nick": "Ally", "roles": []},
        "timestamp": "2024-03-01T10:00:00.123000+00:00",
        "edited_timestamp": None,
        "mentions": [],
    }
    d.update(fields)
    return d


def test_message_create_basic():
    ev = message_create(create(), channel_parent=PARENTS)
    assert isinstance(ev, MessageEvent)
    assert ev.scope == Scope(platform="discord", workspace=G, channel="222")
    assert ev.message_id == "9001" and ev.speaker_id == "10"
    assert ev.speaker_name == "Ally"
    assert ev.ts == datetime(2024, 3, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert ev.thread_id is None and ev.reply_to is None and not ev.speaker_is_bot


@pytest.mark.parametrize(
    "member, user_extra, expected",
    [
        ({"nick": None}, {}, "Alice"),
        (None, {"global_name": None}, "alice"),
        ({"nick": "  "}, {"global_name": ""}, "alice"),
    ],
)
def test_display_name_precedence(member, user_extra, expected):
    d = create(author=author(**user_extra))
    if member is None:
        del d["member"]
    else:
        d["member"] = member
    ev = message_create(d)
    assert ev is not None and ev.speaker_name == expected


def test_message_in_thread_uses_parent_channel():
    ev = message_create(create(channel_id="555"), channel_parent=PARENTS)
    assert ev is not None
    assert ev.scope.channel == "222" and ev.thread_id == "555"


def test_unknown_thread_is_treated_as_a_channel():
    ev = message_create(create(channel_id="777"), channel_parent=PARENTS)
    assert ev is not None and ev.scope.channel == "777" and ev.thread_id is None


def test_reply_and_mentions_become_addressees():
    ev = message_create(
        create(
            type=19,
            mentions=[{"id": "20"}, {"id": "10"}, {"id": "20"}],
            message_reference={"message_id": "8000", "channel_id": "222", "guild_id": G},
            referenced_message={"id": "8000", "author": {"id": "30"}},
        )
    )
    assert ev is not None
    assert ev.reply_to == "8000"
    assert ev.addressees == ("20", "30")  # speaker (10) dropped, repeats dropped


def test_forward_is_not_a_reply():
    ev = message_create(create(message_reference={"type": 1, "message_id": "8000"}))
    assert ev is not None and ev.reply_to is None


def test_guild_id_from_argument_and_dm_ignored():
    d = create()
    del d["guild_id"]
    assert message_create(d) is None
    ev = message_create(d, guild_id="42")
    assert ev is not None and ev.scope.workspace == "42"


@pytest.mark.parametrize("kind", [7, 6, 18, 21, 46])
def test_system_messages_are_ignored(kind: int):
    assert message_create(create(type=kind)) is None


def test_bots_and_webhooks_are_flagged():
    ev = message_create(create(author=author(bot=True)))
    assert ev is not None and ev.speaker_is_bot
    ev = message_create(create(webhook_id="99"))
    assert ev is not None and ev.speaker_is_bot


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"id": None}, "'id'"),
        ({"channel_id": 3.5}, "'channel_id'"),
        ({"author": None}, "'author'"),
        ({"author": {"username": "x"}}, "'id'"),
        ({"timestamp": "not a time"}, "ISO 8601"),
        ({"timestamp": None}, "timestamp"),
        ({"content": 5}, "text must be a string"),
        ({"content": "x" * 40_001}, "limit"),
        ({"content": "\udc80"}, "UTF-8"),
        ({"type": "0"}, "type must be an integer"),
        ({"mentions": "everyone"}, "mentions"),
    ],
)
def test_message_create_malformed(fields: dict[str, Any], match: str):
    with pytest.raises(PayloadError, match=match):
        message_create(create(**fields))


def test_message_create_not_a_dict():
    with pytest.raises(PayloadError):
        message_create(["nope"])  # type: ignore[arg-type]


def test_message_update_edit():
    d = {
        "id": "9001",
        "channel_id": "555",
        "guild_id": G,
        "content": "edited",
        "edited_timestamp": "2024-03-01T11:00:00+00:00",
    }
    ev = message_update(d, channel_parent=PARENTS)
    assert isinstance(ev, EditEvent)
    assert ev.scope.channel == "222" and ev.text == "edited"
    assert ev.edited_at == datetime(2024, 3, 1, 11, tzinfo=UTC)


def test_message_update_non_edits_are_ignored():
    base = {"id": "9001", "channel_id": "222", "guild_id": G}
    assert message_update(base) is None  # embeds only: no content key
    assert message_update({**base, "content": "x", "edited_timestamp": None}) is None
    edit = {**base, "content": "x", "edited_timestamp": "2024-03-01T11:00:00Z"}
    assert message_update(edit, previous_content="x") is None
    assert message_update(edit, previous_content="y") is not None
    assert message_update({**edit, "guild_id": None}) is None


def test_message_update_malformed():
    with pytest.raises(PayloadError):
        message_update({"channel_id": "1", "content": "x"})
    with pytest.raises(PayloadError, match="limit"):
        message_update(
            {
                "id": "1",
                "channel_id": "1",
                "guild_id": G,
                "content": "x" * 40_001,
                "edited_timestamp": "2024-03-01T11:00:00Z",
            }
        )


def test_message_delete_and_bulk():
    ev = message_delete({"id": "9001", "channel_id": "555", "guild_id": G}, channel_parent=PARENTS)
    assert ev == DeleteEvent(
        scope=Scope(platform="discord", workspace=G, channel="222"), message_id="9001"
    )
    assert message_delete({"id": "9001", "channel_id": "1"}) is None
    with pytest.raises(PayloadError):
        message_delete({"channel_id": "1", "guild_id": G})
    bulk = message_delete_bulk({"ids": ["1", "2"], "channel_id": "222", "guild_id": G})
    assert [e.message_id for e in bulk] == ["1", "2"]
    with pytest.raises(PayloadError):
        message_delete_bulk({"ids": "1", "channel_id": "222", "guild_id": G})


def test_member_events():
    add = member_add(
        {
            "guild_id": G,
            "user": author("20", bot=True),
            "nick": None,
            "roles": [],
            "joined_at": "2024-01-02T00:00:00+00:00",
        }
    )
    assert isinstance(add, RosterEvent)
    assert add.action == RosterAction.JOIN and add.name == "Alice" and add.is_bot
    assert add.scope == Scope(platform="discord", workspace=G, channel="*")
    assert add.at == datetime(2024, 1, 2, tzinfo=UTC)
    gone = member_remove({"guild_id": G, "user": author("20")})
    assert gone.action == RosterAction.LEAVE and gone.name is None
    renamed = member_update({"guild_id": G, "user": author("20"), "nick": "Al", "roles": []})
    assert renamed.action == RosterAction.RENAME and renamed.name == "Al"
    with pytest.raises(PayloadError):
        member_add({"guild_id": G})
    with pytest.raises(PayloadError):
        member_update({"user": author("20")})


def interaction(**fields: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": "5000",
        "application_id": "4000",
        "type": 2,
        "token": "secret-token",
        "guild_id": G,
        "channel_id": "222",
        "channel": {"id": "222", "type": 0},
        "member": {"user": author(), "nick": "Ally", "roles": []},
        "data": {
            "id": "6000",
            "name": "recall",
            "type": 1,
            "options": [
                {"name": "question", "type": 3, "value": " where? "},
                {"name": "limit", "type": 4, "value": 5},
            ],
        },
    }
    d.update(fields)
    return d


def test_interaction_recall():
    inv = interaction_recall(interaction())
    assert isinstance(inv, CommandInvocation)
    assert inv.command == "recall" and inv.text == "where?"
    assert inv.user_id == "10" and inv.user_name == "Ally"
    assert inv.scope == Scope(platform="discord", workspace=G, channel="222")
    assert inv.options == {"interaction_id": "5000", "application_id": "4000", "limit": "5"}
    assert "secret-token" not in repr(inv)


def test_interaction_recall_in_thread():
    inv = interaction_recall(
        interaction(channel_id="555", channel={"id": "555", "type": 11, "parent_id": "222"})
    )
    assert inv is not None and inv.scope.channel == "222" and inv.options["thread_id"] == "555"
    inv = interaction_recall(interaction(channel_id="555", channel={}), channel_parent=PARENTS)
    assert inv is not None and inv.scope.channel == "222"


def test_interaction_recall_ignores_others():
    assert interaction_recall(interaction(type=3)) is None
    assert interaction_recall(interaction(data={"name": "other"})) is None
    assert interaction_recall(interaction(guild_id=None)) is None


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"data": None}, "'data'"),
        ({"id": None}, "'id'"),
        ({"member": None, "user": None}, "'user'"),
        ({"channel_id": None, "channel": {}}, "'id'"),
        ({"data": {"name": "recall", "options": {"question": "x"}}}, "options"),
        (
            {"data": {"name": "recall", "options": [{"name": "question", "value": "\ud800"}]}},
            "UTF-8",
        ),
    ],
)
def test_interaction_recall_malformed(fields: dict[str, Any], match: str):
    with pytest.raises(PayloadError, match=match):
        interaction_recall(interaction(**fields))


# --- permissions -------------------------------------------------------------------------------

ROLE_A, ROLE_B = "201", "202"
MEMBER = "301"


def guild(everyone: int = READ_CHANNEL, **roles: int) -> GuildPerms:
    return GuildPerms(
        guild_id=G,
        owner_id="999",
        roles={G: everyone, ROLE_A: roles.get("a", 0), ROLE_B: roles.get("b", 0)},
    )


def channel(*overwrites: Overwrite) -> ChannelPerms:
    return ChannelPerms(channel_id="222", overwrites=list(overwrites))


def deny_everyone() -> Overwrite:
    return Overwrite(id=G, type=0, deny=VIEW_CHANNEL)


def test_no_overwrites_uses_base_permissions():
    assert can_read_channel(set(), MEMBER, guild(), channel())
    assert not can_read_channel(set(), MEMBER, guild(everyone=0), channel())
    assert can_read_channel({ROLE_A}, MEMBER, guild(everyone=0, a=READ_CHANNEL), channel())


def test_everyone_denied_role_allowed():
    ch = channel(deny_everyone(), Overwrite(id=ROLE_A, type=0, allow=VIEW_CHANNEL))
    assert not can_read_channel(set(), MEMBER, guild(), ch)
    assert can_read_channel({ROLE_A}, MEMBER, guild(), ch)


def test_role_allow_beats_another_role_deny():
    ch = channel(
        Overwrite(id=ROLE_A, type=0, deny=VIEW_CHANNEL),
        Overwrite(id=ROLE_B, type=0, allow=VIEW_CHANNEL),
    )
    assert can_read_channel({ROLE_A, ROLE_B}, MEMBER, guild(), ch)
    assert not can_read_channel({ROLE_A}, MEMBER, guild(), ch)


def test_member_overwrite_deny_beats_role_allow():
    ch = channel(
        deny_everyone(),
        Overwrite(id=ROLE_A, type=0, allow=VIEW_CHANNEL),
        Overwrite(id=MEMBER, type=1, deny=VIEW_CHANNEL),
    )
    assert not can_read_channel({ROLE_A}, MEMBER, guild(), ch)
    assert can_read_channel({ROLE_A}, "302", guild(), ch)


def test_member_overwrite_allow_beats_everyone_deny():
    ch = channel(deny_everyone(), Overwrite(id=MEMBER, type=1, allow=VIEW_CHANNEL))
    assert can_read_channel(set(), MEMBER, guild(), ch)


def test_overwrite_type_matters():
    # A member overwrite whose id happens to equal a role id must not apply as a role.
    ch = channel(deny_everyone(), Overwrite(id=ROLE_A, type=1, allow=VIEW_CHANNEL))
    assert not can_read_channel({ROLE_A}, MEMBER, guild(), ch)


def test_admin_bypasses_overwrites():
    ch = channel(deny_everyone(), Overwrite(id=MEMBER, type=1, deny=VIEW_CHANNEL))
    assert can_read_channel({ROLE_A}, MEMBER, guild(a=ADMINISTRATOR), ch)
    assert not can_read_channel({ROLE_B}, MEMBER, guild(a=ADMINISTRATOR), ch)


def test_owner_always_reads():
    ch = channel(deny_everyone(), Overwrite(id="999", type=1, deny=VIEW_CHANNEL))
    assert can_read_channel(set(), "999", guild(everyone=0), ch)


def test_everyone_role_in_member_roles_is_not_a_role_overwrite():
    ch = channel(deny_everyone())
    assert not can_read_channel({G}, MEMBER, guild(), ch)


def test_perms_from_guild_create_with_standin_guild():
    payload = default_guild()
    g, channels = perms_from_guild_create(payload)
    assert g.owner_id == OWNER_ID
    assert set(channels) == {CATEGORY, GENERAL, SECRET, THREAD}
    assert channels[THREAD].parent_id == GENERAL
    members = {m["user"]["id"]: m for m in payload["members"]}
    alice, bob = members["700000000000000302"], members["700000000000000303"]
    assert can_read_channel(member_roles(alice), "700000000000000302", g, channels[GENERAL])
    assert not can_read_channel(member_roles(alice), "700000000000000302", g, channels[SECRET])
    assert can_read_channel(member_roles(bob), "700000000000000303", g, channels[SECRET])
    assert can_read_channel(member_roles(bob), "700000000000000303", g, channels[THREAD])
    assert can_read_channel({ROLE_ADMIN}, "1", g, channels[SECRET])
    assert ROLE_MEMBERS in member_roles(bob)


def test_readable_channels_are_the_text_channels_a_member_can_read() -> None:
    """What the guild state answers for "which channels may this member's /recall read":
    top-level text channels the member can view, never the category or a thread (a thread is
    read through its parent)."""
    payload = default_guild()
    g, channels = perms_from_guild_create(payload)
    members = {m["user"]["id"]: m for m in payload["members"]}
    alice, bob = members["700000000000000302"], members["700000000000000303"]
    assert readable_channels(member_roles(alice), "700000000000000302", g, channels.values()) == (
        GENERAL,
    )
    bobs = readable_channels(member_roles(bob), "700000000000000303", g, channels.values())
    assert sorted(bobs) == sorted([GENERAL, SECRET])
    assert readable_channels({ROLE_ADMIN}, "1", g, channels.values()) == bobs
    assert readable_channels(set(), OWNER_ID, g, channels.values()) == bobs
    assert readable_channels(set(), "1", g, [channels[SECRET], channels[THREAD]]) == ()


def test_thread_inherits_parent_overwrites():
    payload = default_guild()
    payload["threads"][0]["parent_id"] = SECRET
    g, channels = perms_from_guild_create(payload)
    assert not can_read_channel(set(), "700000000000000302", g, channels[THREAD])
    assert can_read_channel({ROLE_MEMBERS}, "700000000000000303", g, channels[THREAD])


def test_perms_from_guild_create_malformed():
    payload = default_guild()
    payload["roles"][0]["permissions"] = "lots"
    with pytest.raises(PayloadError, match="integer"):
        perms_from_guild_create(payload)
    payload = default_guild()
    payload["channels"][2]["permission_overwrites"][0]["type"] = 7
    with pytest.raises(PayloadError, match="overwrite type"):
        perms_from_guild_create(payload)
    with pytest.raises(PayloadError, match="owner_id"):
        perms_from_guild_create({"id": G})


def test_interaction_recall_carries_the_users_locale():
    inv = interaction_recall(interaction(locale="zh-CN", guild_locale="en-US"))
    assert inv is not None and inv.locale == "zh-CN"
    assert interaction_recall(interaction()).locale is None  # type: ignore[union-attr]
