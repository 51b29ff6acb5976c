"""Channels, users and rosters through the protocol."""

from __future__ import annotations

from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.store import Store
from tests.conftest import msg

GENERAL = Scope(platform="test", workspace="w1", channel="general")
RANDOM = Scope(platform="test", workspace="w1", channel="random")
OTHER_WS = Scope(platform="test", workspace="w2", channel="general")


async def roster(store: Store, action: RosterAction, user_id: str, name: str | None = None) -> None:
    await store.channels.apply(
        RosterEvent(scope=GENERAL, action=action, user_id=user_id, name=name)
    )


async def test_roster_events_round_trip(store: Store) -> None:
    await roster(store, RosterAction.JOIN, "u1", "Ann")
    await roster(store, RosterAction.JOIN, "u2", "Bo")
    await roster(store, RosterAction.RENAME, "u1", "Annie")
    await roster(store, RosterAction.ALIAS, "u1", "Nan")
    await roster(store, RosterAction.LEAVE, "u2")
    members = await store.channels.members(GENERAL)
    assert [(m.user_id, m.display_name, m.aliases) for m in members] == [("u1", "Annie", ("Nan",))]
    everyone = await store.channels.members(GENERAL, include_left=True)
    assert {m.user_id for m in everyone} == {"u1", "u2"}
    assert await store.channels.find_user("test", "w1", "nan") == ["u1"]
    assert await store.channels.find_user("test", "w1", "ANNIE") == ["u1"]
    assert await store.channels.readable_channels("test", "w1", "u1") == [GENERAL]
    assert await store.channels.readable_channels("test", "w1", "u2") == []
    # rejoining clears the leave; a speaker's first message adds them to the roster
    await roster(store, RosterAction.JOIN, "u2")
    await store.messages.ingest([msg(GENERAL, "m1", "Cy", "hello", 0)], channel_default=True)
    assert {m.user_id for m in await store.channels.members(GENERAL)} == {"u1", "u2", "cy"}


async def test_a_roster_sync_makes_the_roster_exactly_the_listed_members(store: Store) -> None:
    await roster(store, RosterAction.JOIN, "u1", "Ann")
    await roster(store, RosterAction.JOIN, "u2", "Bo")
    joined, left = await store.channels.sync_members(
        GENERAL, [("u3", "Cy", False), ("u1", "Annie", False), ("bot", None, True)]
    )
    assert (joined, left) == (3, 1)
    members = {m.user_id: m for m in await store.channels.members(GENERAL)}
    assert set(members) == {"u1", "u3", "bot"}
    assert members["u1"].display_name == "Annie" and members["bot"].is_bot
    assert await store.channels.sync_members(GENERAL, [("u3", "Cy", False)]) == (0, 2)


async def test_channels_are_private_until_told_otherwise(store: Store) -> None:
    assert await store.channels.is_private(GENERAL)  # unknown: fail closed
    assert await store.channels.lookup(GENERAL) is None
    await store.channels.set_meta(GENERAL, name="general", is_private=False)
    await store.channels.set_meta(RANDOM, name=None, is_private=None)
    assert not await store.channels.is_private(GENERAL)
    assert await store.channels.is_private(RANDOM)  # known, but nobody said
    await store.channels.set_meta(GENERAL, name="renamed", is_private=None)
    assert not await store.channels.is_private(GENERAL)  # None keeps what was said
    pk = await store.channels.lookup(GENERAL)
    assert pk is not None
    listed = {c["scope"]: c for c in await store.channels.all()}
    assert listed[GENERAL]["name"] == "renamed" and listed[GENERAL]["pk"] == pk
    assert await store.channels.find("renamed") == [GENERAL]
    assert await store.channels.find("general", platform="other") == []


async def test_workspaces_come_from_channels_and_users(store: Store) -> None:
    await store.messages.ingest([msg(GENERAL, "a", "Al", "hi", 0)], channel_default=True)
    await store.channels.apply(
        RosterEvent(scope=OTHER_WS, action=RosterAction.JOIN, user_id="u9", name="Nine")
    )
    assert await store.channels.workspaces() == [("test", "w1"), ("test", "w2")]
