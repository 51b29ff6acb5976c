"""Platform commands: `speakermem discord-sync` and the export half of `speakermem import`.

discord.py and the export readers are imported inside the handlers, so registering
these commands costs `speakermem --help` nothing.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.render import advance, err_console, progress_bar
from speakermem.memory.models import Scope

if TYPE_CHECKING:
    from speakermem.bot.settings import Settings
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.models import MessageEvent, RosterEvent

_SHOWN_ERRORS = 5


def register(sub: argparse._SubParsersAction, common: Callable) -> None:  # type: ignore[type-arg]
    """Add the platform commands to the `speakermem` parser."""
    p = sub.add_parser(
        "discord-sync",
        help="register /recall, /memory and /memory-admin with Discord",
        description="Log in with SPEAKERMEM_DISCORD_TOKEN and register the application "
        "commands: globally, or in one guild with --guild (available at once there; handy "
        "while testing). Run it after installing or upgrading, not on every start.",
    )
    common(p)
    p.add_argument("--guild", default=None, metavar="ID", help="register in this guild only")
    p.set_defaults(handler="speakermem.integrations.cli.commands_platform:cmd_discord_sync")


async def cmd_discord_sync(settings: Settings, args: argparse.Namespace) -> int:
    import discord

    from speakermem.integrations.discord.adapter import sync_commands

    guild = args.guild
    if guild is not None and not str(guild).isdigit():
        raise CliError(f"--guild must be a numeric guild id, not {guild!r}")
    try:
        names = await sync_commands(settings, guild)
    except discord.LoginFailure as exc:
        raise CliError("Discord rejected the token (SPEAKERMEM_DISCORD_TOKEN)") from exc
    except discord.HTTPException as exc:
        raise CliError(f"Discord refused the command sync: {exc}") from exc
    except OSError as exc:  # aiohttp.ClientConnectorError is one
        raise CliError(f"cannot reach Discord at {settings.discord_api_url}: {exc}") from exc
    where = f"guild {guild}" if guild else "all guilds (may take a while to appear)"
    # a slash command's name has no spaces; a message menu command's is shown quoted
    shown = [f'"{n}" (message menu)' if " " in n else "/" + n for n in names]
    err_console.print(f"registered {', '.join(shown) or 'no commands'} in {where}")
    return 0


# --- platform exports -----------------------------------------------------------------------


def _split(events: Iterator[Any], roster: list[RosterEvent]) -> Iterator[MessageEvent]:
    """Messages stream on to ingestion; roster events are kept (in order) for afterwards.

    Bot messages, disabled channels, opted-out and forgotten members are the engine's
    admission gate's to turn away (as for live events); their outcomes are counted."""
    from speakermem.memory.models import MessageEvent, RosterEvent

    for event in events:
        if isinstance(event, MessageEvent):
            yield event
        elif isinstance(event, RosterEvent):
            roster.append(event)


async def _ingest(
    engine: MemoryEngine,
    events: Iterator[Any],
    total: int,
    label: str,
    roster: list[RosterEvent],
    outcomes: Counter[str],
) -> None:
    with progress_bar(label, total) as bar:
        done = await engine.ingest_many(
            _split(events, roster), on_progress=lambda n: advance(bar, n)
        )
    outcomes.update(o.status.value for o in done)


async def _apply_roster(engine: MemoryEngine, roster: list[RosterEvent]) -> None:
    if not roster:
        return
    with progress_bar("roster", len(roster)) as bar:
        for event in roster:
            await engine.roster(event)
            advance(bar, 1)


async def _apply_snapshots(engine: MemoryEngine, snapshots: list[_Snapshot]) -> None:
    """One transaction per channel, whatever its member count."""
    if not snapshots:
        return
    with progress_bar("rosters", len(snapshots)) as bar:
        for snap in snapshots:
            await engine.sync_members(snap.scope, snap.members, snap.at)
            advance(bar, 1)


def _report(title: str, lines: list[str]) -> None:
    if not lines:
        return
    err_console.print(title, markup=False, highlight=False)
    for line in lines[:_SHOWN_ERRORS]:
        err_console.print(f"  {line}", markup=False, highlight=False)
    if len(lines) > _SHOWN_ERRORS:
        err_console.print(f"  … and {len(lines) - _SHOWN_ERRORS} more (see the log)")


class _Snapshot(Protocol):
    """A channel's members as of an export (`integrations.slack.export.ChannelRoster`)."""

    @property
    def scope(self) -> Scope: ...
    @property
    def members(self) -> list[tuple[str, str | None, bool]]: ...
    @property
    def at(self) -> datetime | None: ...


@dataclass
class _Plan:
    """What an export holds: channel metadata, roster snapshots, event streams, and what
    is skipped (malformed records, files not imported, parts the importer leaves out)."""

    metas: list[tuple[Scope, str | None, bool | None]] = field(default_factory=list)
    snapshots: list[_Snapshot] = field(default_factory=list)
    sources: list[tuple[str, Iterator[Any], int]] = field(default_factory=list)
    error_lists: list[list[str]] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)
    """'file: reason' for each file that could not be read at all."""
    left_out: list[str] = field(default_factory=list)
    """Parts of the export deliberately not imported, and why."""


