"""`speakermem import slack-export|discord-export` and `discord-sync`, end to end."""

from __future__ import annotations

import argparse
import asyncio
import zipfile
from pathlib import Path

import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.cli import commands_platform
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.main import main
from speakermem.integrations.discord.adapter import sync_commands
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import APP_ID, GUILD_ID

FIXTURES = Path(__file__).parent / "fixtures"
DISCORD_FILE = FIXTURES / "discord_export_small.json"
SLACK_DIR = FIXTURES / "slack_export_small"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No .env, no model download: the import runs lexical-only in a temp dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")


def stderr(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr with rich's line wrapping undone."""
    return " ".join(capsys.readouterr().err.split())


def slack_zip(tmp_path: Path) -> Path:
    dest = tmp_path / "slack-export.zip"
    with zipfile.ZipFile(dest, "w") as zf:
        for path in sorted(SLACK_DIR.rglob("*.json")):
            zf.write(path, path.relative_to(SLACK_DIR).as_posix())
    return dest


async def _read(db: Path, scope: Scope) -> tuple[list[str], set[str], dict[str, object]]:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        hits = await engine.search("trip OR party OR Lisbon OR cabin", [scope], mode="lexical")
        members = {m.user_id for m in await engine.members(scope)}
        meta = next(c for c in await engine.store.channels.all() if c["scope"] == scope)
        return [h.message.text for h in hits], members, meta
    finally:
        await engine.close()


def test_import_discord_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    db = tmp_path / "d.db"
    assert main(["--db", str(db), "import", "discord-export", str(DISCORD_FILE)]) == 0
    err = stderr(capsys)
    assert "imported 2 messages" in err and "1 bot messages skipped" in err
    general = Scope(
        platform="discord", workspace="900000000000000001", channel="900000000000000010"
    )
    texts, _members, meta = asyncio.run(_read(db, general))
    assert any("hiking trip" in t for t in texts)
    assert not any("Reminder" in t for t in texts)  # the bot's message
    assert meta["name"] == "general" and meta["messages"] == 2
    # idempotent
    assert main(["--db", str(db), "import", "discord-export", str(DISCORD_FILE)]) == 0
    assert "imported 0 messages (2 already present" in stderr(capsys)


def test_import_slack_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    db = tmp_path / "s.db"
    assert main(["--db", str(db), "import", "slack-export", str(slack_zip(tmp_path))]) == 0
    err = stderr(capsys)
    assert "imported 5 messages" in err and "1 bot messages skipped" in err
    general = Scope(platform="slack", workspace="TFAKE001", channel="CGENERAL")
    plans = Scope(platform="slack", workspace="TFAKE001", channel="GPLANS01")
    texts, members, meta = asyncio.run(_read(db, general))
    assert len(texts) >= 2 and not any("Deployed" in t for t in texts)
    assert members == {"UALICE01", "UCARL003"}  # bob left in the export
    assert meta["name"] == "general" and meta["is_private"] is False
    texts, members, meta = asyncio.run(_read(db, plans))
    assert texts == ["Surprise party for Carl on the 10th"]
    assert members == {"UALICE01", "UBOB0002"} and meta["is_private"] is True


@pytest.mark.parametrize(
    ("kind", "content"),
    [
        ("discord-export", b"{not json"),
        ("discord-export", b'{"guild": {"id": "1"}, "messages": []}'),
        ("slack-export", b"PK not really a zip"),
        ("slack-export", None),  # missing file
        ("discord-export", None),
    ],
)
def test_bad_export_files_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, content: bytes | None
):
    path = tmp_path / "bad.file"
    if content is not None:
        path.write_bytes(content)
    assert main(["--db", str(tmp_path / "x.db"), "import", kind, str(path)]) == 2
    err = stderr(capsys)
    assert err.startswith("error:") and "Traceback" not in err


def test_empty_discord_export_folder_is_a_user_error(tmp_path: Path, capsys):
    (tmp_path / "exports").mkdir()
    argv = ["--db", str(tmp_path / "x.db"), "import", "discord-export", str(tmp_path / "exports")]
    assert main(argv) == 2
    assert "no *.json" in stderr(capsys)


# --- discord-sync -------------------------------------------------------------------------------


def _settings(standin: DiscordStandIn | None, tmp_path: Path, token: str | None = "t") -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=tmp_path / "x.db",
        discord_token=token,
        discord_api_url=standin.api_base if standin else "http://127.0.0.1:9/api/v10",
    )


@pytest.mark.e2e
async def test_sync_commands_registers_recall_globally_and_per_guild(tmp_path: Path):
    standin = await DiscordStandIn().start()
    try:
        names = ["recall", "memory", "memory-admin", "Ask SpeakerMem about this"]
        assert await sync_commands(_settings(standin, tmp_path), GUILD_ID) == names
        synced = {
            c["name"]: c for c in standin.commands[f"applications/{APP_ID}/guilds/{GUILD_ID}"]
        }
        command = synced["recall"]
        (option,) = command["options"]
        assert option["name"] == "question" and option["required"] is True
        assert option["type"] == 3 and option["max_length"] == 2000
        assert command["description"].startswith("Ask what this channel remembers")
        # members' /memory is open to all; /memory-admin defaults to Manage Server (1 << 5)
        assert synced["memory"]["default_member_permissions"] is None
        assert synced["memory-admin"]["default_member_permissions"] == 32
        assert await sync_commands(_settings(standin, tmp_path), None) == names
        assert [c["name"] for c in standin.commands[f"applications/{APP_ID}"]] == names
        # the gateway was never opened: sync is REST only
        assert standin.identify is None
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_discord_sync_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    commands_platform.register(sub, lambda p: None)
    args = parser.parse_args(["discord-sync", "--guild", GUILD_ID])
    assert args.handler == "speakermem.integrations.cli.commands_platform:cmd_discord_sync"
    standin = await DiscordStandIn().start()
    try:
        assert await commands_platform.cmd_discord_sync(_settings(standin, tmp_path), args) == 0
        assert (
            'registered /recall, /memory, /memory-admin, "Ask SpeakerMem about this" (message'
            " menu) in guild" in stderr(capsys)
        )
    finally:
        await standin.close()
    with pytest.raises(CliError, match="cannot reach Discord"):
        await commands_platform.cmd_discord_sync(_settings(None, tmp_path), args)
    with pytest.raises(ValueError, match="SPEAKERMEM_DISCORD_TOKEN"):
        await commands_platform.cmd_discord_sync(_settings(None, tmp_path, token=None), args)
    bad = parser.parse_args(["discord-sync", "--guild", "general"])
    with pytest.raises(CliError, match="numeric"):
        await commands_platform.cmd_discord_sync(_settings(None, tmp_path), bad)
