"""Rosters at scale: a 10,000-member Slack workspace synced through the local Slack stand-in
with paged users.list (cached) instead of one users.info per member, within tier limits."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.events import Scope
from speakermem.integrations.slack.roster_sync import SlackDirectory, sync_channel_roster
from speakermem.memory.engine import MemoryEngine
from tests.conftest import make_config
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn

pytestmark = pytest.mark.contract

N = 10_000
CHANNEL = "CBIG"


@pytest.fixture
async def standin() -> AsyncIterator[SlackApiStandIn]:
    users = {f"U{i:05d}": {"name": f"user{i}", "real_name": f"User {i}"} for i in range(N)}
    users["B0000"] = {"name": "helper", "real_name": "Helper", "is_bot": True}
    s = SlackApiStandIn(users=users, members={CHANNEL: list(users)}, page_size=1_000)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    engine = await MemoryEngine.open(make_config(tmp_path), None)
    try:
        yield engine
    finally:
        await engine.close()


def scope() -> Scope:
    return Scope(platform="slack", workspace=TEAM_ID, channel=CHANNEL)


@pytest.mark.e2e
async def test_ten_thousand_members_take_tens_of_calls_not_ten_thousand(
    standin: SlackApiStandIn, store: MemoryEngine
) -> None:
    directory = SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=standin.base_url))
    asked: list[str] = []

    async def user_info(team: str, uid: str) -> tuple[str, bool] | None:
        asked.append(uid)
        return None

    started = time.perf_counter()
    outcome = await sync_channel_roster(store, directory, scope(), user_info=user_info)
    elapsed = time.perf_counter() - started
    pages = -(-(N + 1) // 1_000)
    assert len(standin.method_calls("users.list")) == pages == 11
    assert len(standin.method_calls("conversations.members")) == pages
    assert not standin.method_calls("users.info") and not asked
    assert outcome.members == N + 1 and outcome.unnamed == 0 and outcome.left == 0
    members = await store.members(scope())
    assert len(members) == N + 1
    names = {m.user_id: (m.display_name, m.is_bot) for m in members}
    assert names["U00042"] == ("User 42", False) and names["B0000"] == ("Helper", True)
    assert elapsed < 30  # one transaction for the roster, not one per member

    # within the TTL the directory is not listed again; a member who left is recorded
    standin.members[CHANNEL].remove("U00007")
    again = await sync_channel_roster(store, directory, scope(), user_info=user_info)
    assert len(standin.method_calls("users.list")) == pages
    assert again.left == 1 and again.joined_or_renamed == 0
    assert "U00007" not in {m.user_id for m in await store.members(scope())}


@pytest.mark.e2e
async def test_a_member_the_directory_lacks_costs_one_users_info(
    standin: SlackApiStandIn, store: MemoryEngine
) -> None:
    directory = SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=standin.base_url))
    await directory.ensure(TEAM_ID)
    standin.users["UNEW"] = {"name": "newbie", "real_name": "New Person"}
    standin.members[CHANNEL].append("UNEW")
    asked: list[str] = []

    async def user_info(team: str, uid: str) -> tuple[str, bool] | None:
        asked.append(uid)
        return ("New Person", False)

    outcome = await sync_channel_roster(store, directory, scope(), user_info=user_info)
    assert asked == ["UNEW"] and outcome.unnamed == 0
    assert directory.get(TEAM_ID, "UNEW") == ("New Person", False)


@pytest.mark.e2e
async def test_rate_limited_pages_wait_for_retry_after_then_ask_again(
    standin: SlackApiStandIn, store: MemoryEngine
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    # a client without slack_sdk's retry handler: the directory itself must honour 429s
    directory = SlackDirectory(
        AsyncWebClient(token="xoxb-test", base_url=standin.base_url), sleep=sleep
    )
    standin.rate_limit("users.list", retry_after=3, times=2)
    standin.rate_limit("conversations.members", retry_after=1)
    outcome = await sync_channel_roster(store, directory, scope())
    assert waits == [1.0, 3.0, 3.0]
    assert outcome.members == N + 1 and outcome.unnamed == 0
    assert directory.api.calls["users.list"] == 11 + 2 and directory.api.waited_s == 7.0
    # the refused page is asked again (same cursor), then the pages follow one by one
    cursors = [a.get("cursor") for a in standin.method_calls("users.list")]
    assert cursors[:4] == [None, None, None, "1000"]


@pytest.mark.e2e
async def test_a_refused_listing_keeps_the_old_directory(
    standin: SlackApiStandIn, store: MemoryEngine
) -> None:
    async def sleep(seconds: float) -> None:
        return None

    client = AsyncWebClient(token="xoxb-test", base_url=standin.base_url)
    directory = SlackDirectory(client, sleep=sleep, max_retries=1, ttl_s=0.0)
    assert await directory.ensure(TEAM_ID)
    standin.rate_limit("users.list", retry_after=1, times=5)
    assert await directory.ensure(TEAM_ID, force=True)  # stale names beat none
    assert directory.size(TEAM_ID) == N + 1


# --- Discord: lazy members, cached permissions -------------------------------------------------


def big_guild(members: int, channels: int) -> dict[str, object]:
    """A guild payload: @everyone reads, every 10th channel only for role R1 (half of all)."""
    from speakermem.integrations.discord import translate as tr

    hidden = [
        {"id": "G", "type": 0, "allow": "0", "deny": str(tr.VIEW_CHANNEL)},
        {"id": "R1", "type": 0, "allow": str(tr.VIEW_CHANNEL), "deny": "0"},
    ]
    return {
        "id": "G",
        "owner_id": "O",
        "member_count": members,
        "roles": [
            {"id": "G", "permissions": str(tr.READ_CHANNEL)},
            {"id": "R1", "permissions": "0"},
        ],
        "channels": [
            {
                "id": f"C{c}",
                "type": 0,
                "name": f"c{c}",
                "permission_overwrites": hidden if c % 10 == 0 else [],
            }
            for c in range(channels)
        ],
        "members": [
            {"user": {"id": f"M{i}", "username": f"m{i}"}, "roles": ["R1"] if i % 2 else []}
            for i in range(members)
        ],
    }


def test_permission_answers_are_cached_and_dropped_on_changes() -> None:
    from speakermem.integrations.discord.adapter import GuildState
    from speakermem.integrations.discord.members import PermissionCache

    state = GuildState.from_guild_create(big_guild(20, 100))
    cache = PermissionCache()
    with_role = cache.readable(state, "M1", ["R1"])
    assert len(with_role) == 100 and len(cache.readable(state, "M2", [])) == 90
    again = cache.readable(state, "M1", ["R1"])
    assert again is with_role and (cache.hits, cache.misses) == (1, 2)

    # R1 loses its overwrite on C0: a cached answer is stale until the guild is invalidated
    state.put_channel({"id": "C0", "type": 0, "name": "c0", "permission_overwrites": []})
    state.channels["C0"] = state.parse_channel(
        {
            "id": "C0",
            "type": 0,
            "permission_overwrites": [
                {"id": "G", "type": 0, "allow": "0", "deny": "1024"},
            ],
        }
    )
    assert "C0" in cache.readable(state, "M1", ["R1"])  # cached
    cache.invalidate_guild("G")
    assert "C0" not in cache.readable(state, "M1", ["R1"])
    cache.invalidate_member("G", "M1")
    assert ("G", "M1", frozenset({"R1"})) not in cache._entries


def test_permission_cache_is_bounded() -> None:
    from speakermem.integrations.discord.adapter import GuildState
    from speakermem.integrations.discord.members import PermissionCache

    state = GuildState.from_guild_create(big_guild(2_000, 50))
    cache = PermissionCache(max_entries=500)
    for i in range(2_000):
        cache.readable(state, f"M{i}", ["R1"] if i % 2 else [])
    assert len(cache) == 500


def test_a_message_teaches_its_author_roles() -> None:
    from speakermem.integrations.discord.members import member_from_message

    d = {
        "author": {"id": "M9", "username": "m9"},
        "member": {"roles": ["R1"], "nick": "Nine"},
        "content": "hi",
    }
    assert member_from_message(d) == {"roles": ["R1"], "nick": "Nine", "user": d["author"]}
    assert member_from_message({**d, "author": {"id": "B", "bot": True}}) is None
    assert member_from_message({"author": d["author"]}) is None
