"""`speakermem write`, `records`, `eval-writer` and `replay`: the System 2 commands.

Heavy imports (the Writer, scipy for the metric, dataset readers) happen inside the handlers,
so registering these commands costs `speakermem --help` nothing.

State files (`records --export`, the PRED of `eval-writer`) are `{"records": [...]}` with
owner and source as **display names** (GROUP stays GROUP): that is how a hand-made gold or a
LoCoMo-derived one names people, and the metric compares them case-insensitively. The
roster ids travel beside them as `owner_id` / `source_id` (ignored by the metric).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speakermem.bot.settings import Settings
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.models import DerivedRecord, Scope, Segment
    from speakermem.memory.writer.runner import FlushOutcome, Writer

STATE_FORMAT = "speakermem-state-v1"
_FAR_FUTURE_S = 10**9
"""Added to `now` so a manual `write` retries segments that are still backing off."""


def register(sub: argparse._SubParsersAction, common: Callable) -> None:  # type: ignore[type-arg]
    """Add the System 2 commands to the `speakermem` parser."""
    p = sub.add_parser(
        "write",
        help="run the Writer now on a channel's pending messages",
        description="Close the channel's open segment and write every pending segment through "
        "the configured LLM (SPEAKERMEM_LLM_BASE_URL), oldest first, ignoring retry backoff.",
    )
    common(p)
    p.add_argument("--channel", default=None, help="channel id or name")
    p.add_argument("--platform", default=None, help="platform, when the channel id is ambiguous")
    p.add_argument("--all", action="store_true", help="every channel instead of one")
    p.set_defaults(handler="speakermem.integrations.cli.commands_writer:cmd_write")

    p = sub.add_parser(
        "records",
        help="list a person's derived records, or export the current state",
        description="Show the System 2 records owned by a user (id, display name or alias): "
        "chain heads by default, whole update chains with --full. --export writes the active "
        "heads of every channel (or --channel) as a state JSON for `eval-writer`.",
    )
    common(p)
    p.add_argument("--owner", default=None, help="user id, display name or alias (or GROUP)")
    p.add_argument("--channel", default=None, help="only this channel (id or name)")
    p.add_argument("--platform", default=None, help="platform, when the channel id is ambiguous")
    p.add_argument("--full", action="store_true", help="whole chains, oldest to newest")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the active heads as a state JSON (owner/source as display names); "
        "with --full, superseded nodes too",
    )
    p.set_defaults(handler="speakermem.integrations.cli.commands_writer:cmd_records")

    p = sub.add_parser(
        "eval-writer",
        help="score a derived state against a reference (SpeakerLevenshtein)",
        description='Compare two state JSON files (a list of records or {"records": [...]}, '
        "each with owner, source, layer, content) and print per-owner P/R/F.",
    )
    common(p)
    p.add_argument("pred", type=Path, help="predicted state (e.g. from `records --export`)")
    p.add_argument("gold", type=Path, help="reference state")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="speakermem.integrations.cli.commands_writer:cmd_eval_writer")

    p = sub.add_parser(
        "replay",
        help="fill System 2 from a dataset's observations, without an LLM",
        description="Import the dataset (idempotent), then replay its observations as Writer "
        "ADDs through the same validation and evidence gate as a live Writer.",
    )
    common(p)
    p.add_argument("kind", choices=["locomo"], help="format of PATH")
    p.add_argument("path", type=Path, help="dataset file")
    p.add_argument("--no-embed", action="store_true", help="skip embedding messages and records")
    p.set_defaults(handler="speakermem.integrations.cli.commands_writer:cmd_replay")


# ---------------------------------------------------------------- helpers


def _require_db(settings: Settings) -> None:
    from speakermem.integrations.cli.targets import require_store

    require_store(settings)  # the SQLite file, or nothing to check for SPEAKERMEM_DB_URL


async def _names(engine: MemoryEngine, scopes: set[Scope]) -> dict[tuple[Scope, str], str]:
    """(scope, user id) -> display name, for every roster member of the scopes."""
    out: dict[tuple[Scope, str], str] = {}
    for scope in scopes:
        for m in await engine.members(scope, include_left=True):
            out[(scope, m.user_id)] = m.display_name
    return out


def _who(names: dict[tuple[Scope, str], str], scope: Scope, uid: str) -> str:
    from speakermem.memory.models import GROUP

    return uid if uid == GROUP else names.get((scope, uid), uid)


def _fmt_rejected(rejected: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(rejected.items())) or "none"


# ---------------------------------------------------------------- write


async def _write_channel(
    writer: Writer, segments: list[Segment], report: Callable[[Segment, FlushOutcome], None]
) -> list[FlushOutcome]:
    """One channel's segments in order; stop at the first deferral to keep that order."""
    out = []
    for seg in segments:
        outcome = await writer.flush(seg)
        report(seg, outcome)
        out.append(outcome)
        if outcome.status in ("deferred", "lost"):  # "lost": a worker's live lease holds it
            break
    return out


