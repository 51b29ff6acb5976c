"""Guild dispatches → roster events, channel metadata and deletions, with no client.

`GuildRoster` is the pure half of the Discord adapter's guild handling: these tests feed it
literal gateway payloads (the stand-in's guild) and read what it answers.
"""

from __future__ import annotations

from typing import Any

from speakermem.integrations.discord.guild_state import (
    ChannelDeleted,
    ChannelMeta,
    GuildLeft,
    GuildRoster,
    GuildState,
    ThreadDeleted,
)
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from tests.standins.discord_guild import (
    CATEGORY,
    EVERYONE,
    GENERAL,
    GUILD_ID,
    OWNER_ID,
    ROLE_MEMBERS,
    SECRET,
    THREAD,
    VIEW,
    default_guild,
    member,
    user,
)

ALICE, BOB, BOT = "700000000000000302", "700000000000000303", "700000000000000900"


def scope(channel: str) -> Scope:
    return Scope(platform="discord", workspace=GUILD_ID, channel=channel)


def moves(events: list[RosterEvent]) -> list[tuple[str, str, str]]:
    """(action, channel, user) of each event, in order."""
    return [(e.action.value, e.scope.channel, e.user_id) for e in events]


def seeded(guild: dict[str, Any] | None = None) -> tuple[GuildRoster, GuildState]:
    roster = GuildRoster()
    state = roster.add_guild(guild or default_guild())
    assert state is not None
    roster.seed(state, {})
    return roster, state


def test_guild_create_joins_whoever_can_read_each_text_channel() -> None:
    roster = GuildRoster()
    state = roster.add_guild(default_guild())
    assert state is not None
    metas = [m for cid in state.text_channels() for m in roster.channel_meta(state, cid)]
    assert metas == [
        ChannelMeta(scope(GENERAL), "general", is_private=False),
        ChannelMeta(scope(SECRET), "secret", is_private=True),
    ]
    assert roster.channel_meta(state, CATEGORY) == []  # a category holds no messages
    joined = moves(roster.seed(state, {GENERAL: {ALICE}}))
    # alice is already on #general's roster; #secret is for members and the owner
    assert joined == [
        ("join", GENERAL, OWNER_ID),
        ("join", GENERAL, BOB),
        ("join", GENERAL, BOT),
        ("join", SECRET, OWNER_ID),
        ("join", SECRET, BOB),
        ("join", SECRET, BOT),
    ]


def test_readable_is_the_text_channels_a_member_can_read() -> None:
    _roster, state = seeded()
    assert state.readable(ALICE) == (GENERAL,)
    assert state.readable(BOB) == (GENERAL, SECRET)
    assert state.readable(ALICE, roles=[ROLE_MEMBERS]) == (GENERAL, SECRET)
    assert state.readable("700000000000000999") == ()  # unknown member: nothing (fail closed)


def test_seed_sends_no_leaves_until_every_member_is_known() -> None:
    guild = default_guild()
    guild["member_count"] = 10  # a large guild: the rest come in chunks
    roster = GuildRoster()
    state = roster.add_guild(guild)
    assert state is not None and not state.complete
    events = roster.seed(state, {GENERAL: {"700000000000000777"}})
    assert all(e.action is RosterAction.JOIN for e in events)
    state.member_count = len(state.members)
    assert moves(roster.reconcile(state)) == [("leave", GENERAL, "700000000000000777")]


def test_a_role_that_loses_view_leaves_its_members_out() -> None:
    roster, _state = seeded()
    change = roster.parse(
        "GUILD_ROLE_UPDATE", {"guild_id": GUILD_ID, "role": {"id": EVERYONE, "permissions": "0"}}
    )
    # @everyone can no longer view anything: only the owner (administrator) still reads
    assert moves(change.roster) == [
        ("leave", GENERAL, ALICE),
        ("leave", GENERAL, BOB),
        ("leave", GENERAL, BOT),
        ("leave", SECRET, BOB),
        ("leave", SECRET, BOT),
    ]
    assert change.deletions == [] and change.channels == []


def test_an_overwrite_change_records_the_channel_and_recomputes_only_it() -> None:
    roster, _state = seeded()
    general = next(c for c in default_guild()["channels"] if c["id"] == GENERAL)
    hidden = {
        **general,
        "permission_overwrites": [{"id": EVERYONE, "type": 0, "allow": "0", "deny": str(VIEW)}],
    }
    change = roster.parse("CHANNEL_UPDATE", hidden)
    assert change.channels == [ChannelMeta(scope(GENERAL), "general", is_private=True)]
    # #secret keeps its roster: only the changed channel is recomputed
    assert moves(change.roster) == [
        ("leave", GENERAL, ALICE),
        ("leave", GENERAL, BOB),
        ("leave", GENERAL, BOT),
    ]


