"""`/memory` on Slack: the real slack-bolt app fed signed HTTP (slash commands and Block Kit
button clicks), the Web API stand-in, a real store and the real Dispatcher.

Shown here: admin rights from ``users.info`` (admin, owner, primary owner) or the
SPEAKERMEM_SLACK_ADMIN_USERS setting, checked at every call and every click, failing
closed; clear refusals; Confirm/Cancel buttons (a click runs it, cancel does not, someone
else's click is refused); every reply ephemeral; the one-time channel notice; and hygiene
(the bot's own posts and answers, and opted-out members, are never stored).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from speakermem.integrations.slack.render import CANCEL_ACTION, CONFIRM_ACTION
from tests.standins.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID
from tests.test_slack_adapter import (
    FORM,
    GENERAL,
    PRIVATE,
    USERS,
    Rig,
    _rig,
    gscope,
    message,
    section_text,
    seed,
)

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

ADMIN, MEMBER, OTHER = "U1", "U2", "U3"
REFUSED = "is for workspace admins"


async def status_text(rig: Rig, user: str) -> str:
    return section_text((await memory(rig, user, "status"))["blocks"])


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r, close = await _rig(tmp_path)
    r.standin.users[ADMIN]["is_admin"] = True
    try:
        yield r
    finally:
        await close()


async def memory(rig: Rig, user: str, text: str, channel: str = GENERAL) -> dict[str, Any]:
    """Run `/memory text` as `user`; return what was posted to its response_url."""
    key = f"m{len(rig.standin.responses)}-{user}"
    form = {
        "command": "/memory",
        "text": text,
        "user_id": user,
        "user_name": USERS[user]["name"],
        "channel_id": channel,
        "team_id": TEAM_ID,
        "response_url": rig.standin.response_url(key),
        "trigger_id": "1.2",
    }
    status, body = await rig.post_raw(urlencode(form), FORM)
    assert status == 200 and body == ""  # acked at once, nothing shown in the channel
    posted = [b for k, b in rig.standin.responses if k == key]
    assert len(posted) == 1, rig.standin.responses
    return posted[0]


async def click(
    rig: Rig, user: str, token: str, *, accept: bool, channel: str = GENERAL
) -> dict[str, Any]:
    """A Block Kit button click (block_actions), as Slack posts it."""
    key = f"c{len(rig.standin.responses)}-{user}"
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": USERS[user]["name"], "team_id": TEAM_ID},
        "team": {"id": TEAM_ID, "domain": "standin"},
        "api_app_id": "A0STANDIN",
        "token": "legacy",
        "trigger_id": "2.3",
        "container": {"type": "message", "is_ephemeral": True, "channel_id": channel},
        "channel": {"id": channel, "name": channel.lower()},
        "response_url": rig.standin.response_url(key),
        "actions": [
            {
                "type": "button",
                "action_id": CONFIRM_ACTION if accept else CANCEL_ACTION,
                "block_id": "speakermem_confirm",
                "value": token,
                "action_ts": "1709283600.000001",
            }
        ],
    }
    status, _ = await rig.post_raw(urlencode({"payload": json.dumps(payload)}), FORM)
    assert status == 200
    posted = [b for k, b in rig.standin.responses if k == key]
    assert len(posted) == 1, rig.standin.responses
    return posted[0]


def buttons(posted: dict[str, Any]) -> dict[str, str]:
    """action_id → token of the reply's Confirm/Cancel buttons."""
    return {
        e["action_id"]: e["value"]
        for b in posted.get("blocks", [])
        if b["type"] == "actions"
        for e in b["elements"]
    }


async def stored_ids(rig: Rig, channel: str = GENERAL) -> set[str]:
    rows = await rig.engine.store.db.read(
        "SELECT m.message_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.channel = ? AND m.deleted_at IS NULL",
        (channel,),
    )
    return {r[0] for r in rows}


async def speakers(rig: Rig, channel: str = GENERAL) -> set[str]:
    rows = await rig.engine.store.db.read(
        "SELECT DISTINCT m.speaker_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.channel = ? AND m.deleted_at IS NULL",
        (channel,),
    )
    return {r[0] for r in rows}


# --- registration, admin check, refusal, ephemeral ------------------------------------------------


