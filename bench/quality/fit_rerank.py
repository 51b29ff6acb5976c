"""Fit and measure the feature re-ranker (memory/query/rerank.py) on tuning half A.

1. dump: run the production pipeline (no LLM) on an eval database that `speakermem eval`
   filled, and save each question's re-ranker input (the pool's head and its feature
   matrix) with its gold evidence:

       python bench/quality/fit_rerank.py dump friendsqa /tmp/h4/fqa.db \\
           ../shared/data/friendsqa/friendsqa-dev.json /tmp/h4/fqa.pkl

2. fit: a pairwise logistic loss (each question's gold candidates against its others; or
   `--loss softmax`, listwise) over the questions of half A of every dump given,
   L2-regularised; prints the weights and the evidence recall@10 of the fused order and of
   the re-ranked order on halves A and B and per category. The shipped weights:

       python bench/quality/fit_rerank.py fit /tmp/h4/fqa.pkl /tmp/h4/loc.pkl \
           /tmp/h4/fqa_ns.pkl --loss pairwise --l2 0.001 --nonneg rank_relation
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from ablation import half  # type: ignore[import-not-found]
from scipy.optimize import minimize

import speakermem.memory.query.pool as pool_module
from speakermem.bot.settings import load_settings
from speakermem.integrations.app import open_engine
from speakermem.memory.datasets import DATASET_READERS
from speakermem.memory.eval.answer_metrics import evidence_recall
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.rerank import FEATURES, rerank


async def dump(args: argparse.Namespace) -> list[dict[str, Any]]:
    dataset = DATASET_READERS[args.dataset](Path(args.data), sessions=not args.no_sessions)
    settings = load_settings(db_path=args.db)
    captured: list[tuple[list[int], np.ndarray]] = []

    def capture(order: list[int], matrix: np.ndarray, weights: Any, *, depth: int) -> list[int]:
        captured.append((list(order[:depth]), matrix.copy()))
        return list(order)

    pool_module.rerank = capture  # type: ignore[assignment]
    pool_module.RERANK_WEIGHTS = {"fused": 1.0}  # enables the stage; order unchanged
    items: list[dict[str, Any]] = []
    async with open_engine(settings) as engine:
        overrides: dict[str, Any] = {"rerank_depth": args.depth}
        overrides.update({k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)})
        cfg = engine.config.recall.model_copy(update=overrides)
        pipeline = RecallPipeline(engine, config=cfg)
        questions = [q for q in dataset.questions if q.evidence][: args.limit]
        for q in questions:
            captured.clear()
            res = await pipeline.run(
                RecallRequest(question=q.question, scope=q.scope), answer=False
            )
            head, matrix = captured[0] if captured else ([], np.zeros((0, len(FEATURES))))
            msgs = await engine.store.messages.get_many(head)
            items.append(
                {
                    "id": q.id,
                    "cat": q.category,
                    "ev": list(q.evidence),
                    "any_of": q.any_of,
                    "head": [msgs[pk].message_id if pk in msgs else "" for pk in head],
                    "x": matrix,
                    "final": res.pack.s1_message_ids()[:10],
                }
            )
    return items


def labels(it: dict[str, Any]) -> np.ndarray:
    gold = set(it["ev"])
    return np.array([1.0 if mid in gold else 0.0 for mid in it["head"]])


def objective(w: np.ndarray, data: list[tuple[np.ndarray, np.ndarray]], l2: float) -> Any:
    """Mean negative log of the softmax mass on each question's gold candidates."""
    loss, grad = 0.0, np.zeros_like(w)
    for x, y in data:
        s = x @ w
        s = s - s.max()
        p = np.exp(s)
        p /= p.sum()
        mass = float(p @ y)
        loss -= np.log(mass + 1e-12)
        q = p * y / (mass + 1e-12)
        grad -= x.T @ (q - p)
    n = max(len(data), 1)
    return loss / n + l2 * float(w @ w), grad / n + 2 * l2 * w


