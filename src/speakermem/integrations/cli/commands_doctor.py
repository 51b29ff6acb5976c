"""`speakermem doctor`: settings, database, embedder, LLM endpoint and platform tokens."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.render import console
from speakermem.integrations.doctor_checks import Check, exit_code

MARK = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]", "skip": "skip"}


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="check settings, database, embedder, LLM endpoint and platform tokens",
        description="Check everything the bot needs and print a fix for each failure. Exits 1 "
        "when a check fails (e.g. the LLM URL does not answer), 0 otherwise, also when only "
        "warnings remain (e.g. no LLM configured).",
    )
    common(p)
    p.add_argument(
        "--offline",
        action="store_true",
        help="skip the network calls to Slack (auth.test) and Discord (users/@me)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="settings, database and LLM only (no embedder load, no platform calls)",
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(handler="speakermem.integrations.cli.commands_doctor:cmd_doctor")


def render(checks: list[Check]) -> None:
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("area")
    table.add_column("check")
    table.add_column("detail", overflow="fold")
    for c in checks:
        table.add_row(MARK[c.status], c.area, c.name, c.detail)
    console.print(table)
    fixes = [c for c in checks if c.fix and c.status in ("fail", "warn")]
    for c in fixes:
        console.print(f"{MARK[c.status]} {c.area} {c.name}: fix: ", end="")
        console.print(c.fix, markup=False, highlight=False)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    console.print(f"{failed} failed, {warned} warning(s), {len(checks) - failed - warned} ok")


async def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    # imported here: the checks pull in the OpenAI client, which every other command's
    # start would otherwise pay for
    from speakermem.integrations.doctor import run_checks

    checks = await run_checks(
        settings, network=not (args.offline or args.quick), embedder=not args.quick
    )
    if args.json:
        print(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        render(checks)
    return exit_code(checks)