def test_a_deleted_channel_is_forgotten_before_its_roster_leaves() -> None:
    roster, _state = seeded()
    change = roster.parse("CHANNEL_DELETE", {"id": SECRET, "guild_id": GUILD_ID, "type": 0})
    assert change.deletions == [ChannelDeleted(scope(SECRET))]
    assert moves(change.roster) == [
        ("leave", SECRET, OWNER_ID),
        ("leave", SECRET, BOB),
        ("leave", SECRET, BOT),
    ]
    again = roster.parse("CHANNEL_DELETE", {"id": SECRET, "guild_id": GUILD_ID, "type": 0})
    assert again.deletions == [ChannelDeleted(scope(SECRET))] and again.roster == []


def test_a_deleted_thread_is_forgotten_in_its_parent() -> None:
    roster, state = seeded()
    change = roster.parse("THREAD_DELETE", {"id": THREAD, "guild_id": GUILD_ID, "type": 11})
    assert change.deletions == [ThreadDeleted(scope(GENERAL), THREAD)]
    assert THREAD not in state.threads
    # a thread never seen, without a parent: stored as a channel of its own
    lone = roster.parse("THREAD_DELETE", {"id": "42", "guild_id": GUILD_ID, "type": 11})
    assert lone.deletions == [ThreadDeleted(scope("42"), "42")]


def test_leaving_a_guild_forgets_it_but_an_outage_does_not() -> None:
    roster, _state = seeded()
    outage = roster.parse("GUILD_DELETE", {"id": GUILD_ID, "unavailable": True})
    assert outage.deletions == [] and GUILD_ID in roster.guilds
    left = roster.parse("GUILD_DELETE", {"id": GUILD_ID})
    assert left.deletions == [GuildLeft(GUILD_ID)] and GUILD_ID not in roster.guilds


def test_a_new_member_joins_the_guild_then_the_channels_they_can_read() -> None:
    roster, state = seeded()
    carol = member(user("700000000000000304", "carol"), roles=[ROLE_MEMBERS])
    change = roster.parse("GUILD_MEMBER_ADD", {**carol, "guild_id": GUILD_ID})
    assert moves(change.roster) == [
        ("join", "*", "700000000000000304"),  # the name, guild-wide
        ("join", GENERAL, "700000000000000304"),
        ("join", SECRET, "700000000000000304"),
    ]
    assert state.member_count == 5
    gone = roster.parse("GUILD_MEMBER_REMOVE", {"user": carol["user"], "guild_id": GUILD_ID})
    assert moves(gone.roster) == [("leave", "*", "700000000000000304")]
    assert state.member_count == 4
    assert all("700000000000000304" not in have for have in roster.granted[GUILD_ID].values())


def test_a_member_update_renames_only_on_a_new_name_and_follows_roles() -> None:
    roster, _state = seeded()
    same = member(user(ALICE, "alice", global_name="Alice"), nick="Ally")
    assert roster.parse("GUILD_MEMBER_UPDATE", {**same, "guild_id": GUILD_ID}).roster == []
    promoted = member(user(ALICE, "alice", global_name="Alice"), nick="Al", roles=[ROLE_MEMBERS])
    change = roster.parse("GUILD_MEMBER_UPDATE", {**promoted, "guild_id": GUILD_ID})
    assert moves(change.roster) == [("rename", "*", ALICE), ("join", SECRET, ALICE)]
    assert change.roster[0].name == "Al"


def test_a_message_author_not_known_yet_is_learned_once() -> None:
    guild = default_guild()
    guild["members"] = guild["members"][:1]  # only the owner arrived with the guild
    roster, _state = seeded(guild)
    bob = member(user(BOB, "bob"), roles=[ROLE_MEMBERS])
    learned = roster.learn_author(GUILD_ID, bob)
    assert learned is not None
    assert moves(learned) == [("join", GENERAL, BOB), ("join", SECRET, BOB)]
    assert roster.learn_author(GUILD_ID, bob) is None  # known now
    assert roster.learn_author("700000000000000999", bob) is None  # a guild we do not have
