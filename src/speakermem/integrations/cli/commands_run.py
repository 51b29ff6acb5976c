"""`speakermem run` and `speakermem config`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.memory.url_masking import mask_url


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="run the bot on every configured platform (Slack, Discord or both)",
        description="Start the configured platforms, the Writer scheduler and background "
        "embedding. SIGTERM or Ctrl-C drains in-flight work and closes the database.",
    )
    common(p)
    p.set_defaults(handler="speakermem.integrations.cli.commands_run:cmd_run")
    p = sub.add_parser(
        "config",
        help="show the effective settings (secrets masked)",
        description="Print the settings read from SPEAKERMEM_* variables and .env.",
    )
    common(p)
    p.set_defaults(handler="speakermem.integrations.cli.commands_run:cmd_config")


async def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    # the runtime (both platforms' libraries) is imported by the commands that need it
    from speakermem.integrations.runtime import NothingToRun, run

    try:
        return await run(settings)
    except NothingToRun as exc:
        raise CliError(str(exc)) from exc


async def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.integrations.runtime import configured_platforms

    data = json.loads(settings.model_dump_json())
    for name, value in data.items():  # a URL setting may carry user:pass@ or ?api-key=
        if name.endswith("_url") and isinstance(value, str):
            data[name] = mask_url(value)
    data["platforms"] = configured_platforms(settings)
    data["llm_configured"] = settings.llm_configured
    print(json.dumps(data, indent=2, default=str))
    return 0
