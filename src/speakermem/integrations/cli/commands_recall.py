"""`speakermem recall` and `speakermem eval`: the query pipeline from the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.render import advance, console, err_console, progress_bar
from speakermem.memory.datasets import DATASET_READERS

if TYPE_CHECKING:
    from speakermem.memory.datasets import Dataset
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.eval.harness import EvalHarness
    from speakermem.memory.models import Scope
    from speakermem.memory.query.pipeline import RecallResult

# The store, the pipeline and the evaluation harness are imported by the commands that run
# them, not when the CLI starts (every `speakermem` command would pay for them).


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "recall",
        help="ask a question about a channel and get a cited answer",
        description="Run /recall from the terminal: Project, System 1, System 2, Compose, "
        "Answer (extractive without an LLM).",
    )
    common(p)
    p.add_argument("question", help="the question (any text; treated as data)")
    p.add_argument("--channel", required=True, help="channel id or name")
    p.add_argument("--platform", default=None, help="platform, when the channel is ambiguous")
    p.add_argument(
        "--as",
        dest="asker",
        default=None,
        help="ask as this user (id or display name): only channels they can read are used",
    )
    p.add_argument("--explain", action="store_true", help="show projection, evidence, budgets")
    p.add_argument("--json", action="store_true", help="print the answer object as JSON")
    p.set_defaults(handler="speakermem.integrations.cli.commands_recall:cmd_recall")

    p = sub.add_parser(
        "eval",
        help="evaluate retrieval (and answers, with an LLM) on a benchmark dataset",
        description="Ingest a dataset and run the pipeline per question beside BM25, "
        "BM25 speaker+text, dense and hybrid controls; writes JSON and Markdown.",
    )
    common(p)
    p.add_argument("dataset", choices=sorted(DATASET_READERS), help="dataset format")
    p.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="dataset file (socialmembench: network files and/or folders of them)",
    )
    p.add_argument("--out", type=Path, required=True, help="report JSON path (.md beside it)")
    p.add_argument(
        "--writer",
        choices=["none", "replay", "llm"],
        default="none",
        help="System 2 source: none, replayed LoCoMo observations, or the LLM Writer",
    )
    p.add_argument(
        "--k", type=int, default=10, help="evidence budget: recall@K (default %(default)s)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N questions")
    p.add_argument(
        "--no-sessions",
        action="store_true",
        help="ignore the dataset's session markers (and FriendsQA's scene gaps): sessions "
        "must be inferred as in a live channel; use a fresh --db",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="socialmembench: also evaluate every network interleaved in one channel "
        "(sessions by date, speakers kept distinct), reported beside the per-network figures",
    )
    p.add_argument(
        "--ablate",
        action="store_true",
        help="also run the pipeline with each group-chat mechanism switched off, one at a "
        "time, and report the margin with and without it per network",
    )
    p.set_defaults(handler="speakermem.integrations.cli.commands_recall:cmd_eval")


async def resolve_asker(engine: MemoryEngine, scope: Scope, asker: str) -> str:
    ids = await engine.find_user(scope.platform, scope.workspace, asker)
    if not ids:
        raise CliError(f"unknown user {asker!r} in {scope.platform}/{scope.workspace}")
    if len(ids) > 1:
        raise CliError(f"user {asker!r} is ambiguous ({', '.join(ids)}); pass the user id")
    return ids[0]


def answer_json(result: RecallResult) -> dict[str, Any]:
    a = result.answer
    return {
        "text": a.text,
        "used_llm": a.used_llm,
        "stripped_citations": a.stripped_citations,
        "citations": [
            {
                "n": c.n,
                "channel": str(c.scope),
                "message_id": c.message_id,
                "speaker": c.speaker,
                "time": c.time.isoformat(),
                "link": c.link,
            }
            for c in a.citations
        ],
    }


async def cmd_recall(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.integrations.app import open_engine, open_llm
    from speakermem.integrations.cli.targets import resolve_channel
    from speakermem.memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest

    async with open_llm(settings) as llm, open_engine(settings) as engine:
        scope = await resolve_channel(engine, args.channel, args.platform)
        asker = await resolve_asker(engine, scope, args.asker) if args.asker else None
        pipeline = RecallPipeline(engine, llm=llm)
        try:
            result = await pipeline.run(RecallRequest(args.question, scope, asker=asker))
        except AccessDenied as exc:
            err_console.print(f"refused: {exc}")
            return 2
    if args.json:
        payload = answer_json(result)
        if args.explain:
            payload["explain"] = result.trace.model_dump()
        print(json.dumps(payload, indent=2, default=str))
        return 0
    console.print(result.answer.text, markup=False, highlight=False)
    console.print()
    for c in result.answer.citations:
        console.print(
            f"[{c.n}] {c.speaker}, {c.time:%Y-%m-%d %H:%M}, {c.scope.channel}/{c.message_id}"
            + (f" {c.link}" if c.link else ""),
            markup=False,
            highlight=False,
        )
    if args.explain:
        explain(result)
    return 0


async def _evaluate(
    harness: EvalHarness, dataset: Dataset, args: argparse.Namespace, label: str
) -> dict[str, Any]:
    total = len([q for q in dataset.questions if q.evidence])
    if args.limit is not None:
        total = min(total, args.limit)
    with progress_bar(f"evaluating {label}", total) as bar:
        return await harness.run(
            dataset,
            limit=args.limit,
            on_progress=lambda n: advance(bar, n),
            with_s2=args.writer != "none",
        )


def explain(result: RecallResult) -> None:
    t = result.trace
    table = Table(title="explain", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("projection", json.dumps(t.projection))
    table.add_row("breadth", t.breadth)
    table.add_row("time window", t.time_window or "-")
    table.add_row("channels", ", ".join(t.channels))
    table.add_row("rankings (pool sizes)", json.dumps(t.rankings))
    table.add_row("select", t.select)
    table.add_row("fused top 10", ", ".join(t.pool))
    table.add_row("expand anchors", ", ".join(t.anchors) or "-")
    table.add_row("ask", t.ask or "-")
    table.add_row("S1 evidence", ", ".join(t.s1_evidence) or "-")
    for row, items in t.s2_rows.items():
        table.add_row(f"S2 row {row}", " | ".join(items))
    if t.s2_people:
        table.add_row("S2 people", json.dumps(t.s2_people))
    table.add_row("budgets", json.dumps(t.budgets))
    table.add_row("cut to fit", "; ".join(t.cut) or "-")
    table.add_row("tokens", json.dumps(t.tokens))
    table.add_row("latency ms", json.dumps(t.latency_ms))
    if t.claims:
        rate = t.claims["dropped"] / t.claims["checked"] if t.claims.get("checked") else 0.0
        table.add_row(
            "claims",
            f"{json.dumps(t.claims)}; dropped rate {rate:.2f}"
            + "".join(f"\n  dropped: {c}" for c in t.dropped_claims),
        )
    if t.llm_errors:
        table.add_row("LLM fallbacks", "; ".join(t.llm_errors))
    console.print(table)


async def cmd_eval(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.integrations.app import open_engine, open_llm
    from speakermem.integrations.cli.ingest import embed_all, ingest_events
    from speakermem.memory.datasets import read_dataset
    from speakermem.memory.datasets.socialmembench import interleave
    from speakermem.memory.eval.answer_metrics import JUDGE_PROMPT_VERSION
    from speakermem.memory.eval.answer_scoring import RUBRIC_PROMPT_VERSION
    from speakermem.memory.eval.harness import (
        ABLATIONS,
        EvalHarness,
        fitted_constants,
        markdown_table,
    )
    from speakermem.memory.query.pipeline import PROMPT_VERSIONS, RecallPipeline

    dataset = read_dataset(args.dataset, args.paths, sessions=not args.no_sessions)
    if args.interleave and args.dataset != "socialmembench":
        raise CliError("--interleave is for socialmembench (networks to interleave)")
    if args.writer == "llm" and not settings.llm_configured:
        raise CliError("--writer llm needs an LLM: set SPEAKERMEM_LLM_BASE_URL")
    if args.writer == "replay" and not dataset.observations:
        raise CliError(f"{args.dataset} has no observations to replay; use --writer none")
    async with open_llm(settings) as llm, open_engine(settings) as engine:
        await ingest_events(engine, dataset.messages, f"importing {args.dataset}")
        await embed_all(engine)
        if args.writer == "replay":
            from speakermem.memory.writer.replay import replay_observations

            existing = await engine.admin.record_counts()
            if existing["records"] == 0:
                with progress_bar("replaying observations", len(dataset.observations)) as bar:
                    rep = await replay_observations(
                        engine, dataset.observations, on_progress=lambda n: advance(bar, n)
                    )
                err_console.print(
                    f"replay: {rep.accepted}/{rep.proposed} accepted; rejected {dict(rep.rejected)}"
                )
        elif args.writer == "llm":
            from speakermem.memory.writer.runner import Writer

            assert llm is not None
            for scope in dataset.scopes:
                await engine.segments.close_channel(scope)
            writer = Writer(engine, llm)
            due = len(await engine.segments.due(limit=100_000))
            with progress_bar("writing segments", due) as bar:
                await writer.flush_due(limit=100_000, on_progress=lambda _o: advance(bar, 1))
        pipeline = RecallPipeline(engine, llm=llm)
        ablations = ABLATIONS if args.ablate else None
        harness = EvalHarness(engine, pipeline, k=args.k, llm=llm, ablations=ablations)
        report = await _evaluate(harness, dataset, args, args.dataset)
        if args.interleave:
            mixed = interleave(dataset)
            await ingest_events(engine, mixed.messages, "importing the interleaved channel")
            await embed_all(engine)
            harness = EvalHarness(engine, pipeline, k=args.k, llm=llm, ablations=ablations)
            report["interleaved"] = await _evaluate(harness, mixed, args, "interleaved")
    report["writer"] = args.writer
    report["fitted"] = fitted_constants(pipeline.cfg)
    report["sessions"] = "inferred" if args.no_sessions else "dataset"
    report["llm"] = None if llm is None else llm.model
    report["prompts"] = {
        **PROMPT_VERSIONS,
        "judge": JUDGE_PROMPT_VERSION,
        "rubric": RUBRIC_PROMPT_VERSION,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    md = markdown_table(report)
    args.out.with_suffix(".md").write_text(md + "\n")
    console.print(md, markup=False, highlight=False)
    return 0
