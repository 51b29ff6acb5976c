"""`speakermem web`: serve the web console on its own, over the store the bot (or the demo)
wrote. `speakermem run` starts the same console when SPEAKERMEM_WEB_PORT is set."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.web import DEFAULT_PORT


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "web",
        help="serve the web console: see, search and govern what the bot remembers",
        description="Serve the web console (overview, channels, records with their sources, "
        "Ask, people, me, audit) over the store. Binds 127.0.0.1 unless --host or "
        "SPEAKERMEM_WEB_HOST says otherwise and prints the address; the operator signs in "
        "with the printed link (or SPEAKERMEM_WEB_ADMIN_TOKEN), members with Discord or "
        "Slack when their OAuth apps are configured. Without --db it serves ./speakermem.db, "
        "or the demo's ./speakermem-demo.db when only that exists.",
    )
    common(p)
    p.add_argument(
        "--host", default=None, help="address to bind (default: $SPEAKERMEM_WEB_HOST, 127.0.0.1)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port (default: $SPEAKERMEM_WEB_PORT, else {DEFAULT_PORT}; 0 picks a free one)",
    )
    p.set_defaults(handler="speakermem.integrations.cli.commands_web:cmd_web")


def choose_store(settings: Settings) -> tuple[Settings, str | None]:
    """The settings to serve, and a note when the demo's store was picked because the bot's
    is absent. A SQLite file that does not exist is an error (nothing to show)."""
    from speakermem.integrations.shell.session import DEMO_DB

    if settings.db_url is not None:
        return settings, None
    chosen = "db_path" in settings.model_fields_set
    if not chosen and not settings.db_path.exists() and DEMO_DB.exists():
        note = f"No {settings.db_path} here; serving the demo's {DEMO_DB} (--db picks another)."
        return settings.model_copy(update={"db_path": DEMO_DB}), note
    if not Path(settings.db_path).exists():
        raise CliError(
            f"no store at {settings.db_path}: run `speakermem demo` (or the bot) first, or "
            "point --db at an existing database"
        )
    return settings, None


async def serve(settings: Settings, *, host: str | None, port: int | None) -> int:
    # the server, the store and the recall pipeline are imported here, not when the CLI starts
    from speakermem.integrations.app import llm_probe, open_engine, open_llm
    from speakermem.integrations.web.server import WebConsole
    from speakermem.memory.console import ConsoleReads
    from speakermem.memory.governance.service import Governance
    from speakermem.memory.query.pipeline import RecallPipeline

    settings, note = choose_store(settings)
    if note:
        print(note)
    async with open_llm(settings) as llm, open_engine(settings) as engine:
        probe = llm_probe(llm) if llm is not None else None
        governance = Governance(engine, llm_probe=probe)
        console = WebConsole(
            settings,
            ConsoleReads(engine, llm_probe=probe),
            governance,
            recaller=RecallPipeline(engine, llm=llm),
            host=host,
            port=port if port is not None else settings.web_port,
            out=sys.stdout,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await console.start()
        except OSError as exc:
            raise CliError(
                f"cannot listen on {console.host}:{console.port} ({exc.strerror}); pick another "
                "--port"
            ) from exc
        try:
            await stop.wait()
        finally:
            await console.stop()
    return 0


async def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    return await serve(settings, host=args.host, port=args.port)