async def test_admin_runs_admin_commands_and_members_are_refused(rig: Rig) -> None:
    await seed(rig)
    ok = await memory(rig, ADMIN, "status")
    assert ok["response_type"] == "ephemeral"
    assert REFUSED not in section_text(ok["blocks"])
    refused = await memory(rig, MEMBER, "status")
    assert refused["response_type"] == "ephemeral"
    assert REFUSED in section_text(refused["blocks"])
    # member commands are open to everyone, ephemeral too
    mine = await memory(rig, MEMBER, "mine")
    assert mine["response_type"] == "ephemeral" and REFUSED not in section_text(mine["blocks"])
    # users.info was asked at each call (no cached admin flag)
    asked = [a["user"] for a in rig.standin.method_calls("users.info")]
    assert asked.count(ADMIN) >= 1 and asked.count(MEMBER) >= 1


async def test_admin_rights_are_read_at_every_call_and_fail_closed(rig: Rig) -> None:
    await seed(rig)
    assert REFUSED not in await status_text(rig, ADMIN)
    # demoted in Slack: the next call knows
    rig.standin.users[ADMIN]["is_admin"] = False
    assert REFUSED in await status_text(rig, ADMIN)
    # owners and primary owners are admins too
    rig.standin.users[ADMIN]["is_owner"] = True
    assert REFUSED not in await status_text(rig, ADMIN)
    rig.standin.users[ADMIN]["is_owner"] = False
    rig.standin.users[ADMIN]["is_primary_owner"] = True
    assert REFUSED not in await status_text(rig, ADMIN)
    # a deleted account, or one from another workspace, is not
    rig.standin.users[ADMIN]["deleted"] = True
    assert REFUSED in await status_text(rig, ADMIN)
    del rig.standin.users[ADMIN]["deleted"]
    rig.standin.users[ADMIN]["team_id"] = "T0ELSEWHERE"
    assert REFUSED in await status_text(rig, ADMIN)
    del rig.standin.users[ADMIN]["team_id"]
    assert REFUSED not in await status_text(rig, ADMIN)
    # users.info failing means no admin, whatever the user really is
    rig.standin.fail("users.info", times=5)
    assert REFUSED in await status_text(rig, ADMIN)
    assert rig.adapter.stats["admin_check_failed"] >= 1


async def test_admin_users_setting_grants_admin(rig: Rig) -> None:
    await seed(rig)
    assert REFUSED in await status_text(rig, MEMBER)
    rig.adapter.settings.slack_admin_users = f" {OTHER}, {MEMBER} "
    assert REFUSED not in await status_text(rig, MEMBER)
    # the setting needs no users.info at all: it works while Slack is failing
    rig.standin.fail("users.info", times=5)
    assert REFUSED not in await status_text(rig, MEMBER)


# --- confirmation ---------------------------------------------------------------------------------


async def test_forget_user_asks_first_and_only_the_requester_can_confirm(rig: Rig) -> None:
    await seed(rig)
    assert MEMBER in await speakers(rig)
    asked = await memory(rig, ADMIN, f"forget user <@{MEMBER}|bob>")
    assert asked["response_type"] == "ephemeral"
    tokens = buttons(asked)
    assert set(tokens) == {CONFIRM_ACTION, CANCEL_ACTION}
    token = tokens[CONFIRM_ACTION]
    assert MEMBER in await speakers(rig)  # nothing happens before the click

    # someone else's click (even an admin's) is refused and leaves the action pending
    rig.standin.users[OTHER]["is_admin"] = True
    stolen = await click(rig, OTHER, token, accept=True)
    assert stolen["response_type"] == "ephemeral" and stolen["replace_original"] is False
    assert "only the person who ran the command" in section_text(stolen["blocks"])
    assert MEMBER in await speakers(rig)

    # cancel: nothing removed, the buttons are replaced by the outcome
    cancelled = await click(rig, ADMIN, token, accept=False)
    assert cancelled["replace_original"] is True and not buttons(cancelled)
    assert "Cancelled" in section_text(cancelled["blocks"])
    assert MEMBER in await speakers(rig)
    # a used token does not run again
    again = await click(rig, ADMIN, token, accept=True)
    assert again["replace_original"] is False
    assert MEMBER in await speakers(rig)

    # a fresh request, confirmed by the admin who asked: it runs
    token = buttons(await memory(rig, ADMIN, f"forget user <@{MEMBER}>"))[CONFIRM_ACTION]
    others_before = (await speakers(rig)) - {MEMBER}
    done = await click(rig, ADMIN, token, accept=True)
    assert done["response_type"] == "ephemeral" and done["replace_original"] is True
    assert MEMBER not in await speakers(rig)
    assert (await speakers(rig)) == others_before


