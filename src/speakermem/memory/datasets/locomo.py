"""LoCoMo JSON -> one channel per sample, message ids = dia_id, a session per session_N.

Turns carry no time of their own: each turn is placed 30 s after the previous one,
from its session's `session_N_date_time`, so order and session dates are kept.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from speakermem.memory.datasets.common import (
    Dataset,
    DatasetError,
    EvalQuestion,
    Observation,
    load_json,
    slug,
)
from speakermem.memory.models import MessageEvent, Scope

PLATFORM = "locomo"
WORKSPACE = "locomo"
TURN_SPACING = timedelta(seconds=30)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


def parse_session_time(value: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> aware UTC datetime."""
    text = " ".join(value.replace(",", " ").split())
    for fmt in ("%I:%M %p on %d %B %Y", "%I:%M %p on %d %b %Y", "%d %B %Y", "%B %d %Y"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise DatasetError(f"unrecognised session time {value!r}")


def split_evidence(entries: list[Any]) -> list[str]:
    out: list[str] = []
    for entry in entries:
        for part in _EVIDENCE_SPLIT.split(str(entry)):
            if part and part not in out:
                out.append(part)
    return out


def read_locomo(path: Path, *, sessions: bool = True) -> Dataset:
    """LoCoMo samples, a channel each. `sessions=False` drops the session markers; the
    sessions' dates stay (a live channel has real times too), so gaps still split them."""
    data = load_json(path)
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of LoCoMo samples")
    messages: list[MessageEvent] = []
    questions: list[EvalQuestion] = []
    observations: list[Observation] = []
    for n, sample in enumerate(data):
        try:
            sample_msgs, sample_qs, sample_obs = _read_sample(sample, marked=sessions)
        except (KeyError, TypeError, AttributeError) as exc:
            raise DatasetError(f"{path}: sample {n} is malformed ({exc!r})") from exc
        messages.extend(sample_msgs)
        questions.extend(sample_qs)
        observations.extend(sample_obs)
    return Dataset(name="locomo", messages=messages, questions=questions, observations=observations)


def _read_sample(
    sample: dict[str, Any], *, marked: bool = True
) -> tuple[list[MessageEvent], list[EvalQuestion], list[Observation]]:
    sample_id = str(sample["sample_id"])
    scope = Scope(platform=PLATFORM, workspace=WORKSPACE, channel=sample_id)
    conv = sample["conversation"]
    speakers = [conv.get("speaker_a"), conv.get("speaker_b")]
    sessions = sorted(
        int(m.group(1)) for key in conv if (m := _SESSION_KEY.match(key)) and conv[key]
    )
    messages: list[MessageEvent] = []
    for session in sessions:
        start = parse_session_time(conv[f"session_{session}_date_time"])
        for turn, item in enumerate(conv[f"session_{session}"]):
            text = str(item.get("text", ""))
            caption = item.get("blip_caption")
            if caption:
                text = f"{text} [shares image: {caption}]".strip()
            speaker = str(item["speaker"])
            others = [s for s in speakers if s and s != speaker]
            messages.append(
                MessageEvent(
                    scope=scope,
                    message_id=str(item["dia_id"]),
                    speaker_id=slug(speaker),
                    speaker_name=speaker,
                    text=text,
                    ts=start + turn * TURN_SPACING,
                    addressees=tuple(slug(o) for o in others),
                    session_break=marked and turn == 0,
                )
            )
    known = {m.message_id for m in messages}
    questions: list[EvalQuestion] = []
    for i, qa in enumerate(sample.get("qa", [])):
        category = int(qa.get("category", 0))
        evidence = [e for e in split_evidence(qa.get("evidence", [])) if e in known]
        answer = qa.get("answer", qa.get("adversarial_answer", ""))
        questions.append(
            EvalQuestion(
                id=f"{sample_id}:q{i}",
                scope=scope,
                question=str(qa["question"]),
                answer=str(answer),
                evidence=evidence,
                category=CATEGORIES.get(category, str(category)),
                adversarial_answer=qa.get("adversarial_answer"),
            )
        )
    observations: list[Observation] = []
    for key, per_speaker in (sample.get("observation") or {}).items():
        m = re.match(r"session_(\d+)_observation", key)
        if not m or not isinstance(per_speaker, dict):
            continue
        for speaker, facts in per_speaker.items():
            for fact in facts or []:
                if not isinstance(fact, list) or len(fact) < 2:
                    continue
                ids = fact[1] if isinstance(fact[1], list) else [fact[1]]
                observations.append(
                    Observation(
                        scope=scope,
                        speaker_id=slug(speaker),
                        fact=str(fact[0]),
                        evidence=split_evidence(ids),
                        session=int(m.group(1)),
                    )
                )
    return messages, questions, observations
