"""Calibrate the Writer's evidence gate on LoCoMo observations.

LoCoMo's `observation` field holds LLM-derived person facts, each with the dialogue ids that
support it: real Writer-like output with true evidence. The gate should ACCEPT an observation
with its true evidence and REJECT it when the evidence is swapped for a random other message of
the same speaker (fixed seed). This script reports both rates and a small threshold sweep.

Usage (from the repository root):
    python bench/calibrate_gate.py --data ../shared/data/locomo/locomo-dev.json
    python bench/calibrate_gate.py --mode either --dense  # needs the MiniLM embedder
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchlib import REPO_ROOT

from speakermem.memory.writer.gate import (
    DEFAULT_DENSE_THRESHOLD,
    DEFAULT_LEXICAL_THRESHOLD,
    EvidenceGate,
    date_terms,
)

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
_DATE_RE = re.compile(r"(\d{1,2}):(\d{2})\s*(am|pm)\s+on\s+(\d{1,2})\s+(\w+),?\s+(\d{4})", re.I)
_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    other: str
    text: str
    when: datetime | None


@dataclass(frozen=True)
class Case:
    """One observation with its true evidence and a swapped, same-speaker distractor."""

    fact: str
    true: tuple[Turn, ...]
    swapped: tuple[Turn, ...]


def parse_session_date(value: str) -> datetime | None:
    """'1:56 pm on 8 May, 2023' -> datetime; None when the string does not match."""
    m = _DATE_RE.search(value or "")
    if not m:
        return None
    hour, minute, ampm, day, month, year = m.groups()
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    try:
        mon = _MONTHS.index(month.lower()) + 1
    except ValueError:
        return None
    return datetime(int(year), mon, int(day), h, int(minute))


def load_cases(path: Path, seed: int) -> list[Case]:
    """Flatten every sample's observations into cases with true and swapped evidence."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    cases: list[Case] = []
    for sample in data:
        conv = sample["conversation"]
        speakers = (conv["speaker_a"], conv["speaker_b"])
        turns: dict[str, Turn] = {}
        by_speaker: dict[str, list[Turn]] = {s: [] for s in speakers}
        n = 1
        while f"session_{n}_date_time" in conv:
            when = parse_session_date(conv[f"session_{n}_date_time"])
            for t in conv.get(f"session_{n}", []):
                text = t.get("text", "")
                if t.get("blip_caption"):
                    text = f"{text} [shares image: {t['blip_caption']}]"
                other = speakers[1] if t["speaker"] == speakers[0] else speakers[0]
                turn = Turn(t["dia_id"], t["speaker"], other, text, when)
                turns[turn.dia_id] = turn
                by_speaker.setdefault(turn.speaker, []).append(turn)
            n += 1
        for _key, per_speaker in sorted(sample.get("observation", {}).items()):
            for speaker, facts in per_speaker.items():
                for fact, ev in facts:
                    ids = ev if isinstance(ev, list) else [ev]
                    ids = [i for raw in ids for i in re.split(r"[;\s]+", raw) if i]
                    true = tuple(turns[i] for i in ids if i in turns)
                    if not true:
                        continue
                    pool = [t for t in by_speaker.get(speaker, []) if t.dia_id not in ids]
                    if not pool:
                        continue
                    swapped = tuple(rng.choice(pool) for _ in true)
                    cases.append(Case(fact, true, swapped))
    return cases


def evidence_args(turns: tuple[Turn, ...]) -> tuple[list[str], list[str], list[str]]:
    """Texts, speaker names and context terms (addressee + message dates) of cited turns."""
    texts = [t.text for t in turns]
    names = sorted({t.speaker for t in turns})
    context: list[str] = sorted({t.other for t in turns})
    for t in turns:
        if t.when is not None:
            context.extend(date_terms(t.when))
    return texts, names, context


