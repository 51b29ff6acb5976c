"""Probe: would a late-interaction (MaxSim) feature add to the feature re-ranker?

For every candidate in the dumps of `fit_rerank.py dump`, MaxSim = the mean over the
question's word pieces of the best cosine with any of the candidate's word pieces, with
MiniLM's last-layer token states (`--tokens contextual`, one model pass per message) or
its input embedding table (`--tokens static`, a lookup, no model pass). The score is
appended to the feature matrix; the re-ranker is refitted on half A (pairwise loss, as
shipped) with and without it, and evidence recall@10 is printed for halves A and B.

    python bench/quality/maxsim_probe.py --tokens contextual \\
        friendsqa /tmp/h4/fqa.db ../shared/data/friendsqa/friendsqa-dev.json /tmp/h4/fqa.pkl \\
        locomo /tmp/h4/loc.db ../shared/data/locomo/locomo-dev.json /tmp/h4/loc.pkl
(four arguments per dump; --no-sessions NAME for each dump made without sessions, e.g. fqa_ns).
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ablation import half  # type: ignore[import-not-found]
from fit_rerank import pairwise, recall_at  # type: ignore[import-not-found]
from scipy.optimize import minimize

from speakermem.bot.settings import load_settings
from speakermem.integrations.app import open_engine
from speakermem.integrations.embeddings.minilm import MiniLMEmbedder, locate_model_dir
from speakermem.memory.datasets import DATASET_READERS
from speakermem.memory.models import Scope


class StaticTokens:
    """Word-piece vectors from the input embedding table (no model pass)."""

    def __init__(self) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model_dir = locate_model_dir()
        weights = load_file(str(model_dir / "model.safetensors"))
        table = weights["embeddings.word_embeddings.weight"].astype(np.float32)
        self.table = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.no_truncation()

    def token_embeddings_sync(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [self.table[e.ids[:64]] for e in encodings]


def maxsim(q: np.ndarray, d: np.ndarray) -> float:
    if not len(q) or not len(d):
        return 0.0
    return float((q @ d.T).max(axis=1).mean())


async def texts_of(
    dataset: str, db: str, data: str, sessions: bool, items: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[tuple[Scope, str], str]]:
    ds = DATASET_READERS[dataset](Path(data), sessions=sessions)
    questions = {q.id: q for q in ds.questions}
    texts: dict[tuple[Scope, str], str] = {}
    async with open_engine(load_settings(db_path=db)) as engine:
        for scope in {q.scope for q in ds.questions}:
            ids = sorted(
                {m for it in items if questions[it["id"]].scope == scope for m in it["head"]}
            )
            got = await engine.store.messages.by_ids(scope, [m for m in ids if m])
            texts.update({(scope, mid): f"{m.speaker_name}: {m.text}" for mid, m in got.items()})
    return questions, texts


def add_maxsim(
    items: list[dict[str, Any]], questions: dict[str, Any], texts: dict, enc: Any
) -> None:
    keys = list(texts)
    started = time.perf_counter()
    states = dict(zip(keys, enc.token_embeddings_sync([texts[k] for k in keys]), strict=True))
    print(f"  {len(keys)} messages encoded in {time.perf_counter() - started:.1f} s")
    qs = enc.token_embeddings_sync([questions[it["id"]].question for it in items])
    empty = np.zeros((0, 384), dtype=np.float32)
    for it, q in zip(items, qs, strict=True):
        scope = questions[it["id"]].scope
        col = [maxsim(q, states.get((scope, m), empty)) for m in it["head"]]
        it["x_ms"] = np.column_stack([it["x"], col]) if len(it["x"]) else it["x"]


def fit_and_score(dumps: dict[str, list[dict[str, Any]]], key: str) -> None:
    train = [
        it for items in dumps.values() for it in items if half(it["id"]) == "A" and len(it["x"])
    ]
    rows = np.concatenate([it[key] for it in train])
    mu, sd = rows.mean(axis=0), rows.std(axis=0)
    sd[sd < 1e-9] = 1.0
    data = []
    for it in train:
        y = np.array([1.0 if m in set(it["ev"]) else 0.0 for m in it["head"]])
        if y.sum() > 0:
            data.append(((it[key] - mu) / sd, y))
    w0 = np.zeros(rows.shape[1])
    w0[0] = 1.0
    w = minimize(pairwise, w0, args=(data, 0.001), jac=True, method="L-BFGS-B").x / sd
    print(f"{'with' if key == 'x_ms' else 'without'} MaxSim")
    for name, items in dumps.items():
        acc: dict[str, list[float]] = {"A": [], "B": []}
        for it in items:
            ids = it["final"]
            if len(it["x"]):
                s = it[key] @ w
                ids = [
                    it["head"][i] for i in sorted(range(len(it["head"])), key=lambda i: (-s[i], i))
                ]
            acc[half(it["id"])].append(recall_at(it, ids))
        print(f"  {name}: A {np.mean(acc['A']):.4f}  B {np.mean(acc['B']):.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", choices=("contextual", "static"), default="contextual")
    p.add_argument("--no-sessions", action="append", default=[], metavar="DUMP_NAME")
    p.add_argument("specs", nargs="+", help="DATASET DB DATA DUMP, repeated")
    args = p.parse_args()
    enc: Any = MiniLMEmbedder(batch_size=64) if args.tokens == "contextual" else StaticTokens()
    dumps: dict[str, list[dict[str, Any]]] = {}
    for i in range(0, len(args.specs), 4):
        dataset, db, data, dump = args.specs[i : i + 4]
        name = Path(dump).stem
        items = pickle.loads(Path(dump).read_bytes())["items"]
        sessions = name not in args.no_sessions
        questions, texts = asyncio.run(texts_of(dataset, db, data, sessions, items))
        print(name)
        add_maxsim(items, questions, texts, enc)
        dumps[name] = items
    fit_and_score(dumps, "x")
    fit_and_score(dumps, "x_ms")


if __name__ == "__main__":
    main()
