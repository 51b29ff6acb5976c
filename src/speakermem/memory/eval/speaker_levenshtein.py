"""SpeakerLevenshtein: an owner-bucketed, coordinate-gated score between two derived states.

Despite the name this is not edit distance. Each predicted record is softly compared with each
reference record (token F1 blended with a SequenceMatcher ratio), the score is zeroed unless
owner, source and layer agree, and records are aligned one-to-one per owner with the Hungarian
algorithm. Per-owner F scores are combined as 0.8 x macro mean + 0.2 x worst owner so a
frequent speaker cannot hide a badly remembered rare speaker or the GROUP row.

Decisions the seed leaves open, fixed here:

* Content token F1 uses token *multisets* (standard SQuAD-style F1). The seed calls out sets
  only for the answer metric, as a deliberate deviation; record contents are free text where
  repeated tokens are rare and the sequence ratio already sees order and repetition.
* Two records whose normalised contents are both empty score 1.0 on content; one empty scores 0.
* Owners are bucketed and compared after ``strip().casefold()``; any casing of ``GROUP`` maps
  to the canonical ``GROUP`` key. Layer must match exactly (after ``strip``).
* Chain edges are gated on the new node's owner and layer (both nodes' owners must agree
  across the pair); source is not gated, as the seed names only owner and layer.

Everything is pure except :func:`load_state`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from speakermem.memory.models import GROUP, DerivedRecord

ALPHA_TOK = 0.60
ALPHA_SEQ = 0.40
W_MACRO = 0.80
W_WORST = 0.20
W_OLD = 0.50
W_NEW = 0.50
W_SL = 0.80
W_CHAIN = 0.20

# CJK ideographs (basic, ext A, compatibility, ext B-F), kana and Hangul syllables: one token each.
_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK Ext A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\U00020000-\U0002ebef"  # CJK Ext B-F
)
_TOKEN_RE = re.compile(rf"[a-z0-9]+|[{_CJK}]")


class StateRecord(BaseModel):
    """One derived record reduced to the coordinates and content the score looks at."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    owner: str = Field(min_length=1)
    source: str = Field(min_length=1)
    layer: str = Field(min_length=1)
    content: str
    id: str | None = None
    supersedes: str | None = None

    @field_validator("id", "supersedes", mode="before")
    @classmethod
    def _int_ids(cls, value: Any) -> Any:
        # Store ids are integers; JSON dumps of them should load without a manual str().
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value


class OwnerScore(BaseModel):
    precision: float
    recall: float
    f1: float
    n_pred: int
    n_gold: int
    matched: float
    """Sum of the aligned pair scores (S in the seed), not a count."""


class SLResult(BaseModel):
    score: float
    macro: float
    worst: float
    per_owner: dict[str, OwnerScore]


Edge = tuple[StateRecord, StateRecord]
"""An UPDATE edge: (old node, new node)."""


def from_derived(record: DerivedRecord) -> StateRecord:
    """Project a store record onto the scored fields so live states can be compared."""
    return StateRecord(
        owner=record.owner,
        source=record.source,
        layer=str(record.layer),
        content=record.content,
        id=str(record.id),
        supersedes=None if record.supersedes is None else str(record.supersedes),
    )


