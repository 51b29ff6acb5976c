"""Discord at community scale through the real client: members learned from their messages,
and a guild's full member list requested lazily, on first use, never at start-up."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from speakermem.memory.models import Scope
from tests.standins.discord_guild import GUILD_ID, ROLE_MEMBERS, default_guild, member, user
from tests.test_discord_adapter import BOB, GENERAL, SECRET, message, start_bot, until

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

CARL = "700000000000000304"


async def test_an_unknown_author_is_learned_from_their_message(tmp_path: Path) -> None:
    b, close = await start_bot(tmp_path)
    try:
        assert CARL not in await b.roster(SECRET)
        carl = member(user(CARL, "carl"), roles=[ROLE_MEMBERS])
        payload = message(
            b.standin,
            "first message from a member the bot was never told about",
            author=carl["user"],
            member={k: v for k, v in carl.items() if k != "user"},
        )
        await b.send("MESSAGE_CREATE", payload)
        assert b.adapter.stats["member_learned"] == 1
        # the message's member roles put Carl in #secret's roster as well as #general's
        assert CARL in await b.roster(SECRET)
        assert CARL in await b.roster(GENERAL)
        assert (await b.stored(GENERAL, str(payload["id"]))).speaker_id == CARL
        await b.send("MESSAGE_CREATE", {**payload, "id": b.standin.next_id()})
        assert b.adapter.stats["member_learned"] == 1  # known now: learned once
    finally:
        await close()


async def test_full_member_list_is_requested_lazily_on_first_use(tmp_path: Path) -> None:
    full = default_guild()
    partial = copy.deepcopy(full)
    # a large guild's GUILD_CREATE lists only some members (no start-up chunks)
    partial["members"] = [m for m in full["members"] if m["user"]["id"] != BOB]
    partial["member_count"] = len(full["members"])
    b, close = await start_bot(tmp_path, partial)
    try:
        b.standin.chunk_members = full["members"]
        assert b.standin.member_requests == []  # nothing asked at start-up
        assert not b.adapter.guilds[GUILD_ID].complete
        assert BOB not in await b.roster(SECRET)

        await b.recall("what is the plan?")  # the first use in this guild
        await until(lambda: len(b.standin.member_requests) == 1)
        assert str(b.standin.member_requests[0]["guild_id"]) == GUILD_ID
        assert b.standin.member_requests[0]["query"] == ""  # the whole list
        await until(lambda: b.adapter.guilds[GUILD_ID].complete)
        await until(lambda: b.adapter.stats["member_chunks_requested"] == 1)
        assert BOB in await b.roster(SECRET)  # his role grants #secret

        await b.recall("and the budget?")
        assert len(b.standin.member_requests) == 1  # complete: never asked again
    finally:
        await close()


async def test_a_complete_guild_is_never_chunked(tmp_path: Path) -> None:
    b, close = await start_bot(tmp_path)
    try:
        assert b.adapter.guilds[GUILD_ID].complete
        await b.recall("what is the plan?")
        assert b.standin.member_requests == []
    finally:
        await close()


async def test_creates_waiting_together_are_stored_as_one_burst_in_order(tmp_path: Path) -> None:
    b, close = await start_bot(tmp_path)
    try:
        m = b.standin.guild["members"][1]
        fields = {k: v for k, v in m.items() if k != "user"}
        first = [
            message(b.standin, f"burst message {i}", author=m["user"], member=fields)
            for i in range(30)
        ]
        edit = {
            **first[5],
            "content": "burst message 5, edited",
            "edited_timestamp": first[5]["timestamp"],
        }
        second = [
            message(b.standin, f"burst message {i}", author=m["user"], member=fields)
            for i in range(30, 60)
        ]
        before = b.adapter.processed
        # all 61 wait in the queue at once (no await in between), as under a busy gateway
        queue = b.adapter.intake.queue
        for payload in first:
            queue.put_nowait(("MESSAGE_CREATE", payload))
        queue.put_nowait(("MESSAGE_UPDATE", edit))
        for payload in second:
            queue.put_nowait(("MESSAGE_CREATE", payload))
        await b.adapter.wait_processed(before + 61)
        assert b.adapter.stats["message_bursts"] == 2  # 30 creates, the edit alone, 30 creates
        ids = [str(p["id"]) for p in first + second]
        stored = await b.engine.store.messages.by_ids(
            Scope(platform="discord", workspace=GUILD_ID, channel=GENERAL), ids
        )
        assert len(stored) == 60
        turns = [stored[i].turn_index for i in ids]
        assert turns == sorted(turns)  # arrival order kept
        assert stored[ids[5]].text == "burst message 5, edited"  # the edit came after its create
    finally:
        await close()
