"""`/memory` and `/memory-admin` on Discord: the real discord.py client against the gateway
stand-in, a real store, the real Dispatcher and its governance commands.

Shown here: admin rights computed from the guild's roles at every call and every click
(owner, Administrator, Manage Server; never the command's default permission), clear
refusals, Confirm/Cancel buttons (a click runs it, cancel does not, someone else's click
is refused), every reply ephemeral (flags 64), the one-time channel notice, exports as a
JSON attachment, and hygiene (the bot's own posts and opted-out members are not stored).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.commands import MEMORY_SUBCOMMANDS
from speakermem.integrations.discord.commands import (
    ADMIN_GROUP,
    CONTENT_LIMIT,
    MEMBER_GROUP,
    confirm_custom_id,
    discord_usage,
    memory_line,
    parse_confirm_custom_id,
    reply_parts,
)
from speakermem.integrations.payload import PayloadError
from tests.standins.discord_guild import (
    APP_ID,
    GENERAL,
    GUILD_ID,
    MANAGE_GUILD,
    ROLE_ADMIN,
    ROLE_MEMBERS,
)
from tests.test_discord_adapter import ALICE, BOB, Bot, post, start_bot, until

pytestmark = pytest.mark.contract

EPHEMERAL = 64

# --- pure: option payloads → the text line --------------------------------------------------------


def data(group: str, *path_and_options: Any) -> dict[str, Any]:
    """INTERACTION_CREATE ``data`` for ``/group path… options``."""
    *path, options = path_and_options
    nested: list[dict[str, Any]] = options
    for depth, name in reversed(list(enumerate(path))):
        nested = [{"type": 1 if depth == len(path) - 1 else 2, "name": name, "options": nested}]
    return {"name": group, "type": 1, "options": nested}


def opt(name: str, value: Any, kind: int = 3) -> dict[str, Any]:
    return {"name": name, "type": kind, "value": value}


@pytest.mark.parametrize(
    ("payload", "line"),
    [
        (
            data(ADMIN_GROUP, "channel", [opt("state", "off"), opt("purge", True, 5)]),
            "channel off purge",
        ),
        (data(ADMIN_GROUP, "channel", [opt("purge", False, 5), opt("state", "on")]), "channel on"),
        (data(ADMIN_GROUP, "retention", [opt("days", "90")]), "retention 90"),
        (
            data(ADMIN_GROUP, "retention", [opt("scope", "workspace"), opt("days", "off")]),
            "retention off workspace",
        ),
        (
            data(
                ADMIN_GROUP,
                "alias",
                [opt("action", "add"), opt("member", "123456", 6), opt("name", " Bobby  B ")],
            ),
            "alias add <@123456> Bobby B",
        ),
        (
            data(ADMIN_GROUP, "forget", "user", [opt("member", "123456", 6)]),
            "forget user <@123456>",
        ),
        (
            data(
                ADMIN_GROUP,
                "forget",
                "message",
                [opt("link", "https://discord.com/channels/1/2/3")],
            ),
            "forget message https://discord.com/channels/1/2/3",
        ),
        (data(ADMIN_GROUP, "export", [opt("member", "123456", 6)]), "export user <@123456>"),
        (data(ADMIN_GROUP, "audit", [opt("count", 5, 4)]), "audit 5"),
        (data(ADMIN_GROUP, "status", []), "status"),
        (data(MEMBER_GROUP, "opt-out", [opt("forget", True, 5)]), "opt-out forget"),
        (data(MEMBER_GROUP, "opt-out", []), "opt-out"),
        (data(MEMBER_GROUP, "forget-me", []), "forget-me"),
        (data(MEMBER_GROUP, "mine", []), "mine"),
    ],
)
def test_memory_line(payload: dict[str, Any], line: str) -> None:
    assert memory_line(payload)[1] == line


@pytest.mark.parametrize(
    "payload",
    [
        data("recall", "status", []),  # not ours
        data(ADMIN_GROUP, []),  # no subcommand
        data(ADMIN_GROUP, "nuke", []),
        data(ADMIN_GROUP, "channel", [opt("state", "off purge")]),  # not a choice
        data(ADMIN_GROUP, "retention", [opt("days", "30 workspace")]),  # one word only
        data(ADMIN_GROUP, "forget", "user", [opt("member", "<@1> extra", 6)]),
        {"name": ADMIN_GROUP, "options": "status"},
    ],
)
def test_memory_line_rejects_what_discord_would_not_send(payload: dict[str, Any]) -> None:
    with pytest.raises(PayloadError):
        memory_line(payload)


def test_every_subcommand_is_registered_in_one_group() -> None:
    import discord

    from speakermem.integrations.discord.commands import build_memory_groups

    async def handler(interaction: discord.Interaction) -> None:  # pragma: no cover
        raise AssertionError

    member, admin = build_memory_groups(handler)
    assert (member.name, admin.name) == (MEMBER_GROUP, ADMIN_GROUP)
    assert member.default_permissions is None
    assert admin.default_permissions is not None and admin.default_permissions.manage_guild
    names = {g.name: {c.name for c in g.commands} for g in (member, admin)}
    for spec in MEMORY_SUBCOMMANDS:
        where = ADMIN_GROUP if spec.admin_only else MEMBER_GROUP
        assert spec.name in names[where], spec.name
    assert not {s.name for s in MEMORY_SUBCOMMANDS if s.admin_only} & names[MEMBER_GROUP]


def test_usage_in_replies_names_the_admin_group() -> None:
    text = "Try `/memory forget user @bob` or `/memory status`; members: `/memory mine`."
    assert discord_usage(text) == (
        "Try `/memory-admin forget user @bob` or `/memory-admin status`; members: `/memory mine`."
    )


def test_reply_parts_attach_json_and_cut_long_text() -> None:
    content, attachment = reply_parts(
        "Exported.", {"messages": [{"text": "hi"}]}, subcommand="export", attachment_limit=10_000
    )
    assert content == "Exported." and attachment is not None
    assert attachment[0] == "speakermem-export.json"
    assert json.loads(attachment[1]) == {"messages": [{"text": "hi"}]}
    # over the upload limit: no file, a pointer to the CLI
    content, attachment = reply_parts(
        "Exported.", {"x": "y" * 100}, subcommand="export", attachment_limit=50
    )
    assert attachment is None and "speakermem export user" in content
    long = "line\n" * 1000
    content, attachment = reply_parts(long, None, subcommand="mine", attachment_limit=10**6)
    assert len(content) <= CONTENT_LIMIT and "attached" in content
    assert attachment is not None and attachment[1].decode() == long.strip()


def test_confirm_custom_ids_round_trip_and_reject_others() -> None:
    token = "AbC_d-123456789"
    for accept in (True, False):
        cid = confirm_custom_id(token, accept=accept)
        assert len(cid) <= 100
        click = {"type": 3, "data": {"custom_id": cid, "component_type": 2}}
        assert parse_confirm_custom_id(click) == (token, accept)
    assert parse_confirm_custom_id({"type": 3, "data": {"custom_id": "other:confirm:x"}}) is None
    assert parse_confirm_custom_id({"type": 2, "data": {"custom_id": cid}}) is None
    assert (
        parse_confirm_custom_id({"type": 3, "data": {"custom_id": "speakermem:confirm:a b"}})
        is None
    )
    with pytest.raises(ValueError):
        confirm_custom_id("bad token!", accept=True)


# --- end to end through the gateway stand-in ------------------------------------------------------

OWNER_I, ALICE_I, BOB_I = 0, 1, 2  # member indices in the stand-in guild (owner has Administrator)


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    b, close = await start_bot(tmp_path)
    try:
        yield b
    finally:
        await close()


async def run(bot: Bot, group: str, path: list[str], options: list[dict[str, Any]], **kw: Any):
    """Run `/group path… options` as a member; return the follow-up it got."""
    before = len(bot.standin.followups)
    await bot.standin.dispatch(
        "INTERACTION_CREATE", bot.standin.subcommand(group, path, options, **kw)
    )
    await until(lambda: len(bot.standin.followups) > before)
    return bot.standin.followups[-1]


async def press(bot: Bot, custom_id: str, **kw: Any) -> dict[str, Any]:
    """Click a button; return the interaction callback the bot answered with."""
    before = len(bot.standin.interaction_callbacks)
    await bot.standin.dispatch("INTERACTION_CREATE", bot.standin.component_click(custom_id, **kw))
    await until(lambda: len(bot.standin.interaction_callbacks) > before)
    return bot.standin.interaction_callbacks[-1]


def custom_ids(followup: dict[str, Any]) -> list[str]:
    return [c["custom_id"] for row in followup.get("components") or [] for c in row["components"]]


async def status(bot: Bot, **kw: Any) -> dict[str, Any]:
    return await run(bot, ADMIN_GROUP, ["status"], [], **kw)


REFUSED = "is for workspace admins"


async def alive(bot: Bot, message_id: str) -> bool:
    """Stored and not forgotten (a forgotten message leaves a textless tombstone)."""
    stored = await bot.stored(GENERAL, message_id)
    return stored is not None and not stored.deleted


@pytest.mark.e2e
async def test_admins_by_role_or_ownership_members_refused_all_ephemeral(bot: Bot) -> None:
    owner = await status(bot, member_index=OWNER_I)
    assert REFUSED not in owner["content"]
    assert owner["flags"] & EPHEMERAL
    deferred = bot.standin.interaction_callbacks[-1]
    assert deferred["type"] == 5 and deferred["data"]["flags"] & EPHEMERAL

    # Alice has no role with Manage Server or Administrator. /memory-admin's default
    # permission would hide it from her in Discord; the bot does not rely on that.
    alice = await status(bot, member_index=ALICE_I)
    assert REFUSED in alice["content"] and "/memory-admin status" in alice["content"]
    assert alice["flags"] & EPHEMERAL

    # roles come from the interaction itself: Alice given the admins role is an admin now
    promoted = await status(bot, member_index=ALICE_I, roles=[ROLE_ADMIN])
    assert REFUSED not in promoted["content"]

    # Manage Server through a role's permissions (as the gateway last sent them)
    assert REFUSED in (await status(bot, member_index=BOB_I))["content"]
    await bot.send(
        "GUILD_ROLE_UPDATE",
        {"guild_id": GUILD_ID, "role": {"id": ROLE_MEMBERS, "permissions": str(MANAGE_GUILD)}},
    )
    assert REFUSED not in (await status(bot, member_index=BOB_I))["content"]

    # member commands are open to everyone, and ephemeral too
    mine = await run(bot, MEMBER_GROUP, ["mine"], [], member_index=ALICE_I)
    assert mine["flags"] & EPHEMERAL and REFUSED not in mine["content"]


@pytest.mark.e2e
async def test_forget_user_confirmation_buttons(bot: Bot) -> None:
    bobs = [await post(bot, f"bob says number {n}", author_index=BOB_I) for n in range(3)]
    alices = await post(bot, "alice keeps talking", author_index=ALICE_I)
    member = [{"name": "member", "type": 6, "value": BOB}]
    asked = await run(bot, ADMIN_GROUP, ["forget", "user"], member, member_index=OWNER_I)
    assert asked["flags"] & EPHEMERAL
    confirm, cancel = custom_ids(asked)
    assert confirm.startswith("speakermem:confirm:") and cancel.startswith("speakermem:cancel:")
    assert all([await alive(bot, m) for m in bobs])  # nothing before the click

    # someone else's click is refused, privately, and changes nothing
    stolen = await press(bot, confirm, member_index=ALICE_I, roles=[ROLE_ADMIN])
    assert stolen["type"] == 4 and stolen["data"]["flags"] & EPHEMERAL
    assert "only the person who ran the command" in stolen["data"]["content"]
    assert all([await alive(bot, m) for m in bobs])

    # cancel: the prompt is replaced (type 7, no buttons) and nothing is removed
    cancelled = await press(bot, cancel, member_index=OWNER_I)
    assert cancelled["type"] == 7 and not cancelled["data"].get("components")
    assert "Cancelled" in cancelled["data"]["content"]
    assert all([await alive(bot, m) for m in bobs])

    # a new request, confirmed by the admin who asked: it runs
    asked = await run(bot, ADMIN_GROUP, ["forget", "user"], member, member_index=OWNER_I)
    done = await press(bot, custom_ids(asked)[0], member_index=OWNER_I)
    assert done["type"] == 7 and not done["data"].get("components")
    assert not any([await alive(bot, m) for m in bobs])
    assert await alive(bot, alices)


@pytest.mark.e2e
async def test_admin_rights_are_checked_again_at_the_click(bot: Bot) -> None:
    await bot.send(
        "GUILD_ROLE_UPDATE",
        {"guild_id": GUILD_ID, "role": {"id": ROLE_MEMBERS, "permissions": str(MANAGE_GUILD)}},
    )
    alices = await post(bot, "alice was here", author_index=ALICE_I)
    member = [{"name": "member", "type": 6, "value": ALICE}]
    asked = await run(bot, ADMIN_GROUP, ["forget", "user"], member, member_index=BOB_I)
    confirm = custom_ids(asked)[0]
    # Bob lost his role between the command and the click
    refused = await press(bot, confirm, member_index=BOB_I, roles=[])
    assert refused["data"]["flags"] & EPHEMERAL
    assert "no longer an admin" in refused["data"]["content"]
    assert await alive(bot, alices)


@pytest.mark.e2e
async def test_export_comes_as_a_json_attachment(bot: Bot) -> None:
    await post(bot, "bob's favourite tea is oolong", author_index=BOB_I)
    member = [{"name": "member", "type": 6, "value": BOB}]
    exported = await run(bot, ADMIN_GROUP, ["export"], member, member_index=OWNER_I)
    assert exported["flags"] & EPHEMERAL
    ((name, raw),) = exported["files"]
    assert name == "speakermem-export.json"
    assert "oolong" in json.dumps(json.loads(raw))


@pytest.mark.e2e
async def test_notice_once_and_hygiene(bot: Bot) -> None:
    for n in range(3):
        await post(bot, f"hello number {n}", author_index=ALICE_I)
    notices = [m for m in bot.standin.sent_messages if m["channel_id"] == GENERAL]
    assert len(notices) == 1 and "opt-out" in notices[0]["content"]
    assert not notices[0]["flags"] & EPHEMERAL  # a normal message everyone sees

    # the bot's own posts come back over the gateway: never stored
    bot_user = bot.standin.bot_user
    echoed = bot.standin.message_create(notices[0]["content"], author=bot_user)
    unflagged = bot.standin.message_create("an answer", author={**bot_user, "bot": False})
    answer = bot.standin.message_create(
        "the answer to /recall", author=bot_user, type=20, webhook_id=APP_ID
    )
    for payload in (echoed, unflagged, answer):
        await bot.send("MESSAGE_CREATE", payload)
        assert await bot.stored(GENERAL, str(payload["id"])) is None
    assert bot.adapter.stats["bot_message_skipped"] >= 3


@pytest.mark.e2e
async def test_opted_out_member_is_not_stored_until_opt_in(bot: Bot) -> None:
    out = await run(bot, MEMBER_GROUP, ["opt-out"], [], member_index=ALICE_I)
    assert out["flags"] & EPHEMERAL and not custom_ids(out)
    hidden = await post(bot, "alice would rather not be remembered", author_index=ALICE_I)
    kept = await post(bot, "bob is fine with it", author_index=BOB_I)
    assert await bot.stored(GENERAL, hidden) is None  # never written, not even a tombstone
    assert await alive(bot, kept)
    await run(bot, MEMBER_GROUP, ["opt-in"], [], member_index=ALICE_I)
    back = await post(bot, "alice is back", author_index=ALICE_I)
    assert await alive(bot, back)
