"""Evidence recall@10 of the production /recall pipeline (no LLM) under RecallConfig
overrides, on both halves of the questions (split by a hash of the question id: choose on
A, confirm on B), per category. Runs against an eval database that `speakermem eval`
already filled (so nothing is imported or embedded again).

    python bench/quality/tune.py friendsqa /tmp/f/fqa.db \\
        ../shared/data/friendsqa/friendsqa-dev.json --set reply_slots=1 --label slot1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ablation import half  # type: ignore[import-not-found]

from speakermem.bot.settings import load_settings
from speakermem.integrations.app import open_engine
from speakermem.memory.datasets import DATASET_READERS
from speakermem.memory.eval.answer_metrics import evidence_recall
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dataset = DATASET_READERS[args.dataset](Path(args.data), sessions=not args.no_sessions)
    settings = load_settings(db_path=args.db)
    overrides = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    acc: dict[str, list[float]] = defaultdict(list)
    started = time.perf_counter()
    async with open_engine(settings) as engine:
        cfg = engine.config.recall.model_copy(update=overrides)
        pipeline = RecallPipeline(engine, config=cfg)
        questions = [q for q in dataset.questions if q.evidence][: args.limit]
        for q in questions:
            res = await pipeline.run(
                RecallRequest(question=q.question, scope=q.scope), answer=False
            )
            r = evidence_recall(
                set(q.evidence), res.pack.s1_message_ids()[:10], 10, any_of=q.any_of
            )
            for key in ("all", half(q.id), "cat:" + q.category):
                acc[key].append(r)
    out = {k: round(statistics.fmean(v), 4) for k, v in sorted(acc.items())}
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dataset", choices=sorted(DATASET_READERS))
    p.add_argument("db", help="an eval database filled by `speakermem eval`")
    p.add_argument("data", help="dataset json")
    p.add_argument("--set", action="append", default=[], help="RecallConfig field=value")
    p.add_argument("--no-sessions", action="store_true", help="the dataset read without sessions")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--label", default="")
    args = p.parse_args()
    out = asyncio.run(run(args))
    print(json.dumps({"label": args.label, "set": args.set, **out}))


if __name__ == "__main__":
    main()
