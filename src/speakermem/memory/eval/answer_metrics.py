"""Answer-level metrics: token F1, evidence recall, and the binary LLM-judge prompt.

token F1 follows the seed's supplementary implementation exactly (token *sets*, not
multisets), so numbers stay comparable with the published tables. The judge pieces are pure:
rendering messages and parsing the reply; calling a model is the caller's job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_WS = re.compile(r"\s+")

JUDGE_PROMPT_VERSION = "judge-v1"


def _answer_tokens(text: str) -> set[str]:
    text = text.lower().strip().rstrip(".").strip()
    return set(_WS.sub(" ", text).split(" ")) - {""}


def token_f1(prediction: str, reference: str) -> float:
    """Set-based token F1: lowercase, strip whitespace and trailing periods, split on space.

    Returns 0.0 when either side has no tokens or they share none.
    """
    pred, ref = _answer_tokens(prediction), _answer_tokens(reference)
    if not pred or not ref:
        return 0.0
    overlap = len(pred & ref)
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred)
    recall = overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def _top_k_hits(gold: set[str], retrieved: Sequence[str], k: int) -> set[str]:
    # An empty gold set has no meaningful recall; callers must skip such questions
    # (e.g. unanswerable ones) rather than silently count them as 0 or 1.
    if not gold:
        raise ValueError("gold evidence set is empty; skip this question")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return gold & set(retrieved[:k])


def evidence_recall(
    gold: set[str], retrieved: Sequence[str], k: int, any_of: bool = False
) -> float:
    """Share of gold evidence ids in the top-k retrieved.

    ``any_of=True`` scores 1.0 if any gold id is found, for datasets (FriendsQA) whose gold
    lists alternative evidence rather than evidence that is all needed.
    """
    hits = _top_k_hits(gold, retrieved, k)
    if any_of:
        return 1.0 if hits else 0.0
    return len(hits) / len(gold)


def all_hit(gold: set[str], retrieved: Sequence[str], k: int, any_of: bool = False) -> bool:
    """Whether the top-k holds all gold evidence (or any of it with ``any_of``)."""
    hits = _top_k_hits(gold, retrieved, k)
    return bool(hits) if any_of else len(hits) == len(gold)


_JUDGE_SYSTEM = """\
You grade answers produced by a memory system about a group conversation.
You are given a question, a gold (reference) answer, and the system's answer.
Decide whether the system answer is CORRECT or WRONG with respect to the gold answer.

Be generous about form and strict about substance:
- Mark CORRECT when the system answer states the same fact as the gold answer, even if it \
is paraphrased, longer, differently formatted, or uses a different but equivalent date, \
time, number or name format (e.g. "May 7th" vs "7 May 2023").
- Mark CORRECT when the system answer contains the gold answer plus extra detail, as long \
as the extra detail does not contradict the gold answer.
- Mark WRONG when the system answer names a different person, object, time or value, \
contradicts the gold answer, misses an essential part of it, hedges between several \
answers, or says it does not know while the gold answer gives a fact.
- Judge only against the gold answer; do not use outside knowledge.

Reply with JSON only: {"label": "CORRECT" or "WRONG", "reason": "<one short sentence>"}."""

_JUDGE_USER = """\
Question: {question}
Gold answer: {gold_answer}
System answer: {system_answer}

Is the system answer CORRECT or WRONG? Reply with the JSON object only."""

JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["CORRECT", "WRONG"]},
        "reason": {"type": "string"},
    },
    "required": ["label", "reason"],
    "additionalProperties": False,
}
"""JSON schema for the judge reply (strict-mode compatible: all keys required, no extras)."""


def render_judge_messages(question: str, gold_answer: str, system_answer: str) -> list[dict]:
    """Chat messages for the binary judge; the user turn always carries all three fields."""
    return [
        {"role": "system", "content": _JUDGE_SYSTEM},
        {
            "role": "user",
            "content": _JUDGE_USER.format(
                question=question.strip(),
                gold_answer=str(gold_answer).strip(),
                system_answer=system_answer.strip() or "(empty)",
            ),
        },
    ]


def parse_judgement(data: dict | None) -> bool | None:
    """CORRECT -> True, WRONG -> False, anything unusable -> None (caller retries or logs).

    Only ``label`` is required; the reason is informative and its absence is not fatal.
    """
    if not isinstance(data, dict):
        return None
    label = data.get("label")
    if not isinstance(label, str):
        return None
    label = label.strip().upper()
    if label == "CORRECT":
        return True
    if label == "WRONG":
        return False
    return None
