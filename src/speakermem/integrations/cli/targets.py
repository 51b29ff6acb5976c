"""What a command acts on, found before it works: the store (it must exist) and a channel
by id or name, with errors that say what to do."""

from __future__ import annotations

from pathlib import Path

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.memory.engine import MemoryEngine, UnknownChannel
from speakermem.memory.models import Scope


def require_store(settings: Settings) -> None:
    """Refuse a command that reads the store when there is none yet: the SQLite file must
    exist; a PostgreSQL store (SPEAKERMEM_DB_URL) has no file, and opening it says whether
    the server and database are there."""
    if settings.db_url is None and not Path(settings.db_path).exists():
        raise CliError(f"{settings.db_path}: no database yet; run `speakermem import` first")


async def resolve_channel(engine: MemoryEngine, channel: str, platform: str | None = None) -> Scope:
    """A channel by id or name; ambiguity and unknown names are user errors."""
    found = await engine.admin.find_channel(channel, platform)
    if not found:
        known = ", ".join(sorted({c["scope"].channel for c in await engine.admin.channels()}))
        raise UnknownChannel(
            f"unknown channel {channel!r}; known channels: {known or '(none - import first)'}"
        )
    if len(found) > 1:
        options = ", ".join(str(s) for s in found)
        raise CliError(f"channel {channel!r} is ambiguous ({options}); pass --platform")
    return found[0]
