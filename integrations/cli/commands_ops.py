"""Operations commands: `speakermem backup PATH` (and `backfill`, see there)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bot.settings import Settings
from integrations.cli.errors import CliError
from integrations.cli.render import err_console


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "backup",
        help="take a consistent online copy of the database (safe while the bot runs)",
        description="Copy the database with SQLite's VACUUM INTO: one consistent snapshot, "
        "compacted, integrity-checked, then renamed into PATH. The bot may keep running. "
        "Restore: stop the bot, copy the backup over the database file, delete its -wal and "
        "-shm files, start the bot.",
    )
    common(p)
    p.add_argument("path", type=Path, help="where to write the copy (must not exist)")
    p.set_defaults(handler="integrations.cli.commands_ops:cmd_backup")


async def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from memory.store.backup import backup_database
    from memory.store.database import StoreError
    from memory.store.driver import pick_driver

    try:
        result = await backup_database(
            Path(settings.db_path), Path(args.path), pick_driver(settings.sqlite_driver)
        )
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    err_console.print(
        f"backup written to {result.path}: {result.bytes:,} bytes, {result.messages:,} "
        f"messages, {result.records:,} records, integrity ok ({result.seconds:.1f} s)",
        markup=False,
    )
    return 0
