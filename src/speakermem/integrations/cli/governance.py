"""The governance commands' work (`speakermem channel|retention|alias|forget|export|status|
audit`): their parsers are in `commands_governance`, which the CLI imports at start; this
module, with the store and the governance service, only when one of them runs.

The same `memory.governance.Governance` the `/memory` commands use; the CLI acts as admin
with actor "cli" in the audit log. Destructive commands ask first, or need `--yes` when
stdin is not a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from speakermem.bot.governance_commands import writer_lines
from speakermem.bot.progress import cursor_line
from speakermem.bot.settings import Settings
from speakermem.bot.spill import Spill
from speakermem.integrations.app import llm_probe, open_engine, open_llm
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.render import console, err_console
from speakermem.integrations.cli.targets import resolve_channel
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import Forgotten, Receipt
from speakermem.memory.governance.service import ForgetIncomplete, Governance, GovernanceError
from speakermem.memory.models import Scope
from speakermem.memory.ports import LLM
from speakermem.memory.private_files import write_private_text

ACTOR = "cli"


# ---- helpers ----------------------------------------------------------------------------


def confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; without one, refuse unless --yes (a script must say so)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"{question} This cannot be undone: pass --yes to confirm")
    err_console.print(f"{question} This cannot be undone. Type yes to confirm: ", end="")
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("cancelled; nothing was changed")


def print_receipt(receipt: Receipt, as_json: bool) -> None:
    if as_json:
        print(json.dumps(receipt.model_dump(), indent=2, sort_keys=True))
        return
    console.print(f"{receipt.action} {receipt.target}: {receipt.summary()}", highlight=False)


async def pick_workspace(
    engine: MemoryEngine, workspace: str | None, platform: str | None
) -> tuple[str, str]:
    known = await engine.admin.workspaces()
    found = [
        (p, w)
        for p, w in known
        if (workspace is None or w == workspace) and (platform is None or p == platform)
    ]
    if not found:
        listing = ", ".join(f"{p}/{w}" for p, w in known) or "(none - import first)"
        raise CliError(f"unknown workspace {workspace or ''!r}; known: {listing}")
    if len(found) > 1:
        listing = ", ".join(f"{p}/{w}" for p, w in found)
        raise CliError(f"several workspaces ({listing}); pass --workspace (and --platform)")
    return found[0]


async def resolve_user(
    engine: MemoryEngine, user: str, workspace: str | None, platform: str | None
) -> tuple[str, str, str]:
    """(platform, workspace, user id) for USER; unknown or ambiguous is an error."""
    matches: list[tuple[str, str, str, str]] = []
    for p, w in await engine.admin.workspaces():
        if (workspace is not None and w != workspace) or (platform is not None and p != platform):
            continue
        for uid, name in await engine.admin.user_candidates(p, w, user):
            matches.append((p, w, uid, name))
        # a forgotten-name user still has an id in old rows
        named = any(m[:2] == (p, w) for m in matches)
        if not named and await engine.admin.has_spoken(p, w, user):
            matches.append((p, w, user, user))
    if not matches:
        raise CliError(f"no member {user!r}" + (f" in {workspace}" if workspace else ""))
    if len(matches) > 1:
        listing = ", ".join(f"{n} ({uid} in {p}/{w})" for p, w, uid, n in matches)
        raise CliError(f"{user!r} is ambiguous: {listing}; use the user id or --workspace")
    p, w, uid, _ = matches[0]
    return p, w, uid


async def _channel(engine: MemoryEngine, args: argparse.Namespace) -> Scope:
    return await resolve_channel(engine, args.channel, args.platform)


async def _member(engine: MemoryEngine, args: argparse.Namespace) -> tuple[str, str, str]:
    return await resolve_user(engine, args.user, args.workspace, args.platform)


def governance(settings: Settings, engine: MemoryEngine, *, llm: LLM | None = None) -> Governance:
    """The governance service; its forgets also clear the bot's spill file when one exists
    (the spill locks itself against the running bot). `llm`: the client `status` probes."""
    gov = Governance(
        engine,
        config=settings.memory_config().governance,
        llm_probe=llm_probe(llm) if llm is not None else None,
    )
    path = settings.spill_file
    if path.exists():
        spill = Spill(path, settings.spill_max_bytes)

        async def clear_spill(forgotten: Forgotten) -> int:
            return await asyncio.to_thread(spill.forget, forgotten)

        gov.forget_hooks.append(clear_spill)
    return gov


async def forgetting(run: Any) -> Receipt:
    """A forget's receipt; one that did not complete is a readable error saying so."""
    try:
        receipt: Receipt = await run
    except ForgetIncomplete as exc:
        raise CliError(str(exc)) from exc
    return receipt


# ---- commands ---------------------------------------------------------------------------


async def cmd_channel(settings: Settings, args: argparse.Namespace) -> int:
    if args.purge and args.action != "disable":
        raise CliError("--purge goes with disable")
    async with open_engine(settings, with_embedder=False) as engine:
        scope = await _channel(engine, args)
        gov = governance(settings, engine)
        if args.purge:
            confirm(f"Disable memory in {scope} and forget everything it holds?", args.yes)
            receipt = await forgetting(gov.purge_channel(scope, actor=ACTOR))
        else:
            receipt = await gov.set_channel(scope, args.action == "enable", actor=ACTOR)
        print_receipt(receipt, args.json)
    return 0


def parse_days(text: str) -> int | None:
    if text.lower() in ("off", "none"):
        return None
    if not text.isdigit() or int(text) < 1:
        raise CliError(f"DAYS must be a positive number of days or off, not {text!r}")
    return int(text)