def dense_sims(cases: list[Case]) -> tuple[list[float], list[float]]:
    """Max cosine between each fact and its true / swapped evidence, via MiniLM."""
    from speakermem.integrations.embeddings.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder()
    facts = emb.embed_sync([c.fact for c in cases])
    uniq: dict[str, int] = {}
    for c in cases:
        for t in (*c.true, *c.swapped):
            uniq.setdefault(f"{t.speaker}: {t.text}", len(uniq))
    vecs = emb.embed_sync(list(uniq))
    out_true: list[float] = []
    out_swap: list[float] = []
    for i, c in enumerate(cases):
        for turns, out in ((c.true, out_true), (c.swapped, out_swap)):
            idx = [uniq[f"{t.speaker}: {t.text}"] for t in turns]
            out.append(float((vecs[idx] @ facts[i]).max()))
    return out_true, out_swap


def rates(
    gate: EvidenceGate,
    cases: list[Case],
    dense_true: list[float] | None,
    dense_swap: list[float] | None,
) -> tuple[float, float]:
    """(acceptance with true evidence, rejection with swapped evidence)."""
    acc = rej = 0
    for i, c in enumerate(cases):
        texts, names, ctx = evidence_args(c.true)
        d = dense_true[i] if dense_true is not None else None
        acc += gate.score(c.fact, texts, names, dense_sim=d, context_terms=ctx).passed
        texts, names, ctx = evidence_args(c.swapped)
        d = dense_swap[i] if dense_swap is not None else None
        rej += not gate.score(c.fact, texts, names, dense_sim=d, context_terms=ctx).passed
    n = max(1, len(cases))
    return acc / n, rej / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo-dev.json path")
    parser.add_argument("--mode", choices=["lexical", "dense", "either", "both"], default="lexical")
    parser.add_argument("--lexical-threshold", type=float, default=DEFAULT_LEXICAL_THRESHOLD)
    parser.add_argument("--dense-threshold", type=float, default=DEFAULT_DENSE_THRESHOLD)
    parser.add_argument(
        "--dense",
        action="store_true",
        help="compute MiniLM similarities (implied by --mode dense/either/both)",
    )
    parser.add_argument("--seed", type=int, default=13, help="seed for the swapped evidence")
    args = parser.parse_args(argv)

    if not args.data.exists():
        print(f"data file not found: {args.data}", file=sys.stderr)
        return 2
    cases = load_cases(args.data, args.seed)
    print(f"{len(cases)} observations from {args.data}")

    use_dense = args.dense or args.mode != "lexical"
    dense_true: list[float] | None = None
    dense_swap: list[float] | None = None
    if use_dense:
        try:
            dense_true, dense_swap = dense_sims(cases)
        except Exception as exc:  # embedder missing or model files absent
            print(f"dense similarity unavailable ({exc}); lexical only", file=sys.stderr)

    gate = EvidenceGate(args.lexical_threshold, args.dense_threshold, args.mode)
    acc, rej = rates(gate, cases, dense_true, dense_swap)
    print(
        f"mode={args.mode} lexical>={args.lexical_threshold:.2f} "
        f"dense>={args.dense_threshold:.2f}: accept(true)={acc:.1%} reject(swapped)={rej:.1%}"
    )

    print("\nlexical-only sweep")
    print("threshold  accept  reject")
    for th in (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6):
        a, r = rates(EvidenceGate(th, mode="lexical"), cases, None, None)
        print(f"{th:9.2f}  {a:6.1%}  {r:6.1%}")

    if dense_true is not None:
        print("\ndense sweep (mode, lexical, dense)")
        print("mode    lex   dense  accept  reject")
        for mode in ("dense", "either", "both"):
            for lt in (0.2, 0.25, 0.3, 0.4):
                for dt in (0.3, 0.4, 0.5, 0.6, 0.7):
                    if mode == "dense" and lt != 0.25:
                        continue
                    g = EvidenceGate(lt, dt, mode)  # type: ignore[arg-type]
                    a, r = rates(g, cases, dense_true, dense_swap)
                    print(f"{mode:6s}  {lt:.2f}  {dt:.2f}  {a:6.1%}  {r:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