async def cmd_write(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.integrations.app import open_engine, open_llm
    from speakermem.integrations.cli.errors import CliError
    from speakermem.integrations.cli.render import advance, console, err_console, progress_bar
    from speakermem.integrations.cli.targets import resolve_channel
    from speakermem.memory.writer.runner import Writer

    if not args.channel and not args.all:
        raise CliError("pass --channel NAME (or --all for every channel)")
    if args.channel and args.all:
        raise CliError("pass either --channel or --all, not both")
    if not settings.llm_configured:
        raise CliError(
            "no LLM configured: set SPEAKERMEM_LLM_BASE_URL (an OpenAI-compatible endpoint, "
            "e.g. http://localhost:8000/v1) and SPEAKERMEM_LLM_MODEL; without an LLM the "
            "Writer is off (see `speakermem replay` for offline System 2 data)"
        )
    _require_db(settings)
    async with open_llm(settings) as llm, open_engine(settings) as engine:
        assert llm is not None
        scope = None if args.all else await resolve_channel(engine, args.channel, args.platform)
        if scope is None:
            closed = await engine.segments.close_idle(0.0)
        else:
            closed = await engine.segments.close_channel(scope)
        due = await engine.segments.due(
            limit=1_000_000, now=time.time() + _FAR_FUTURE_S, scope=scope
        )
        where = "every channel" if scope is None else str(scope)
        if not due:
            console.print(f"nothing to write in {where}: no pending segments")
            return 0
        err_console.print(
            f"writing {len(due)} segment(s) of {where} with {llm.model} "
            f"({closed} open segment(s) closed)"
        )
        writer = Writer(engine, llm, settings.memory_config().writer)
        before = await engine.admin.writer_stats()
        by_channel: dict[tuple[str, str, str], list[Segment]] = {}
        for seg in due:
            by_channel.setdefault(seg.scope.key(), []).append(seg)
        slots = asyncio.Semaphore(writer.cfg.concurrency)
        started = time.perf_counter()
        with progress_bar("writing segments", len(due)) as bar:

            def report(seg: Segment, o: FlushOutcome) -> None:
                advance(bar, 1)
                if o.status == "deferred":
                    detail = f"deferred: {o.error}"
                else:
                    detail = (
                        f"{o.status}: proposed {o.proposed}, accepted {o.accepted}, "
                        f"rejected {_fmt_rejected(o.rejected)}"
                    )
                console.print(
                    f"segment {seg.id} {seg.scope} ({seg.n_messages} msgs) {detail}; "
                    f"{o.latency_ms:.0f} ms",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )

            async def channel(segs: list[Segment]) -> list[FlushOutcome]:
                async with slots:
                    return await _write_channel(writer, segs, report)

            results = await asyncio.gather(*(channel(s) for s in by_channel.values()))
        wall_s = time.perf_counter() - started
        after = await engine.admin.writer_stats()
    outcomes = [o for chan in results for o in chan]
    _print_write_totals(outcomes, before, after, wall_s, len(due))
    deferred = [o for o in outcomes if o.status == "deferred"]
    if deferred:
        err_console.print(
            f"{len(deferred)} channel(s) deferred ({deferred[0].error}); their segments stay "
            "pending and are retried by the bot or the next `speakermem write`",
            markup=False,
            highlight=False,
        )
        return 1
    return 0


def _print_write_totals(
    outcomes: list[FlushOutcome],
    before: dict[str, Any],
    after: dict[str, Any],
    wall_s: float,
    n_due: int,
) -> None:
    from rich.table import Table

    from speakermem.integrations.cli.render import console

    status = Counter(o.status for o in outcomes)
    rejected: Counter[str] = Counter()
    for o in outcomes:
        rejected.update(o.rejected)
    latencies = [o.latency_ms for o in outcomes if o.status != "deferred"]
    table = Table(title="writer totals")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("segments written", str(status["committed"] + status["empty"]))
    table.add_row("segments deferred", str(status["deferred"]))
    table.add_row("segments not reached", str(n_due - len(outcomes)))
    table.add_row("proposed", str(sum(o.proposed for o in outcomes)))
    table.add_row("accepted", str(sum(o.accepted for o in outcomes)))
    table.add_row("rejected", str(sum(rejected.values())))
    for reason, n in sorted(rejected.items()):
        table.add_row(f"  rejected: {reason}", str(n))
    table.add_row("prompt tokens", str(int(after["prompt_tokens"]) - int(before["prompt_tokens"])))
    table.add_row(
        "completion tokens",
        str(int(after["completion_tokens"]) - int(before["completion_tokens"])),
    )
    mean = sum(latencies) / len(latencies) if latencies else 0.0
    table.add_row("mean latency per segment", f"{mean:.0f} ms")
    table.add_row("wall time", f"{wall_s:.1f} s")
    console.print(table)


# ---------------------------------------------------------------- records


def _record_json(r: DerivedRecord, names: dict[tuple[Scope, str], str]) -> dict[str, Any]:
    return {
        "id": r.id,
        "channel": str(r.scope),
        "layer": r.layer.value,
        "owner": _who(names, r.scope, r.owner),
        "source": _who(names, r.scope, r.source),
        "owner_id": r.owner,
        "source_id": r.source,
        "content": r.content,
        "event": r.event,
        "time": r.time.isoformat(),
        "session": r.session_id,
        "state": r.state.value,
        "from_ids": list(r.from_ids),
        "supersedes": r.supersedes,
        "superseded_by": r.superseded_by,
        "chain_root": r.chain_root,
        "writer_model": r.writer_model,
    }


async def export_state(
    engine: MemoryEngine, path: Path, *, scope: Scope | None = None, full: bool = False
) -> int:
    """Write the channels' active heads (all nodes with `full`) as a state JSON; returns n."""
    scopes = [scope] if scope is not None else [c["scope"] for c in await engine.admin.channels()]
    pks = await engine.channel_pks(scopes)
    records = await engine.admin.record_heads(pks)
    if full:
        seen = {r.id for r in records}
        for head in list(records):
            records.extend(r for r in await engine.admin.record_chain(head.id) if r.id not in seen)
    records.sort(key=lambda r: (str(r.scope), r.chain_root, r.id))
    names = await _names(engine, {r.scope for r in records})
    doc = {
        "format": STATE_FORMAT,
        "exported_at": datetime.now(UTC).isoformat(),
        "owner_field": "display_name",
        "records": [_record_json(r, names) for r in records],
    }
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    await asyncio.to_thread(path.write_text, text, encoding="utf-8")
    return len(records)


async def cmd_records(settings: Settings, args: argparse.Namespace) -> int:
    from rich.table import Table

    from speakermem.integrations.app import open_engine
    from speakermem.integrations.cli.errors import CliError
    from speakermem.integrations.cli.render import console, err_console, fmt_time
    from speakermem.integrations.cli.targets import resolve_channel
    from speakermem.memory.models import RecordState

    if args.owner is None and args.export is None:
        raise CliError("pass --owner NAME to list records, or --export PATH to write a state")
    _require_db(settings)
    async with open_engine(settings, with_embedder=False) as engine:
        scope = await resolve_channel(engine, args.channel, args.platform) if args.channel else None
        if args.export is not None:
            n = await export_state(engine, args.export, scope=scope, full=args.full)
            err_console.print(
                f"wrote {n} record(s) to {args.export} (owner/source as display names)",
                markup=False,
                highlight=False,
            )
            if args.owner is None:
                return 0
        records = await engine.admin.records_owned_by(args.owner)
        if scope is not None:
            records = [r for r in records if r.scope.key() == scope.key()]
        if not args.full:
            records = [r for r in records if r.state is RecordState.ACTIVE]
        names = await _names(engine, {r.scope for r in records})
    if args.json:
        print(json.dumps([_record_json(r, names) for r in records], indent=2, ensure_ascii=False))
        return 0
    if not records:
        console.print(f"no derived records owned by {args.owner!r}", markup=False)
        return 0
    mode = "whole chains" if args.full else "heads"
    table = Table(title=f"records owned by {args.owner} ({mode})")
    many = len({r.scope for r in records}) > 1
    cols = ("channel",) * many + ("id", "chain", "layer", "source", "content", "time", "state")
    for col in (*cols, "from"):
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(
            *((str(r.scope),) * many),
            str(r.id),
            str(r.chain_root) if r.chain_root != r.id or r.superseded_by else "-",
            r.layer.value,
            _who(names, r.scope, r.source),
            r.content,
            fmt_time(r.time),
            r.state.value,
            ", ".join(r.from_ids),
        )
    console.print(table)
    return 0


# ---------------------------------------------------------------- eval-writer


async def cmd_eval_writer(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.memory.eval.speaker_levenshtein import (
        chain_score,
        format_report,
        load_state,
        memory_reward,
        speaker_levenshtein,
        update_edges,
    )

    pred = load_state(args.pred)
    gold = load_state(args.gold)
    result = speaker_levenshtein(pred, gold)
    chain = chain_score(update_edges(pred), update_edges(gold))
    reward = memory_reward(result.score, chain)
    if args.json:
        out = {
            "pred": str(args.pred),
            "gold": str(args.gold),
            "speaker_levenshtein": result.model_dump(),
            "chain_score": chain,
            "memory_reward": reward,
        }
        print(json.dumps(out, indent=2))
        return 0
    print(format_report(result))
    print(f"chain score = {chain:.4f}  memory reward = {reward:.4f}")
    return 0


# ---------------------------------------------------------------- replay


async def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from rich.table import Table

    from speakermem.integrations.app import open_engine
    from speakermem.integrations.cli.ingest import embed_all, ingest_events, outcomes_line
    from speakermem.integrations.cli.render import advance, console, err_console, progress_bar
    from speakermem.memory.datasets.locomo import read_locomo
    from speakermem.memory.writer.replay import replay_observations

    dataset = read_locomo(args.path)
    embed = not args.no_embed and settings.embedder != "none"
    async with open_engine(settings, with_embedder=embed) as engine:
        outcomes = await ingest_events(engine, dataset.messages, f"importing {args.kind}")
        embedded = await embed_all(engine) if embed else 0
        err_console.print(
            f"imported {outcomes['stored']} messages ({outcomes_line(outcomes)});"
            f" embedded {embedded}"
        )
        with progress_bar("replaying observations", len(dataset.observations)) as bar:
            report = await replay_observations(
                engine, dataset.observations, on_progress=lambda n: advance(bar, n)
            )
    table = Table(title=f"replay of {args.path.name}: {report.proposed} observations")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    table.add_row("accepted", str(report.accepted))
    for reason, n in sorted(report.rejected.items()):
        table.add_row(f"rejected: {reason}", str(n))
    console.print(table)
    if report.rejected.get("duplicate_of_head"):
        err_console.print("duplicate_of_head: already replayed into this database (nothing added)")
    return 0
