"""`speakermem`: the command-line entry point (argparse; `--help` on every command)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from speakermem import __version__
from speakermem.bot.settings import Settings, load_settings
from speakermem.integrations.cli.errors import describe, user_errors
from speakermem.integrations.cli.render import err_console

Handler = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]


def _common(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--db and --log-level, accepted before or after the command name.

    Sub-commands use SUPPRESS so an option given before the command is not reset.
    """
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--db",
        type=Path,
        default=default,
        help="SQLite database file (default: $SPEAKERMEM_DB_PATH or ./speakermem.db)",
    )
    parser.add_argument("--log-level", default=default, help="DEBUG, INFO, WARNING (default INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speakermem",
        description="SpeakerMem remembers group conversations on Discord and Slack and answers "
        "/recall questions with cited messages.",
        epilog="Settings come from SPEAKERMEM_* environment variables (see .env.example).",
    )
    parser.add_argument("--version", action="version", version=f"speakermem {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "import",
        help="import history: benchmark datasets or platform exports",
        description="Import a dataset or a platform export into the store (idempotent).",
    )
    _common(p)
    p.add_argument(
        "kind",
        choices=["locomo", "friendsqa", "socialmembench", "slack-export", "discord-export"],
        help="format of PATH",
    )
    p.add_argument(
        "path",
        help="what to import: a dataset JSON, a Slack export (ZIP or folder), a "
        "DiscordChatExporter file or folder, or a SocialMemBench folder",
    )
    p.add_argument("--no-embed", action="store_true", help="skip embedding (lexical search only)")
    p.add_argument("--workspace", default=None, help="workspace id for exports that lack one")
    p.set_defaults(handler="speakermem.integrations.cli.commands_store:cmd_import")

    p = sub.add_parser(
        "search",
        help="hybrid search of the verbatim messages of a channel",
        description="Rank a channel's messages for a query (FTS5 BM25 + vectors, fused by RRF).",
    )
    _common(p)
    p.add_argument("query", help="free text; any characters are safe")
    p.add_argument("--channel", required=True, help="channel id or name")
    p.add_argument("--platform", default=None, help="platform, when the channel id is ambiguous")
    p.add_argument("--limit", type=int, default=10, help="results to show (default 10)")
    p.add_argument(
        "--mode", choices=["hybrid", "lexical", "dense"], default="hybrid", help="ranking"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler="speakermem.integrations.cli.commands_store:cmd_search")

    p = sub.add_parser(
        "stats",
        help="counts of messages, records, segments and Writer activity",
        description="Show what the store holds and what the Writer did.",
    )
    _common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="speakermem.integrations.cli.commands_store:cmd_stats")

    p = sub.add_parser(
        "reembed",
        help="embed every message and record again with the configured embedder",
        description="Drop the store's vectors and embed every message and record again with "
        "SPEAKERMEM_EMBEDDER, which becomes the store's embedder: the way to another model "
        "(a store whose vectors another model wrote is refused at start).",
    )
    _common(p)
    p.set_defaults(handler="speakermem.integrations.cli.commands_store:cmd_reembed")

    for register in _EXTRA_COMMANDS:
        register(sub, _common)
    return parser


_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction, Callable], None]] = []  # type: ignore[type-arg]


def _register_extra() -> None:
    """Command groups live in their own modules; each contributes a `register` function."""
    from speakermem.integrations.cli import (
        commands_demo,
        commands_discord,
        commands_doctor,
        commands_governance,
        commands_migrate,
        commands_model,
        commands_ops,
        commands_platform,
        commands_recall,
        commands_run,
        commands_web,
        commands_worker,
        commands_writer,
    )

    _EXTRA_COMMANDS.extend(
        [
            commands_recall.register,
            commands_writer.register,
            commands_worker.register,
            commands_platform.register,
            commands_run.register,
            commands_demo.register,
            commands_doctor.register,
            commands_model.register,
            commands_discord.register,
            commands_ops.register,
            commands_governance.register,
            commands_migrate.register,
            commands_web.register,
        ]
    )


_register_extra()


def _resolve(path: str) -> Handler:
    module_name, func = path.split(":")
    module = __import__(module_name, fromlist=[func])
    return getattr(module, func)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(db_path=args.db)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "SPEAKERMEM_" + str(first["loc"][0]).upper() if first["loc"] else "settings"
        err_console.print(f"error: invalid setting {field}: {first['msg']}")
        return 2
    from speakermem.integrations.ops.logs import configure_logging

    configure_logging(args.log_level or settings.log_level, settings.log_format)
    handler = _resolve(args.handler) if isinstance(args.handler, str) else args.handler
    try:
        return asyncio.run(handler(settings, args))
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:
        if not isinstance(exc, user_errors()):
            raise
        err_console.print(f"error: {describe(exc)}", markup=False, highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
