"""`speakermem import`, `search` and `stats`: the System 1 commands."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from rich.table import Table

from speakermem.bot.settings import Settings
from speakermem.integrations.app import open_engine
from speakermem.integrations.cli.ingest import embed_all, ingest_events, outcomes_line
from speakermem.integrations.cli.render import advance, console, err_console, fmt_time, progress_bar
from speakermem.integrations.cli.targets import require_store, resolve_channel
from speakermem.memory import maintenance
from speakermem.memory.datasets import DATASET_READERS, Dataset, read_dataset


async def import_dataset(settings: Settings, kind: str, path: Path, *, embed: bool) -> Dataset:
    dataset = read_dataset(kind, [path])
    async with open_engine(settings, with_embedder=embed, foreground_embedding=True) as engine:
        outcomes = await ingest_events(engine, dataset.messages, f"importing {kind}")
        embedded = await embed_all(engine) if embed else 0
    err_console.print(
        f"imported {outcomes['stored']} messages ({outcomes_line(outcomes)}) into "
        f"{len(dataset.scopes)} channel(s); embedded {embedded}; "
        f"{len(dataset.questions)} questions in the file"
    )
    return dataset


async def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.path)
    embed = not args.no_embed and settings.embedder != "none"
    if args.kind in DATASET_READERS:
        await import_dataset(settings, args.kind, path, embed=embed)
        return 0
    from speakermem.integrations.cli.commands_platform import import_platform_export

    return await import_platform_export(settings, args.kind, path, args, embed=embed)


async def cmd_reembed(settings: Settings, args: argparse.Namespace) -> int:
    if settings.embedder == "none":
        err_console.print("SPEAKERMEM_EMBEDDER is none: there is nothing to embed with")
        return 2
    async with open_engine(settings, check_embedder=False) as engine:
        name = engine.embedder.name if engine.embedder else settings.embedder
        with progress_bar(f"re-embedding with {name}", None) as bar:
            done = await engine.reembed(on_progress=lambda n: advance(bar, n))
    err_console.print(f"re-embedded {done} messages and records with {name}")
    return 0


async def cmd_search(settings: Settings, args: argparse.Namespace) -> int:
    async with open_engine(settings, with_embedder=args.mode != "lexical") as engine:
        scope = await resolve_channel(engine, args.channel, args.platform)
        mode = args.mode
        if mode != "lexical" and engine.embedder is None:
            mode = "lexical"
        hits = await engine.search(args.query, [scope], limit=args.limit, mode=mode)
        sessions = await engine.session_starts(scope, sorted({h.message.session_id for h in hits}))
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "rank": i + 1,
                        "message_id": h.message.message_id,
                        "speaker": h.message.speaker_name,
                        "speaker_id": h.message.speaker_id,
                        "time": h.message.ts.isoformat(),
                        "session": h.message.session_id,
                        "text": h.message.text,
                        "score": round(h.score, 6),
                        "lexical_rank": h.lexical_rank,
                        "dense_rank": h.dense_rank,
                    }
                    for i, h in enumerate(hits)
                ],
                indent=2,
            )
        )
        return 0
    if not hits:
        console.print(f"no matches in {scope}")
        return 0
    from datetime import UTC, datetime

    table = Table(title=f"{mode} search in {scope}: {args.query!r}", show_lines=False)
    for col in ("#", "id", "speaker", "session time", "text", "lex", "dense"):
        table.add_column(col, overflow="fold")
    for i, h in enumerate(hits, start=1):
        started = sessions.get(h.message.session_id)
        session_time = f"S{h.message.session_id} " + fmt_time(
            datetime.fromtimestamp(started, UTC) if started else h.message.ts
        )
        table.add_row(
            str(i),
            h.message.message_id,
            h.message.speaker_name,
            session_time,
            h.message.text[:300],
            str(h.lexical_rank or "-"),
            str(h.dense_rank or "-"),
        )
    console.print(table)
    return 0


async def cmd_stats(settings: Settings, args: argparse.Namespace) -> int:
    await asyncio.to_thread(require_store, settings)
    async with open_engine(settings, with_embedder=False) as engine:
        stats = await engine.stats()
        channels = await engine.admin.channels()
    if args.json:
        stats["channel_list"] = [
            {"channel": str(c["scope"]), "messages": c["messages"], "members": c["members"]}
            for c in channels
        ]
        print(json.dumps(stats, indent=2, default=str))
        return 0
    where = maintenance.where(settings.memory_config().store)
    table = Table(title=f"speakermem stats: {where}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if key != "writer":
            table.add_row(key, str(value))
    console.print(table)
    writer = stats["writer"]
    assert isinstance(writer, dict)
    wt = Table(title="writer")
    wt.add_column("what")
    wt.add_column("value", justify="right")
    for key, value in writer.items():
        if key == "rejected":
            for reason, n in value.items():
                wt.add_row(f"rejected: {reason}", str(n))
        else:
            wt.add_row(key, str(value))
    console.print(wt)
    ct = Table(title="channels")
    for col in ("channel", "messages", "members", "sessions"):
        ct.add_column(col)
    for c in channels:
        ct.add_row(str(c["scope"]), str(c["messages"]), str(c["members"]), str(c["sessions"]))
    console.print(ct)
    return 0