def load_state(path: str | Path) -> list[StateRecord]:
    """Read a state from JSON: a list of records or ``{"records": [...]}``.

    Raises FileNotFoundError unchanged (the caller reports it) and ValueError, naming the
    path and the reason, for anything else malformed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not valid UTF-8 ({exc.reason})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if isinstance(data, dict):
        if "records" not in data:
            raise ValueError(f'{p}: object has no "records" key')
        data = data["records"]
    if not isinstance(data, list):
        raise ValueError(
            f'{p}: expected a list of records or {{"records": [...]}}, got {type(data).__name__}'
        )
    records: list[StateRecord] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{p}: record {i} is {type(item).__name__}, not an object")
        try:
            records.append(StateRecord.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in err['loc']) or '<record>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValueError(f"{p}: record {i} is invalid: {problems}") from exc
    return records


def tokenize(text: str) -> list[str]:
    """Lowercase, then take [a-z0-9]+ runs and single CJK characters, in order."""
    return _TOKEN_RE.findall(text.lower())


def _token_f1(a: list[str], b: list[str]) -> float:
    if not a or not b:
        return 0.0
    overlap = sum((Counter(a) & Counter(b)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(a)
    recall = overlap / len(b)
    return 2 * precision * recall / (precision + recall)


def content_score(a: str, b: str) -> float:
    """Soft content similarity in [0, 1]: 0.6 token F1 + 0.4 SequenceMatcher ratio."""
    ta, tb = tokenize(a), tokenize(b)
    if not ta and not tb:
        return 1.0
    if not ta or not tb:
        return 0.0
    # Default SequenceMatcher (autojunk on) to match the reference implementation.
    seq = SequenceMatcher(None, " ".join(ta), " ".join(tb)).ratio()
    return ALPHA_TOK * _token_f1(ta, tb) + ALPHA_SEQ * seq


def _norm_party(value: str) -> str:
    folded = value.strip().casefold()
    return GROUP if folded == GROUP.casefold() else folded


def owner_key(owner: str) -> str:
    """Bucket key for an owner: stripped and casefolded, GROUP kept canonical."""
    return _norm_party(owner)


def record_score(pred: StateRecord, gold: StateRecord) -> float:
    """Gated soft match: 0 unless owner, source and layer agree, else content similarity."""
    if (
        _norm_party(pred.owner) != _norm_party(gold.owner)
        or _norm_party(pred.source) != _norm_party(gold.source)
        or pred.layer.strip() != gold.layer.strip()
    ):
        return 0.0
    return content_score(pred.content, gold.content)


def _align(matrix: np.ndarray) -> float:
    """Maximum-weight one-to-one matching; returns the matched score sum."""
    if matrix.size == 0:
        return 0.0
    rows, cols = _assignment()(matrix, maximize=True)
    return float(matrix[rows, cols].sum())


def _soft_f1(matched: float, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    if n_pred == 0 or n_gold == 0 or matched <= 0:
        return 0.0, 0.0, 0.0
    precision = matched / n_pred
    recall = matched / n_gold
    return precision, recall, 2 * precision * recall / (precision + recall)


def speaker_levenshtein(pred: Sequence[StateRecord], gold: Sequence[StateRecord]) -> SLResult:
    """Score a predicted state against a reference state (1.0 = identical, both empty = 1.0)."""
    pred_buckets: dict[str, list[StateRecord]] = {}
    gold_buckets: dict[str, list[StateRecord]] = {}
    for rec in pred:
        pred_buckets.setdefault(owner_key(rec.owner), []).append(rec)
    for rec in gold:
        gold_buckets.setdefault(owner_key(rec.owner), []).append(rec)
    owners = sorted(set(pred_buckets) | set(gold_buckets))
    if not owners:
        return SLResult(score=1.0, macro=1.0, worst=1.0, per_owner={})

    per_owner: dict[str, OwnerScore] = {}
    for owner in owners:
        p_recs = pred_buckets.get(owner, [])
        g_recs = gold_buckets.get(owner, [])
        matrix = np.array(
            [[record_score(p, g) for g in g_recs] for p in p_recs], dtype=float
        ).reshape(len(p_recs), len(g_recs))
        matched = _align(matrix)
        precision, recall, f1 = _soft_f1(matched, len(p_recs), len(g_recs))
        per_owner[owner] = OwnerScore(
            precision=precision,
            recall=recall,
            f1=f1,
            n_pred=len(p_recs),
            n_gold=len(g_recs),
            matched=matched,
        )
    f_values = [s.f1 for s in per_owner.values()]
    macro = sum(f_values) / len(f_values)
    worst = min(f_values)
    return SLResult(
        score=W_MACRO * macro + W_WORST * worst, macro=macro, worst=worst, per_owner=per_owner
    )


def update_edges(state: Sequence[StateRecord]) -> list[Edge]:
    """UPDATE edges of a state: (superseded node, node that supersedes it).

    Records whose ``supersedes`` id is not in the state are skipped: without the old node
    there is nothing to compare.
    """
    by_id = {rec.id: rec for rec in state if rec.id is not None}
    return [
        (by_id[rec.supersedes], rec)
        for rec in state
        if rec.supersedes is not None and rec.supersedes in by_id
    ]


def edge_score(pred: Edge, gold: Edge) -> float:
    """Gated edge match: 0 unless owner and layer agree, else 0.5 old + 0.5 new content."""
    (p_old, p_new), (g_old, g_new) = pred, gold
    if (
        _norm_party(p_new.owner) != _norm_party(g_new.owner)
        or _norm_party(p_old.owner) != _norm_party(g_old.owner)
        or p_new.layer.strip() != g_new.layer.strip()
    ):
        return 0.0
    return W_OLD * content_score(p_old.content, g_old.content) + W_NEW * content_score(
        p_new.content, g_new.content
    )


def chain_score(pred_edges: Sequence[Edge], gold_edges: Sequence[Edge]) -> float:
    """Soft F1 of a one-to-one alignment of UPDATE edges (both empty = 1.0)."""
    if not pred_edges and not gold_edges:
        return 1.0
    matrix = np.array(
        [[edge_score(p, g) for g in gold_edges] for p in pred_edges], dtype=float
    ).reshape(len(pred_edges), len(gold_edges))
    return _soft_f1(_align(matrix), len(pred_edges), len(gold_edges))[2]


def memory_reward(sl: float, chain: float) -> float:
    """Writer memory reward: 0.8 SpeakerLevenshtein + 0.2 chain score."""
    return W_SL * sl + W_CHAIN * chain


def format_report(result: SLResult) -> str:
    """Plain-text table of per-owner scores followed by the combined score."""
    header = ("owner", "n_pred", "n_gold", "P", "R", "F")
    rows = [
        (
            owner,
            str(s.n_pred),
            str(s.n_gold),
            f"{s.precision:.3f}",
            f"{s.recall:.3f}",
            f"{s.f1:.3f}",
        )
        for owner, s in result.per_owner.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    out = [line(header), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    out.append(
        f"SpeakerLevenshtein = {result.score:.4f}"
        f"  (macro {result.macro:.4f}, worst {result.worst:.4f})"
    )
    return "\n".join(out)


def _assignment() -> Any:
    """scipy's Hungarian solver; scipy is an evaluation extra, not a runtime dependency."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "SpeakerLevenshtein needs scipy: pip install 'speakermem[eval]'"
        ) from exc
    return linear_sum_assignment
