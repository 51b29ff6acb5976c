"""Half-A / half-B ablation of the /recall System 1 fusion from cached raw rankings.

Reproduces, in pure Python and with the production pure functions of
`memory.query.system1`, the final verbatim evidence (top 10) of each variant, and prints
evidence recall@10 per dataset on the whole set and on two halves split by a hash of the
question id (choose on A, confirm on B), plus per-category deltas against the baseline.

Build the caches first (one per dataset, from a COPY of the eval database):

    python bench/quality/build_cache.py friendsqa /work/evalq/friendsqa.db \\
        ../shared/data/friendsqa/friendsqa-dev.json /work/evalq/friendsqa.pkl
    python bench/quality/ablation.py --cache-dir /work/evalq
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from speakermem.memory.query.system1 import (
    context_ranking,
    dominant_session,
    focus_ranking,
    rerank_by_sessions,
    session_bm25,
)
from speakermem.memory.search.fusion import rrf

WEIGHTS = {"issue": 1.0, "question": 0.5, "phrase": 1.0, "speaker": 1.0, "time": 1.0, "dense": 1.0}


@dataclass(frozen=True)
class Variant:
    """One fusion configuration (defaults = the shipped RecallConfig)."""

    weights: dict[str, float] = field(default_factory=lambda: dict(WEIGHTS))
    alias: dict[str, str] = field(default_factory=dict)
    """ranking name -> cached list used for it (e.g. question -> question@1)."""
    k0: int = 20
    pool: int = 40
    agg_top: int = 10
    agg_w: float = 2.0
    bm25_w: float = 2.0
    length_norm: float = 0.5
    ctx_anchors: int = 3
    ctx_w: float = 0.5
    focus_margin: float = 1.5
    focus_w: float = 1.0
    focus_radius: int = 20


BEFORE = Variant(length_norm=0.0, focus_w=0.0)
AFTER = Variant()
VARIANTS: dict[str, Variant] = {
    "before (shipped at start)": BEFORE,
    "+ session length norm b=.5": replace(BEFORE, length_norm=0.5),
    "+ focus only (b=0)": replace(BEFORE, focus_w=1.0),
    "AFTER: b=.5 + focus": AFTER,
    "after, focus margin 1.2": replace(AFTER, focus_margin=1.2),
    "after, focus margin 2.0": replace(AFTER, focus_margin=2.0),
    "after, focus weight .5": replace(AFTER, focus_w=0.5),
    "after, b=.25": replace(AFTER, length_norm=0.25),
    "after, b=.75": replace(AFTER, length_norm=0.75),
    "after + dense on issue": replace(AFTER, weights={**WEIGHTS, "dense_issue": 1.0}),
    "after, speaker col 1.0 (question)": replace(AFTER, alias={"question": "question@1"}),
    "after, speaker col 1.0 (all)": replace(
        AFTER, alias={n: f"{n}@1" for n in ("issue", "question", "phrase", "speaker", "time")}
    ),
    "after, pool 60": replace(AFTER, pool=60),
    "after, k0 10": replace(AFTER, k0=10),
    "after, context off": replace(AFTER, ctx_w=0.0),
    "after, dense w .5": replace(AFTER, weights={**WEIGHTS, "dense": 0.5}),
}


def half(qid: str) -> str:
    return "A" if int(hashlib.md5(qid.encode()).hexdigest(), 16) % 2 == 0 else "B"


class Cache:
    def __init__(self, path: Path) -> None:
        with path.open("rb") as fh:
            data = pickle.load(fh)
        self.items: list[dict[str, Any]] = data["items"]
        self.meta: dict[int, tuple[Any, ...]] = data["meta"]
        # meta: pk -> (message_id, session, turn, speaker_id, channel_pk, speaker_name, text)
        self.at = {(v[4], v[1], v[2]): pk for pk, v in self.meta.items()}
        sizes: dict[tuple[int, int], int] = defaultdict(int)
        for v in self.meta.values():
            sizes[(v[4], v[1])] += 1
        self.sizes = dict(sizes)

    def session(self, pk: int) -> tuple[int, int]:
        v = self.meta[pk]
        return (v[4], v[1])


def final_ids(it: dict[str, Any], c: Cache, v: Variant, k: int = 10) -> list[str]:
    """The production System 1 order (no LLM) for one cached question."""
    lists, names = it["lists"], [n for n, w in v.weights.items() if w > 0]
    srcs = [(v.alias.get(n, n), v.weights[n]) for n in names]
    present = [(lists[s][: v.pool], w) for s, w in srcs if lists.get(s)]
    fused = rrf([lst for lst, _ in present], k0=v.k0, weights=[w for _, w in present])
    session_of = {pk: c.session(pk) for pk, _ in fused}
    cands = set(session_of.values())
    counts = {t: it["sess_terms"][t] for t in it["q_terms"]}
    bm25 = session_bm25(
        counts, it["nsess"], lengths={s: c.sizes[s] for s in cands}, b=v.length_norm
    )
    fused = rerank_by_sessions(
        fused,
        session_of,
        bm25=bm25,
        k0=v.k0,
        aggregate_top=v.agg_top,
        aggregate_weight=v.agg_w,
        bm25_weight=v.bm25_w,
    )
    if v.ctx_anchors and v.ctx_w and fused:
        position = {
            pk: (c.meta[pk][4], c.meta[pk][1], c.meta[pk][2]) for pk, _ in fused[: v.ctx_anchors]
        }
        ctx = context_ranking(fused, position, c.at, anchors=v.ctx_anchors)
        if ctx:
            fused = rrf([[pk for pk, _ in fused], ctx], k0=v.k0, weights=[1.0, v.ctx_w])
    if v.focus_w > 0 and fused:
        dom = dominant_session(bm25, margin=v.focus_margin)
        best = next((pk for pk, _ in fused if c.session(pk) == dom), None) if dom else None
        if best is not None and dom is not None:
            t0 = c.meta[best][2]
            members = {
                pk: t
                for t in range(t0 - v.focus_radius, t0 + v.focus_radius + 1)
                if (pk := c.at.get((dom[0], dom[1], t))) is not None
            }
            focus = focus_ranking(fused, members)
            if focus:
                fused = rrf([[pk for pk, _ in fused], focus], k0=v.k0, weights=[1.0, v.focus_w])
    return [c.meta[pk][0] for pk, _ in fused[:k]]


def recall(it: dict[str, Any], ids: list[str]) -> float:
    ev, got = set(it["ev"]), set(ids)
    if it["any_of"]:
        return 1.0 if ev & got else 0.0
    return len(ev & got) / len(ev)


def evaluate(c: Cache, v: Variant) -> dict[str, float]:
    acc: dict[str, list[float]] = defaultdict(list)
    for it in c.items:
        r = recall(it, final_ids(it, c, v))
        for key in ("all", half(it["id"]), "cat:" + it["cat"]):
            acc[key].append(r)
    return {key: float(np.mean(vals)) for key, vals in acc.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cache-dir", type=Path, default=Path("/work/evalq"))
    p.add_argument("--datasets", nargs="+", default=["locomo", "friendsqa"])
    p.add_argument("--only", nargs="*", help="variant names to run (substring match)")
    p.add_argument("--categories", action="store_true", help="per-category deltas vs before")
    args = p.parse_args()
    caches = {name: Cache(args.cache_dir / f"{name}.pkl") for name in args.datasets}
    base = {name: evaluate(c, BEFORE) for name, c in caches.items()}
    show: Callable[[str], bool] = lambda n: not args.only or any(s in n for s in args.only)  # noqa: E731
    head = " | ".join(f"{n} all / A / B (delta all, A, B)" for n in caches)
    print(f"| variant | {head} |")
    print("|---|" + "---|" * len(caches))
    for label, variant in VARIANTS.items():
        if not show(label):
            continue
        cells = []
        for name, c in caches.items():
            s, b = evaluate(c, variant), base[name]
            cells.append(
                f"{s['all']:.4f} / {s['A']:.4f} / {s['B']:.4f} "
                f"({100 * (s['all'] - b['all']):+.1f}, {100 * (s['A'] - b['A']):+.1f},"
                f" {100 * (s['B'] - b['B']):+.1f})"
            )
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.categories:
        for name, c in caches.items():
            s, b = evaluate(c, AFTER), base[name]
            cats = sorted(k for k in s if k.startswith("cat:"))
            print(f"\n{name} per category (before -> after):")
            for k in cats:
                print(f"  {k[4:]:12s} {b[k]:.3f} -> {s[k]:.3f} ({100 * (s[k] - b[k]):+.1f})")


if __name__ == "__main__":
    main()
