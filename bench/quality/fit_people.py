"""Choose the group-chat constants by leave-one-network-out on SocialMemBench's networks.

For each constant (the people model's weights, `broad_session_cap`, `group_speaker_cap`),
every candidate value is scored on every network as the margin of the pipeline's evidence
recall@10 over the best control of the network's part (small or larger set). Then, for each
network held out in turn, the value with the best mean margin over the other networks is
chosen and scored on the held-out one: the mean of those held-out margins is the constant's
cross-validated margin. The value shipped is the one chosen on all networks. Each network
weighs the same, so a rule that fits the ten small networks cannot hide a loss on the five
larger ones.

The people weights are scored without re-running the pipeline: one run records each people
question's candidates (`memory.query.pool.people_order` is wrapped), then every weight
vector re-orders them with the production `people_order`. The caps are scored by pipeline
runs with each value (the harness's variants).

    speakermem --db smb.db eval socialmembench ../shared/data/socialmembench \\
        ../shared/data/socialmembench/larger --out /tmp/smb.json
    python bench/quality/fit_people.py smb.db ../shared/data/socialmembench \\
        ../shared/data/socialmembench/larger --out docs/benchmarks/socialmembench-fit.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import speakermem.memory.query.pool as pool_module  # noqa: E402
from speakermem.bot.settings import load_settings  # noqa: E402
from speakermem.integrations.app import open_engine  # noqa: E402
from speakermem.memory.datasets.socialmembench import read_socialmembench  # noqa: E402
from speakermem.memory.eval.answer_metrics import evidence_recall  # noqa: E402
from speakermem.memory.eval.harness import EvalHarness  # noqa: E402
from speakermem.memory.query.people_rank import PEOPLE_WEIGHTS, PeopleWeights, people_order  # noqa: E402
from speakermem.memory.query.pipeline import RecallPipeline  # noqa: E402

K = 10
PEOPLE_GRID = {
    "named_speaker": (0.1, 0.3, 0.5, 1.0),
    "mentions": (0.0, 0.05, 0.1, 0.2),
    "exchange": (0.0, 0.15, 0.3, 0.45),
    "length": (0.0, 0.1, 0.15, 0.2, 0.3),
}
CAP_GRID = {
    "broad_session_cap": (0, 2, 3, 4, 6),
    "group_speaker_cap": (0, 1, 2, 3),
    "broad_lexical_weight": (0.0, 0.25, 0.5, 1.0),
}


def lono(scores: dict[Any, dict[str, float]], shipped: Any) -> dict[str, Any]:
    """scores: value -> network -> margin (points). The value chosen on all networks and,
    per held-out network, the value chosen on the others with its held-out margin. A tie
    (within 0.01 points) goes to the value shipped, else to the earlier value of the grid."""
    nets = sorted(next(iter(scores.values())))
    order = {v: i for i, v in enumerate(scores)}

    def mean_over(value: Any, keep: Sequence[str]) -> float:
        return statistics.fmean(scores[value][n] for n in keep)

    def pick(keep: Sequence[str]) -> Any:
        return max(scores, key=lambda v: (round(mean_over(v, keep), 2), v == shipped, -order[v]))

    held: dict[str, Any] = {}
    for n in nets:
        chosen_here = pick([m for m in nets if m != n])
        held[n] = {"chosen": chosen_here, "margin": round(scores[chosen_here][n], 1)}
    chosen = pick(nets)
    return {
        "chosen": chosen,
        "margin_all_networks": round(mean_over(chosen, nets), 2),
        "cross_validated_margin": round(statistics.fmean(h["margin"] for h in held.values()), 2),
        "held_out": held,
        "by_value": {str(v): round(mean_over(v, nets), 2) for v in scores},
    }


def _margins(
    per_q: dict[str, float], ctl: dict[str, float], net_of: dict[str, str]
) -> dict[str, float]:
    by: dict[str, list[float]] = defaultdict(list)
    for qid, r in per_q.items():
        by[net_of[qid]].append(100 * (r - ctl[qid]))
    return {n: statistics.fmean(v) for n, v in by.items()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dataset = read_socialmembench([Path(p) for p in args.paths])
    questions = [q for q in dataset.questions if q.evidence]
    recorded: dict[str, Any] = {}
    current: list[str] = []
    original = pool_module.people_order

    def recording(cands, named, terms, weights=PEOPLE_WEIGHTS):  # type: ignore[no-untyped-def]
        recorded[current[0]] = (list(cands), list(named), dict(terms))
        return original(cands, named, terms, weights)

    pool_module.people_order = recording  # type: ignore[assignment]
    variants = {
        f"{name}={value}": {name: value} for name, values in CAP_GRID.items() for value in values
    }
    async with open_engine(load_settings(db_path=args.db)) as engine:
        harness = EvalHarness(engine, RecallPipeline(engine), k=K, ablations=variants)
        await harness.prepare(dataset)
        results = []
        for q in questions:
            current[:] = [q.id]
            results.append(await harness.run_question(q))
        pool_module.people_order = original  # type: ignore[assignment]
        pks = sorted({c.pk for cands, _, _ in recorded.values() for c in cands})
        id_of = {pk: m.message_id for pk, m in (await engine.store.messages.get_many(pks)).items()}
    report = harness.report("socialmembench", results, skipped=0, with_s2=False)
    best = {part: p["best_control"] for part, p in report["parts"].items()}
    net_of = {r.question.id: r.question.scope.channel for r in results}
    ctl = {
        r.question.id: evidence_recall(
            set(r.question.evidence), r.retrieved[best[r.question.group or "all"]], K
        )
        for r in results
    }
    base = {
        r.question.id: evidence_recall(set(r.question.evidence), r.retrieved["speakermem"], K)
        for r in results
    }
    out: dict[str, Any] = {"constants": {}}
    for name, values in CAP_GRID.items():
        scores = {}
        for value in values:
            per_q = {
                r.question.id: evidence_recall(
                    set(r.question.evidence), r.variants[f"{name}={value}"], K
                )
                for r in results
            }
            scores[value] = _margins(per_q, ctl, net_of)
        shipped = getattr(engine.config.recall, name)
        out["constants"][name] = {"grid": list(values), **lono(scores, shipped)}
    gold = {r.question.id: set(r.question.evidence) for r in results}
    scores = {}
    for combo in itertools.product(*PEOPLE_GRID.values()):
        w = PeopleWeights(**dict(zip(PEOPLE_GRID, combo, strict=True)))
        per_q = dict(base)
        for qid, (cands, named, terms) in recorded.items():
            top = [id_of[pk] for pk in people_order(cands, named, terms, w)[:K]]
            per_q[qid] = evidence_recall(gold[qid], top, K)
        scores[combo] = _margins(per_q, ctl, net_of)
    shipped_w = tuple(PEOPLE_WEIGHTS.as_dict()[k] for k in PEOPLE_GRID)
    fit = lono(scores, shipped_w)
    fit["chosen"] = dict(zip(PEOPLE_GRID, fit["chosen"], strict=True))
    for h in fit["held_out"].values():
        h["chosen"] = dict(zip(PEOPLE_GRID, h["chosen"], strict=True))
    out["constants"]["people_weights"] = {
        "grid": {k: list(v) for k, v in PEOPLE_GRID.items()},
        "people_questions": len(recorded),
        **fit,
    }
    out["shipped"] = {
        "people_weights": PEOPLE_WEIGHTS.as_dict(),
        "broad_session_cap": engine.config.recall.broad_session_cap,
        "group_speaker_cap": engine.config.recall.group_speaker_cap,
        "broad_lexical_weight": engine.config.recall.broad_lexical_weight,
    }
    out["networks"] = {
        part: sorted(
            {r.question.scope.channel for r in results if (r.question.group or "all") == part}
        )
        for part in best
    }
    out["best_control"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("db", help="an eval database `speakermem eval socialmembench` filled")
    ap.add_argument("paths", nargs="+", help="network files or folders (as given to eval)")
    ap.add_argument("--out", type=Path, required=True, help="results JSON")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out["run"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "commit": commit,
        "command": "python bench/quality/fit_people.py " + " ".join(sys.argv[1:]),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, c in out["constants"].items():
        cv = c["cross_validated_margin"]
        print(f"{name}: chosen {c['chosen']}, cross-validated margin {cv:+.2f} points")


if __name__ == "__main__":
    main()
