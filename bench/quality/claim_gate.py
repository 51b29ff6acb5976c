"""Which check tells a supported answer claim from an unsupported one: the evidence gate's
lexical support or MiniLM dense similarity?

Claims are built from LoCoMo dev QA pairs ("<question> <answer>"), each checked once
against its gold evidence (supported) and once against a message of the same conversation
drawn at random among those that are not evidence (a wrong citation). Reports, per method,
the balanced accuracy at the best threshold and at the shipped one, and ROC AUC.

    python bench/quality/claim_gate.py /tmp/f/locomo.db ../shared/data/locomo/locomo-dev.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

import numpy as np

from speakermem.bot.settings import load_settings
from speakermem.integrations.app import open_engine
from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.query.claims import CLAIM_THRESHOLD
from speakermem.memory.writer.gate import EvidenceGate, date_terms

sys.path.insert(0, str(Path(__file__).parent))
from ablation import half  # type: ignore[import-not-found]


def auc(pos: list[float], neg: list[float]) -> float:
    p, n = np.asarray(pos), np.asarray(neg)
    return float((p[:, None] > n[None, :]).mean() + 0.5 * (p[:, None] == n[None, :]).mean())


def balanced(pos: list[float], neg: list[float], t: float) -> float:
    return 0.5 * (float(np.mean(np.asarray(pos) >= t)) + float(np.mean(np.asarray(neg) < t)))


async def run(args: argparse.Namespace) -> None:
    ds = read_locomo(Path(args.data))
    rng = random.Random(args.seed)
    gate = EvidenceGate()
    scores: dict[str, tuple[list[float], list[float]]] = {"lexical": ([], []), "dense": ([], [])}
    halves: list[str] = []
    async with open_engine(load_settings(db_path=args.db)) as engine:
        for q in [q for q in ds.questions if q.evidence and q.answer][: args.limit]:
            msgs = await engine.store.messages.by_ids(q.scope, q.evidence)
            if not msgs:
                continue
            (pk,) = await engine.channel_pks([q.scope])
            corpus = await engine.store.messages.channel_corpus(pk)
            others = [c for c in corpus if c[1] not in q.evidence]
            wrong_id = rng.choice(others)[1]
            wrong = (await engine.store.messages.by_ids(q.scope, [wrong_id]))[wrong_id]
            claim = f"{q.question} {q.answer}"
            halves.append(half(q.id))
            cvec = await engine.embed_query(claim)
            for i, cited in enumerate((list(msgs.values()), [wrong])):
                lex, _ = gate.lexical_support(
                    claim,
                    [m.text for m in cited],
                    [m.speaker_name for m in cited],
                    [t for m in cited for t in date_terms(m.ts)],
                )
                vecs = await engine.store.messages.vectors([m.pk for m in cited])
                dense = max(float(np.dot(cvec, v)) for v in vecs.values()) if vecs else 0.0
                scores["lexical"][i].append(lex)
                scores["dense"][i].append(dense)
    grid = np.linspace(0, 1, 101)
    for method, (pos, neg) in scores.items():
        pa = [x for x, h in zip(pos, halves, strict=True) if h == "A"]
        na = [x for x, h in zip(neg, halves, strict=True) if h == "A"]
        pb = [x for x, h in zip(pos, halves, strict=True) if h == "B"]
        nb = [x for x, h in zip(neg, halves, strict=True) if h == "B"]
        best = max(grid, key=lambda t: balanced(pa, na, t))
        line = (
            f"{method}: n={len(pos)} AUC {auc(pos, neg):.3f}; threshold chosen on half A "
            f"{best:.2f}: balanced accuracy A {balanced(pa, na, best):.3f}, "
            f"B {balanced(pb, nb, best):.3f}"
        )
        if method == "lexical":
            line += f"; at the shipped {CLAIM_THRESHOLD}: {balanced(pos, neg, CLAIM_THRESHOLD):.3f}"
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("db", help="an eval database filled by `speakermem eval locomo`")
    p.add_argument("data", help="locomo-dev.json")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=13)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