def pairwise(w: np.ndarray, data: list[tuple[np.ndarray, np.ndarray]], l2: float) -> Any:
    """Mean logistic loss over each question's (gold, other) candidate pairs (RankNet):
    closer to recall@10 than the softmax, which only rewards the top place."""
    loss, grad = 0.0, np.zeros_like(w)
    for x, y in data:
        s = x @ w
        g, o = np.flatnonzero(y > 0), np.flatnonzero(y == 0)
        if not len(g) or not len(o):
            continue
        d = s[g][:, None] - s[o][None, :]
        sig = 1.0 / (1.0 + np.exp(np.clip(d, -30, 30)))
        loss += float(np.mean(np.logaddexp(0.0, -d)))
        coef = -sig / sig.size
        grad += coef.sum(axis=1) @ x[g] - coef.sum(axis=0) @ x[o]
    n = max(len(data), 1)
    return loss / n + l2 * float(w @ w), grad / n + 2 * l2 * w


def standardise(items: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    rows = np.concatenate([it["x"] for it in items if len(it["x"])])
    mu, sd = rows.mean(axis=0), rows.std(axis=0)
    return mu, np.where(sd > 1e-9, sd, 1.0)


def recall_at(it: dict[str, Any], ids: list[str], k: int = 10) -> float:
    return evidence_recall(set(it["ev"]), ids[:k], k, any_of=it["any_of"])


def evaluate(items: list[dict[str, Any]], weights: dict[str, float] | None) -> dict[str, float]:
    acc: dict[str, list[float]] = defaultdict(list)
    for it in items:
        if weights is None or not len(it["x"]):
            ids = it["final"]
        else:
            order = list(range(len(it["head"])))
            ranked = rerank(order, it["x"], weights, depth=len(order))
            ids = [it["head"][i] for i in ranked] + [m for m in it["final"] if m not in it["head"]]
        r = recall_at(it, ids)
        for key in ("all", half(it["id"]), "cat:" + it["cat"]):
            acc[key].append(r)
    return {k: round(statistics.fmean(v), 4) for k, v in sorted(acc.items())}


def fit(args: argparse.Namespace) -> None:
    dumps = {Path(p).stem: pickle.loads(Path(p).read_bytes()) for p in args.dumps}
    train = [it for d in dumps.values() for it in d["items"] if half(it["id"]) == "A"]
    mu, sd = standardise(train)
    data = []
    for it in train:
        y = labels(it)
        if len(it["x"]) and y.sum() > 0:
            data.append(((it["x"] - mu) / sd, y))
    w0 = np.zeros(len(FEATURES))
    w0[0] = 1.0
    loss = pairwise if args.loss == "pairwise" else objective
    bounds = [(0.0, None) if f in args.nonneg else (None, None) for f in FEATURES]
    res = minimize(loss, w0, args=(data, args.l2), jac=True, method="L-BFGS-B", bounds=bounds)
    w_std = res.x
    # back to raw feature units (the constant shift changes no order)
    raw = {f: round(float(w_std[i] / sd[i]), 4) for i, f in enumerate(FEATURES)}
    print(json.dumps({"trained_on": len(data), "l2": args.l2, "weights": raw}))
    for name, d in dumps.items():
        base, new = evaluate(d["items"], None), evaluate(d["items"], raw)
        print(f"\n{name}: fused -> re-ranked (recall@10)")
        for k in base:
            print(f"  {k:24s} {base[k]:.4f} -> {new[k]:.4f} ({100 * (new[k] - base[k]):+.1f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dataset", choices=sorted(DATASET_READERS))
    d.add_argument("db")
    d.add_argument("data")
    d.add_argument("out")
    d.add_argument("--no-sessions", action="store_true")
    d.add_argument("--depth", type=int, default=30)
    d.add_argument("--limit", type=int, default=None)
    d.add_argument("--set", action="append", default=[], help="RecallConfig field=JSON")
    f = sub.add_parser("fit")
    f.add_argument("dumps", nargs="+")
    f.add_argument("--l2", type=float, default=0.001)
    f.add_argument("--loss", choices=("softmax", "pairwise"), default="pairwise")
    f.add_argument("--nonneg", nargs="*", default=[], help="features whose weight stays >= 0")
    args = p.parse_args()
    if args.cmd == "dump":
        items = asyncio.run(dump(args))
        Path(args.out).write_bytes(pickle.dumps({"features": FEATURES, "items": items}))
        print(f"{len(items)} questions -> {args.out}")
    else:
        fit(args)


if __name__ == "__main__":
    main()
