"""Real exports' untidy cases, rebuilt small by the tests (no third-party export is copied):
Slack folders, bot and app posts, old string dates, big rosters, canvases, deep JSON;
DiscordChatExporter folders with a cut-off file, thread subfolders and forwards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.events import MessageEvent
from speakermem.integrations.cli.main import main
from speakermem.integrations.discord.export import read_discord_export
from speakermem.integrations.discord.export_folder import read_discord_export_folder
from speakermem.integrations.payload import PayloadError
from speakermem.integrations.slack.export import read_slack_export
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.test_exports import zip_dir

TEAM = "TCASES01"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")


def stderr(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


def _dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def msg(user: str | None, text: str, ts: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "message", "text": text, "ts": f"{1709300000 + ts}.000100"}
    if user:
        out["user"] = user
    out["team"] = TEAM
    return {**out, **extra}


USERS = [
    {"id": "UANNA001", "team_id": TEAM, "name": "anna", "profile": {"display_name": "Anna"}},
    {"id": "UBEN0002", "team_id": TEAM, "name": "ben", "profile": {"real_name": "Ben"}},
    {
        "id": "USTANDUP",
        "team_id": TEAM,
        "name": "standup",
        "is_bot": True,
        "profile": {"real_name": "Standup Helper", "bot_id": "BSTANDUP"},
    },
]

BOT_BLOCKS = msg(
    None,
    "",
    1,
    subtype="bot_message",
    bot_id="BALERTS1",
    username="alerts",
    blocks=[
        {"type": "header", "text": {"type": "plain_text", "text": "Disk almost full"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "db-2 is at *91%*"}},
        {"type": "actions", "elements": [{"type": "button", "text": {"text": "Ack"}}]},
    ],
)
BOT_ATTACHMENTS = msg(
    None,
    "",
    2,
    subtype="bot_message",
    bot_id="BRSS0001",
    bot_profile={"name": "RSS"},
    attachments=[
        {"fallback": "ignored when there is more", "pretext": "New post", "title": "Q3 plan"},
        {"fallback": "Release 4.2 is out"},
    ],
)
BOT_NAMED_BY_USERS = msg(None, "standup starts now", 3, bot_id="BSTANDUP")
GIPHY = msg(
    "UANNA001",
    "",
    4,
    bot_id="BGIPHY01",
    attachments=[{"fallback": "giphy: celebrate", "title": "celebrate", "image_url": "x"}],
)
FILE_SHARE = msg(
    "UBEN0002", "", 5, subtype="file_share", files=[{"name": "plan.pdf", "title": "Trip plan"}]
)
PERSON_BLOCKS_ONLY = msg(
    "UBEN0002",
    "",
    6,
    blocks=[
        {
            "type": "rich_text",
            "elements": [
                {
                    "type": "rich_text_section",
                    "elements": [
                        {"type": "text", "text": "ask "},
                        {"type": "user", "user_id": "UANNA001"},
                        {"type": "text", "text": " about the cabin"},
                    ],
                }
            ],
        }
    ],
)


def slack_folder(
    root: Path,
    *,
    members: list[str] | None = None,
    created: Any = 1709251200,
    days: dict[str, list[dict[str, Any]]] | None = None,
    extra: dict[str, Any] | None = None,
    users: Any = None,
) -> Path:
    """An unzipped export: users.json, channels.json and general/ day files."""
    _dump(root / "users.json", USERS if users is None else users)
    channel = {
        "id": "CGEN0001",
        "name": "general",
        "created": created,
        "members": members if members is not None else ["UANNA001", "UBEN0002"],
    }
    _dump(root / "channels.json", [channel])
    for day, records in (days or {}).items():
        _dump(root / "general" / f"{day}.json", records)
    for rel, data in (extra or {}).items():
        _dump(root / rel, data)
    return root


ALL_CASES = [
    BOT_BLOCKS,
    BOT_ATTACHMENTS,
    BOT_NAMED_BY_USERS,
    GIPHY,
    FILE_SHARE,
    PERSON_BLOCKS_ONLY,
]


# --- Slack -------------------------------------------------------------------------------------


def test_bot_and_app_posts_keep_their_words_and_the_right_flag(tmp_path: Path):
    export = read_slack_export(slack_folder(tmp_path / "x", days={"2024-03-01": ALL_CASES}))
    events = [e for e in export if isinstance(e, MessageEvent)]
    assert export.errors == []
    got = [(e.speaker_id, e.speaker_name, e.speaker_is_bot, e.text) for e in events]
    assert got == [
        ("BALERTS1", "alerts", True, "Disk almost full\ndb-2 is at *91%*"),
        ("BRSS0001", "RSS", True, "New post\nQ3 plan\nRelease 4.2 is out"),
        ("BSTANDUP", "Standup Helper", True, "standup starts now"),
        ("UANNA001", "Anna", False, "celebrate"),  # /giphy: a person posting through an app
        ("UBEN0002", "Ben", False, "[shared file: Trip plan]"),
        ("UBEN0002", "Ben", False, "ask <@UANNA001> about the cabin"),
    ]
    assert events[-1].addressees == ("UANNA001",)


def test_folder_and_zip_import_the_same(tmp_path: Path):
    folder = slack_folder(tmp_path / "x", days={"2024-03-01": ALL_CASES})
    from_folder = list(read_slack_export(folder))
    from_zip = list(read_slack_export(zip_dir(folder, tmp_path / "x.zip")))
    assert from_folder == from_zip and len(from_folder) == len(ALL_CASES)


@pytest.mark.parametrize("created", ["1709251200", 1709251200, "1709251200.0"])
def test_string_created_dates_the_roster_snapshot(tmp_path: Path, created: Any):
    export = read_slack_export(slack_folder(tmp_path / "x", created=created))
    (roster,) = export.rosters()
    assert roster.at is not None and roster.at.isoformat() == "2024-03-01T00:00:00+00:00"


def test_canvases_and_dms_are_reported_not_imported(tmp_path: Path, capsys):
    root = slack_folder(
        tmp_path / "x",
        days={"2024-03-01": [msg("UANNA001", "in general", 1)]},
        extra={
            "FC_F07CANVAS_Team plan/2024-03-01.json": [msg("UANNA001", "canvas comment", 2)],
            "FC_F07OTHER1_Notes.json": [msg("UBEN0002", "a canvas file", 3)],
            "D0DIRECT01/2024-03-01.json": [msg("UBEN0002", "a private word", 4)],
        },
    )
    export = read_slack_export(root)
    assert [(s.name, s.kind, s.files) for s in export.skipped] == [
        ("D0DIRECT01", "direct message", 1),
        ("FC_F07CANVAS_Team plan", "canvas", 1),
        ("FC_F07OTHER1_Notes.json", "canvas", 1),
    ]
    texts = [e.text for e in export if isinstance(e, MessageEvent)]
    assert texts == ["in general"]
    assert main(["--db", str(tmp_path / "s.db"), "import", "slack-export", str(root)]) == 0
    err = stderr(capsys)
    assert "imported 1 messages" in err and "not imported (3):" in err
    assert "FC_F07CANVAS_Team plan (1 file(s)): canvas" in err
    assert "D0DIRECT01 (1 file(s)): direct messages are not imported" in err


def test_deeply_nested_users_json_is_a_clear_error_naming_the_file(tmp_path: Path, capsys):
    root = slack_folder(tmp_path / "x")
    (root / "users.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PayloadError, match=r"users\.json: JSON nested too deeply"):
        read_slack_export(root)
    zipped = zip_dir(root, tmp_path / "x.zip")
    assert main(["--db", str(tmp_path / "s.db"), "import", "slack-export", str(zipped)]) == 2
    err = stderr(capsys)
    assert "users.json: JSON nested too deeply" in err and "Traceback" not in err


async def _members(db: Path, scope: Scope) -> dict[str, str]:
    """Member id -> the day they joined."""
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        return {
            m.user_id: m.joined_at.date().isoformat() if m.joined_at else ""
            for m in await engine.members(scope)
        }
    finally:
        await engine.close()


def test_a_2000_member_roster_is_one_snapshot_per_channel(tmp_path: Path, capsys):
    people = [f"U{n:07d}" for n in range(2_000)]
    users = [{"id": u, "team_id": TEAM, "name": f"p{u}"} for u in people]
    joiner = "U9999999"
    days = {
        "2024-03-01": [
            msg("U0000001", "hello all", 1),
            msg(joiner, "", 2, subtype="channel_join"),
            msg(people[5], "", 3, subtype="channel_leave"),
        ]
    }
    root = slack_folder(
        tmp_path / "x", members=[*people, joiner], users=users, days=days, created="1700000000"
    )
    export = read_slack_export(root)
    assert export.count == 3  # records, not members: the roster is no longer per-member events
    (roster,) = export.rosters()
    assert len(roster.members) == 2_000 and joiner not in {m for m, _, _ in roster.members}
    db = tmp_path / "s.db"
    argv = ["--db", str(db), "import", "slack-export", str(root)]
    assert main(argv) == 0
    err = stderr(capsys)
    assert "imported 1 messages" in err
    assert "1 roster snapshot(s) of 2000 member(s); 2 join/leave events" in err
    scope = Scope(platform="slack", workspace=TEAM, channel="CGEN0001")
    members = asyncio.run(_members(db, scope))
    assert len(members) == 2_000 and joiner in members and people[5] not in members
    # the snapshot is dated at the channel's creation (a string here, as in old exports),
    # the joiner at their join message
    assert members[people[0]] == "2023-11-14" and members[joiner] == "2024-03-01"
    # a re-run stores nothing twice and ends with the same roster
    assert main(argv) == 0
    assert "imported 0 messages (1 already present" in stderr(capsys)
    assert asyncio.run(_members(db, scope)) == members


# --- DiscordChatExporter -----------------------------------------------------------------------

GUILD = {"id": "910000000000000001", "name": "Fake Guild"}
CATEGORY = "910000000000000005"


def dce_message(mid: int, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": str(910000000000001000 + mid),
        "type": "Default",
        "timestamp": f"2025-05-01T10:{mid:02d}:00.000+00:00",
        "content": text,
        "author": {"id": "910000000000000201", "name": "anna", "nickname": "Anna", "isBot": False},
        "mentions": [],
        **extra,
    }


def dce_file(
    channel_id: str, name: str, messages: list[dict[str, Any]], **channel: Any
) -> dict[str, Any]:
    header = {
        "id": channel_id,
        "type": "GuildTextChat",
        "categoryId": CATEGORY,
        "category": "Text",
        "name": name,
    }
    return {
        "guild": GUILD,
        "channel": {**header, **channel},
        "messages": messages,
        "messageCount": len(messages),
    }


GENERAL = "910000000000000010"


def test_one_truncated_file_does_not_fail_the_folder(tmp_path: Path, capsys):
    root = tmp_path / "exports"
    good = [dce_message(n, f"good message {n}") for n in range(3)]
    _dump(root / "Fake Guild - general [10].json", dce_file(GENERAL, "general", good))
    cut = json.dumps(dce_file("910000000000000011", "random", good[:2]))
    (root / "Fake Guild - random [11].json").write_text(cut[: cut.index("good message 1") + 5])
    argv = ["--db", str(tmp_path / "d.db"), "import", "discord-export", str(root)]
    assert main(argv) == 1
    err = stderr(capsys)
    assert "imported 3 messages" in err
    assert "1 file(s) could not be imported" in err
    assert "Fake Guild - random [11].json: discord export" in err and "not valid JSON" in err
    assert main(argv) == 1  # the re-run adds nothing and loses nothing
    assert "imported 0 messages (3 already present" in stderr(capsys)


def test_deeply_nested_discord_file_is_reported_by_name(tmp_path: Path):
    root = tmp_path / "exports"
    _dump(root / "a.json", dce_file(GENERAL, "general", [dce_message(1, "fine")]))
    deep = "[" * 50_000 + "]" * 50_000
    (root / "b.json").write_text(
        '{"guild": {"id": "1"}, "channel": {"id": "2"}, "messages": [' + deep + "]}"
    )
    folder = read_discord_export_folder(root)
    assert [e.path.name for e in folder.exports] == ["a.json"]
    assert [(b.path.name, "nested deeper than 64 levels" in b.reason) for b in folder.bad] == [
        ("b.json", True)
    ]


def _thread(tid: str, name: str, parent: str, mid: int) -> dict[str, Any]:
    return dce_file(
        tid, name, [dce_message(mid, f"in {name}")], type="GuildPublicThread", categoryId=parent
    )


def test_thread_subfolders_in_the_2023_and_2025_layouts(tmp_path: Path):
    root = tmp_path / "exports"
    _dump(root / "Fake Guild - Text - general [10].json", dce_file(GENERAL, "general", []))
    # 2025: threads gathered under _threads/, each naming its parent in categoryId
    _dump(root / "_threads" / "trip [50].json", _thread("910000000000000050", "trip", GENERAL, 1))
    # a thread whose parent was not exported keeps the parent id it names
    _dump(
        root / "_threads" / "old [51].json",
        _thread("910000000000000051", "old", "910000000000000099", 2),
    )
    # 2023 (%G/%T/%C template, older build): the folder names the parent, categoryId the category
    _dump(root / "general" / "gear [52].json", _thread("910000000000000052", "gear", CATEGORY, 3))
    folder = read_discord_export_folder(root)
    assert folder.bad == [] and folder.notes == []
    placed = {
        e.channel.name: (e.channel.channel, e.channel.thread_id)
        for e in folder.exports
        if e.channel.kind == "GuildPublicThread"
    }
    assert placed == {
        "trip": (GENERAL, "910000000000000050"),
        "old": ("910000000000000099", "910000000000000051"),
        "gear": (GENERAL, "910000000000000052"),
    }
    events = [m for e in folder.exports for m in e if isinstance(m, MessageEvent)]
    assert [(m.text, m.scope.channel, m.thread_id) for m in events if m.text == "in gear"] == [
        ("in gear", GENERAL, "910000000000000052")
    ]


def test_thread_whose_parent_cannot_be_told_is_reported(tmp_path: Path):
    root = tmp_path / "exports"
    _dump(root / "general [10].json", dce_file(GENERAL, "general", []))
    _dump(root / "misc" / "lost [53].json", _thread("910000000000000053", "lost", CATEGORY, 4))
    folder = read_discord_export_folder(root)
    (lost,) = [e for e in folder.exports if e.channel.name == "lost"]
    assert (lost.channel.channel, lost.channel.thread_id) == ("910000000000000053", None)
    assert folder.notes == [
        "lost [53].json: thread's parent channel unknown (its categoryId is a category); "
        "imported as a channel of its own"
    ]


def test_forwards_read_the_snapshot_and_are_not_replies(tmp_path: Path):
    ref = {"messageId": "910000000000009999", "channelId": "910000000000000077"}
    messages = [
        # 2025 build: no "type": "Forward" on the reference, the snapshot carries the words
        dce_message(1, "", reference=ref, forwardedMessage={"content": "meet at 9 at the pier"}),
        # with the original author given, and a comment of the forwarder's own
        dce_message(
            2,
            "see this",
            reference={**ref, "type": "Forward"},
            forwardedMessage={
                "content": "bring boots",
                "author": {"id": "910000000000000202", "name": "bo", "nickname": "Bo"},
            },
        ),
        # Discord's own message_snapshots shape
        dce_message(3, "", reference=ref, message_snapshots=[{"message": {"content": "tickets"}}]),
        # an ordinary reply in the channel stays a reply
        dce_message(
            4, "agreed", reference={"messageId": "910000000000001001", "channelId": GENERAL}
        ),
    ]
    path = tmp_path / "general.json"
    _dump(path, dce_file(GENERAL, "general", messages))
    export = read_discord_export(path)
    got = [(e.text, e.reply_to, e.speaker_name) for e in export if isinstance(e, MessageEvent)]
    assert export.errors == []
    assert got == [
        ("[forwarded] meet at 9 at the pier", None, "Anna"),
        ("see this\n[forwarded from Bo] bring boots", None, "Anna"),
        ("[forwarded] tickets", None, "Anna"),
        ("agreed", "910000000000001001", "Anna"),
    ]
