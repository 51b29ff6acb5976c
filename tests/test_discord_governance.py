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
from typing import Any

import pytest

from bot.commands import MEMORY_SUBCOMMANDS
from integrations.discord.commands import (
    ADMIN_GROUP,
    CONTENT_LIMIT,
    MEMBER_GROUP,
    confirm_custom_id,
    discord_usage,
    memory_line,
    parse_confirm_custom_id,
    reply_parts,
)
from integrations.payload import PayloadError

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

    from integrations.discord.commands import build_memory_groups

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