async def test_admin_rights_are_checked_again_at_the_click(rig: Rig) -> None:
    await seed(rig)
    token = buttons(await memory(rig, ADMIN, f"forget user <@{MEMBER}>"))[CONFIRM_ACTION]
    rig.standin.users[ADMIN]["is_admin"] = False  # demoted between command and click
    refused = await click(rig, ADMIN, token, accept=True)
    assert "no longer an admin" in section_text(refused["blocks"])
    assert refused["response_type"] == "ephemeral"
    assert MEMBER in await speakers(rig)


# --- the one-time notice, hygiene -----------------------------------------------------------------


async def test_notice_is_posted_once_per_channel(rig: Rig) -> None:
    for n in range(1, 4):
        assert await rig.event(message(GENERAL, "U1", f"message number {n}", n), n) == 200
    notices = [p for p in rig.standin.posted if p.get("channel") == GENERAL]
    assert len(notices) == 1, rig.standin.posted
    assert "opt-out" in notices[0]["text"] and not notices[0].get("ephemeral")
    # the notice echoes back as the bot's own message: never stored
    echo = message(GENERAL, BOT_USER_ID, notices[0]["text"], 9, bot_id=BOT_ID)
    await rig.event(echo, 9)
    assert BOT_USER_ID not in await speakers(rig)


async def test_bot_messages_and_answers_are_never_stored(rig: Rig) -> None:
    await seed(rig)
    before = await stored_ids(rig)
    _, _, posted = await rig.recall("U1", GENERAL, "when is the trip to Lisbon?")
    answer = posted["text"]
    # what Slack sends back after the answer is posted: the bot's own message...
    await rig.event(message(GENERAL, BOT_USER_ID, answer, 20, bot_id=BOT_ID), 20)
    # ...a bot_message from an integration, and a message from another app's bot user
    await rig.event(
        {
            "type": "message",
            "subtype": "bot_message",
            "channel": GENERAL,
            "bot_id": "B0OTHER",
            "username": "deploybot",
            "text": "deployed build 42 to Lisbon",
            "ts": "1709285000.000001",
            "channel_type": "channel",
        },
        21,
    )
    await rig.event(message(GENERAL, "U9", "beep from a bot user", 22, bot_id="B0OTHER"), 22)
    assert await stored_ids(rig) == before


async def test_opted_out_member_is_not_stored_until_opt_in(rig: Rig) -> None:
    reply = await memory(rig, MEMBER, "opt-out")
    assert reply["response_type"] == "ephemeral" and not buttons(reply)
    await rig.event(message(GENERAL, MEMBER, "please do not keep this", 1), 1)
    await rig.event(message(PRIVATE, OTHER, "carol is fine with memory", 2), 2)
    assert MEMBER not in await speakers(rig)
    assert OTHER in await speakers(rig, PRIVATE)
    await memory(rig, MEMBER, "opt-in")
    await rig.event(message(GENERAL, MEMBER, "keep this one", 3), 3)
    assert MEMBER in await speakers(rig)
    assert await rig.engine.store.messages.get(gscope(), "1709283780.000003") is not None


async def test_export_shows_the_json_inline(rig: Rig) -> None:
    await seed(rig)
    exported = await memory(rig, ADMIN, f"export user <@{MEMBER}>")
    assert exported["response_type"] == "ephemeral" and not buttons(exported)
    fenced = [
        b["text"]["text"]
        for b in exported["blocks"]
        if b["type"] == "section" and b["text"]["text"].startswith("```")
    ]
    assert len(fenced) == 1 and "noodle place" in fenced[0]
    assert "Lisbon" not in fenced[0]  # only Bob's messages
