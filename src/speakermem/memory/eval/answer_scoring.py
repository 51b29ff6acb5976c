"""How an evaluation scores an answer, by the question's answer format (SocialMemBench).

- `multiple_choice`: exactly, by the option the answer chose; no judge. The answerer sees the
  options (`options_note`) and is asked to open with the letter it picks.
- `short_answer`: a normalised match of the short gold answer inside the answer; when it
  does not match, the binary judge (`answer_metrics.render_judge_messages`) decides.
- `long_form`: an LLM judge with a rubric (`render_rubric_messages`, RUBRIC_PROMPT_VERSION):
  it lists the reference answer's key points and marks each covered, partly covered or
  missing, and flags wrong attribution (a point given to the wrong person) and
  contradictions. The score is the points' mean credit (1, 0.5, 0), halved by a wrong
  attribution or a contradiction; the answer counts as correct at 0.5 or more.
- no format (LoCoMo, FriendsQA): the binary judge, as before.

Pure: prompts, parsing and scores; calling the model is the harness's job. The rubric's
output model (`RubricVerdict`) sits next to its render function and schema so the three
change together, under one version.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

RUBRIC_PROMPT_VERSION = "rubric-v1"
PASS_SCORE = 0.5
"""A rubric score at or above this counts as a correct answer (binary accuracy)."""
MAX_POINTS = 6

ScoreMethod = Literal["option", "match", "judge", "rubric"]


class AnswerScore(BaseModel):
    """One answer's score: how it was scored, whether it is correct, and its credit."""

    method: ScoreMethod
    correct: bool | None
    """None: the judge gave no usable verdict (counted as unscored, not as wrong)."""
    score: float | None
    """Partial credit in [0, 1] (rubric); 1/0 for the other methods."""
    chosen: str | None = None
    """Multiple choice: the option letter the answer chose (None: none recognised)."""

    @classmethod
    def binary(cls, method: ScoreMethod, correct: bool | None, **extra: Any) -> AnswerScore:
        return cls(
            method=method,
            correct=correct,
            score=None if correct is None else float(correct),
            **extra,
        )


# ---------------------------------------------------------------- multiple choice


def options_note(options: Mapping[str, str]) -> str:
    """What the answerer is told about a multiple-choice question."""
    lines = "\n".join(f"({letter}) {text}" for letter, text in sorted(options.items()))
    return (
        f"Options:\n{lines}\n"
        "This is a multiple-choice question: start your answer with the letter of the one "
        'option you choose, in parentheses (for example "(A)"), then say why, with citations.'
    )


def chosen_option(answer: str, options: Mapping[str, str]) -> str | None:
    """The option letter an answer chose: a leading "(B)", "B)", "B." or "B:", or "answer:
    B" / "option B"; else the one option whose text the answer names (None when it names
    several or none)."""
    letters = {k.strip().upper(): k for k in options}
    if not letters:
        return None
    alt = "|".join(re.escape(k) for k in sorted(letters, key=len, reverse=True))
    patterns = (
        rf"^\W{{0,3}}\(?\s*({alt})\s*[).:\]]",
        rf"^\W{{0,3}}({alt})\s*$",
        rf"\b(?:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*\(?({alt})\)?(?![\w'])",
        rf"\(({alt})\)",
    )
    text = answer.strip()
    for pattern in patterns:
        m = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
        if m:
            return letters[m.group(1).upper()]
    named = [
        letter
        for letter, opt in options.items()
        if opt.strip() and re.search(rf"(?<!\w){re.escape(opt.strip())}(?!\w)", text, re.I)
    ]
    return named[0] if len(named) == 1 else None


# ---------------------------------------------------------------- short answers

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "\u2018\u2019\u201c\u201d"})


def normalise(text: str) -> str:
    """Lower case, punctuation and articles dropped, whitespace collapsed (as SQuAD)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def short_match(answer: str, gold: str) -> bool:
    """Whether the normalised gold answer occurs, as whole words, in the normalised answer."""
    want = normalise(gold)
    if not want:
        return False
    return f" {want} " in f" {normalise(answer)} "


# ---------------------------------------------------------------- long-form rubric


class RubricPoint(BaseModel):
    point: str
    verdict: Literal["covered", "partial", "missing"]


class RubricVerdict(BaseModel):
    """The rubric judge's reply (RUBRIC_SCHEMA) and the score it gives."""

    points: list[RubricPoint] = Field(min_length=1, max_length=MAX_POINTS)
    wrong_attribution: bool
    contradiction: bool
    reason: str = ""

    @property
    def score(self) -> float:
        credit = {"covered": 1.0, "partial": 0.5, "missing": 0.0}
        mean = sum(credit[p.verdict] for p in self.points) / len(self.points)
        if self.wrong_attribution or self.contradiction:
            mean /= 2
        return round(mean, 4)


RUBRIC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "points": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_POINTS,
            "items": {
                "type": "object",
                "properties": {
                    "point": {"type": "string"},
                    "verdict": {"type": "string", "enum": ["covered", "partial", "missing"]},
                },
                "required": ["point", "verdict"],
                "additionalProperties": False,
            },
        },
        "wrong_attribution": {"type": "boolean"},
        "contradiction": {"type": "boolean"},
        "reason": {"type": "string"},
    },
    "required": ["points", "wrong_attribution", "contradiction", "reason"],
    "additionalProperties": False,
}
"""JSON schema of `RubricVerdict` (strict-mode compatible)."""

_RUBRIC_SYSTEM = f"""\
You grade long answers produced by a memory system about a group chat, against a reference \
answer written by the benchmark's authors.

1. List the reference answer's key points: at most {MAX_POINTS}, each one checkable claim \
about who said, did, felt or knew what, how members relate, or what changed and when. \
Leave out the reference's own commentary and quotations that only illustrate a point.
2. For each point, decide whether the system answer states it: "covered" (same substance, \
any wording), "partial" (the right direction but missing an essential part, such as the \
person, the reason or the time), or "missing".
3. wrong_attribution: true when the system answer gives a statement, stance or action to \
the wrong person (for example says Alice did what Bob did).
4. contradiction: true when the system answer asserts something the reference contradicts.

Judge only against the reference; do not use outside knowledge. Extra detail that does not \
contradict the reference is fine. Reply with JSON only: {{"points": [{{"point": "...", \
"verdict": "covered" | "partial" | "missing"}}], "wrong_attribution": true | false, \
"contradiction": true | false, "reason": "<one short sentence>"}}."""

_RUBRIC_USER = """\
Question: {question}
Reference answer: {reference}
System answer: {answer}

Grade the system answer with the rubric. Reply with the JSON object only."""


def render_rubric_messages(question: str, reference: str, answer: str) -> list[dict[str, str]]:
    """Chat messages for the long-form rubric judge (RUBRIC_PROMPT_VERSION)."""
    return [
        {"role": "system", "content": _RUBRIC_SYSTEM},
        {
            "role": "user",
            "content": _RUBRIC_USER.format(
                question=question.strip(),
                reference=reference.strip(),
                answer=answer.strip() or "(empty)",
            ),
        },
    ]


def parse_rubric(data: object) -> RubricVerdict | None:
    """The judge's verdict, or None when the reply is unusable."""
    if not isinstance(data, dict):
        return None
    try:
        return RubricVerdict.model_validate(data)
    except ValidationError:
        return None


def rubric_score(verdict: RubricVerdict | None) -> AnswerScore:
    if verdict is None:
        return AnswerScore(method="rubric", correct=None, score=None)
    return AnswerScore(method="rubric", correct=verdict.score >= PASS_SCORE, score=verdict.score)