def _guarded(name: str, events: Iterator[Any], bad_files: list[str]) -> Iterator[Any]:
    """A file's events until it turns out unreadable part-way: then it is reported as a bad
    file and the import goes on with the next one (what it gave stays: ids make a re-run
    add only what is missing)."""
    from speakermem.integrations.payload import PayloadError

    try:
        yield from events
    except PayloadError as exc:
        bad_files.append(f"{name}: {exc}")


def _open_slack(plan: _Plan, path: Path, workspace: str | None) -> None:
    from speakermem.integrations.slack.export import read_slack_export

    export = read_slack_export(path, workspace=workspace or "export")
    for ch in export.channels:
        scope = Scope(platform="slack", workspace=export.team_id, channel=ch.id)
        plan.metas.append((scope, ch.name, ch.is_private))
    plan.snapshots.extend(export.rosters())
    label = f"importing {path.name}"
    plan.sources.append((label, _guarded(path.name, export.events(), plan.bad_files), len(export)))
    plan.error_lists.append(export.errors)
    for item in export.skipped:
        why = (
            "canvas: the export lists no members for it, so no one could be allowed to read it"
            if item.kind == "canvas"
            else "direct messages are not imported"
        )
        plan.left_out.append(f"{item.name} ({item.files} file(s)): {why}")


def _open_discord(plan: _Plan, path: Path) -> None:
    from speakermem.integrations.discord.export import read_discord_export
    from speakermem.integrations.discord.export_folder import read_discord_export_folder

    if path.is_dir():
        folder = read_discord_export_folder(path)
        exports = folder.exports
        plan.bad_files.extend(f"{b.path.relative_to(path)}: {b.reason}" for b in folder.bad)
        plan.left_out.extend(folder.notes)
        if not exports and not folder.bad:
            raise CliError(f"{path}: no *.json DiscordChatExporter files in this folder")
    else:
        exports = [read_discord_export(path)]
    for e in exports:
        if not len(e):
            continue
        if e.channel.thread_id is None:  # a thread file's name is the thread's
            scope = Scope(platform="discord", workspace=e.guild_id, channel=e.channel.channel)
            plan.metas.append((scope, e.channel.name, None))
        label = f"importing {e.path.name}"
        plan.sources.append((label, _guarded(e.path.name, e.events(), plan.bad_files), len(e)))
        plan.error_lists.append(e.errors)


def _open_export(kind: str, path: Path, workspace: str | None) -> _Plan:
    """Open (and index) the export; reading is synchronous, like the readers themselves."""
    plan = _Plan()
    if kind == "slack-export":
        _open_slack(plan, path, workspace)
    elif kind == "discord-export":
        _open_discord(plan, path)
    else:
        raise CliError(f"unknown export kind {kind!r}")
    return plan


async def import_platform_export(
    settings: Settings, kind: str, path: Path, args: argparse.Namespace, *, embed: bool
) -> int:
    """`speakermem import slack-export ZIP-or-FOLDER` / `discord-export FILE-or-FOLDER`.

    Idempotent: messages already stored are counted as duplicates. Channel names and
    (for Slack) privacy and rosters come from the export; Discord exports carry no
    membership, so channel rosters fill in when the bot connects to the guild. Files that
    cannot be read are listed and make the exit status 1; everything else is imported.
    """
    from speakermem.integrations.app import open_engine
    from speakermem.integrations.cli.ingest import embed_all, outcomes_line

    plan = _open_export(kind, path, getattr(args, "workspace", None))
    roster: list[RosterEvent] = []
    outcomes: Counter[str] = Counter()
    async with open_engine(settings, with_embedder=embed, foreground_embedding=True) as engine:
        for scope, name, private in plan.metas:
            await engine.set_channel_meta(scope, name=name, is_private=private)
        await _apply_snapshots(engine, plan.snapshots)
        for label, events, total in plan.sources:
            await _ingest(engine, events, total, label, roster, outcomes)
        await _apply_roster(engine, roster)
        embedded = await embed_all(engine) if embed else 0
    channels = len({scope for scope, _, _ in plan.metas}) or len(plan.sources)
    members = sum(len(s.members) for s in plan.snapshots)
    err_console.print(
        f"imported {outcomes['stored']} messages ({outcomes_line(outcomes)}) into {channels} "
        f"channel(s); {len(plan.snapshots)} roster snapshot(s) of {members} member(s); "
        f"{len(roster)} join/leave events; embedded {embedded}",
        markup=False,
    )
    _report(
        f"skipped {sum(len(e) for e in plan.error_lists)} malformed record(s):",
        [e for errs in plan.error_lists for e in errs],
    )
    _report(f"not imported ({len(plan.left_out)}):", plan.left_out)
    if kind == "discord-export":
        err_console.print(
            "note: Discord exports carry no channel membership; rosters (who may recall what) "
            "fill in when the bot connects to the guild",
            markup=False,
        )
    if plan.bad_files:
        _report(
            f"{len(plan.bad_files)} file(s) could not be imported (the others were; fix or "
            "re-export these and run the import again):",
            plan.bad_files,
        )
        return 1
    return 0