async def cmd_retention_set(settings: Settings, args: argparse.Namespace) -> int:
    days = parse_days(args.days)
    if args.channel and args.workspace:
        raise CliError("give --channel or --workspace, not both")
    async with open_engine(settings, with_embedder=False) as engine:
        gov = governance(settings, engine)
        if args.channel:
            scope = await _channel(engine, args)
            receipt = await gov.set_retention(
                scope.platform, scope.workspace, scope.channel, days, actor=ACTOR
            )
        else:
            platform, workspace = await pick_workspace(engine, args.workspace, args.platform)
            receipt = await gov.set_retention(platform, workspace, None, days, actor=ACTOR)
        limit = "off" if days is None else f"{days} days"
        console.print(f"retention {limit} for {receipt.target}", highlight=False)
    return 0


async def cmd_retention_apply(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        receipt = await governance(settings, engine).apply_retention(actor=ACTOR)
        print_receipt(receipt, args.json)
    return 0


async def cmd_alias(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        platform, workspace, uid = await _member(engine, args)
        try:
            receipt = await governance(settings, engine).alias(
                platform, workspace, uid, args.alias, add=args.action == "add", actor=ACTOR
            )
        except GovernanceError as exc:
            raise CliError(str(exc)) from exc
        print_receipt(receipt, False)
    return 0


async def cmd_forget_message(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        scope = await _channel(engine, args)
        if not await engine.admin.holds_message(scope, args.id):
            raise CliError(f"no message {args.id!r} in {scope}")
        confirm(f"Forget message {args.id} in {scope} and every record citing it?", args.yes)
        receipt = await forgetting(
            governance(settings, engine).forget_message(scope, args.id, actor=ACTOR)
        )
        print_receipt(receipt, args.json)
    return 0


async def cmd_forget_user(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        platform, workspace, uid = await _member(engine, args)
        confirm(
            f"Forget {uid} in {platform}/{workspace}: their messages, every record built from "
            "or about them, their name and aliases?",
            args.yes,
        )
        receipt = await forgetting(
            governance(settings, engine).forget_user(platform, workspace, uid, actor=ACTOR)
        )
        print_receipt(receipt, args.json)
    return 0


async def cmd_forget_lift(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        platform, workspace = await pick_workspace(engine, args.workspace, args.platform)
        try:
            receipt = await governance(settings, engine).lift_forget(
                platform, workspace, args.user, actor=ACTOR
            )
        except GovernanceError as exc:
            raise CliError(str(exc)) from exc
        print_receipt(receipt, args.json)
    return 0


async def cmd_export_user(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        platform, workspace, uid = await _member(engine, args)
        gov = governance(settings, engine)
        data = await gov.export_user(platform, workspace, uid)
        await engine.admin.log(
            platform=platform,
            workspace=workspace,
            actor=ACTOR,
            action="export-user",
            target=uid,
            args={"out": str(args.out)},
        )
    # members' text: 0600 (its directory 0700 when made here), whatever the umask
    write_private_text(args.out, json.dumps(data, indent=2, ensure_ascii=False))
    err_console.print(
        f"wrote {args.out}: {len(data['messages'])} messages, {len(data['records'])} records"
    )
    return 0


def fmt_at(ts: float | None) -> str:
    return "never" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


async def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    async with open_llm(settings) as client, open_engine(settings, with_embedder=False) as engine:
        status = await governance(settings, engine, llm=client).status()
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    q = status["writer_queue"]
    llm = {True: "reachable", False: "NOT reachable", None: "not configured"}
    console.print(
        f"messages {status['messages']}, active records {status['records_active']}, "
        f"db {status['db_bytes'] / 1e6:.1f} MB\n"
        f"writer queue: {q['pending_segments']} pending segments, {q['rederive']} to re-derive;"
        f" last run {fmt_at(status['writer_last_run'])} ({status['writer_last_outcome'] or '-'})"
        f"\n{writer_lines(status)}"
        f"\nLLM: {llm[status['llm_reachable']]}; new channels "
        f"{'on' if status['default_channel_on'] else 'off'} by default; "
        f"{status['opted_out_members']} member(s) opted out, "
        f"{status['forgotten_people']} forgotten",
        highlight=False,
    )
    for job in status["forgets_incomplete"]:
        console.print(
            f"INCOMPLETE forget #{job['id']} ({job['action']}, started "
            f"{fmt_at(job['started_at'])}): {job['error'] or 'in progress'}; retried "
            "automatically by the running bot",
            highlight=False,
            markup=False,
        )
    table = Table("channel", "name", "memory", "retention", "messages")
    for c in status["channels"]:
        table.add_row(
            c["channel"],
            c["name"] or "-",
            ("on" if c["on"] else "off") + ("" if c["explicit"] else " (default)"),
            "-" if c["retention_days"] is None else f"{c['retention_days']} d",
            str(c["messages"]),
        )
    console.print(table)
    for entry in status.get("catchup", []):
        console.print(f"history: {cursor_line(entry)}", highlight=False, markup=False)
    return 0


async def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=False) as engine:
        entries = await governance(settings, engine).audit(args.limit)
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    table = Table("when (UTC)", "who", "action", "target", "receipt")
    for e in entries:
        table.add_row(
            fmt_at(e["at"]),
            e["actor"],
            e["action"],
            e["target"],
            Receipt(action=e["action"], counts=e["receipt"]).summary(),
        )
    console.print(table)
    return 0
