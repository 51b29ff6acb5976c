"""FriendsQA JSON -> one long channel `friendsqa`: scenes in title order, a session each.

Scenes carry no time: scene i is placed i days after a fixed base date and each
utterance 30 s after the previous one. Message ids are `<scene title>:<uid>`.

With `sessions=False` the scene boundaries are hidden, as in a live channel: no session
markers, and every utterance 30 s after the previous one across scenes, so neither a
marker nor a time gap gives a scene away.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from speakermem.memory.datasets.common import Dataset, DatasetError, EvalQuestion, load_json, slug
from speakermem.memory.models import MessageEvent, Scope

PLATFORM = "friendsqa"
WORKSPACE = "friendsqa"
CHANNEL = "friendsqa"
BASE = datetime(1995, 1, 1, 18, 0, tzinfo=UTC)
TURN_SPACING = timedelta(seconds=30)


def read_friendsqa(path: Path, *, sessions: bool = True) -> Dataset:
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DatasetError(f'{path}: expected {{"data": [scenes...]}} (FriendsQA format)')
    scope = Scope(platform=PLATFORM, workspace=WORKSPACE, channel=CHANNEL)
    scenes = sorted(data["data"], key=lambda s: str(s.get("title", "")))
    messages: list[MessageEvent] = []
    questions: list[EvalQuestion] = []
    for index, scene in enumerate(scenes):
        try:
            start = BASE + timedelta(days=index)
            if not sessions:
                start = BASE + len(messages) * TURN_SPACING
            _read_scene(scene, start, scope, messages, questions, sessions=sessions)
        except (KeyError, TypeError, AttributeError) as exc:
            raise DatasetError(f"{path}: scene {index} is malformed ({exc!r})") from exc
    return Dataset(name="friendsqa", messages=messages, questions=questions)


def _speaker(names: list[Any]) -> tuple[str, str]:
    """The first listed speaker (10 of 2,847 utterances list several; the roster stays clean)."""
    clean = [str(n).strip() for n in names if str(n).strip()] or ["unknown"]
    return slug(clean[0]), clean[0]


def _read_scene(
    scene: dict[str, Any],
    start: datetime,
    scope: Scope,
    messages: list[MessageEvent],
    questions: list[EvalQuestion],
    *,
    sessions: bool = True,
) -> None:
    title = str(scene["title"])
    turn = 0
    known: set[str] = set()
    for paragraph in scene["paragraphs"]:
        for utt in paragraph.get("utterances:", paragraph.get("utterances", [])):
            speaker_id, speaker_name = _speaker(utt.get("speakers", []))
            message_id = f"{title}:{utt['uid']}"
            if message_id in known:
                continue
            known.add(message_id)
            messages.append(
                MessageEvent(
                    scope=scope,
                    message_id=message_id,
                    speaker_id=speaker_id,
                    speaker_name=speaker_name,
                    text=str(utt.get("utterance", "")),
                    ts=start + turn * TURN_SPACING,
                    session_break=sessions and turn == 0,
                )
            )
            turn += 1
        for qa in paragraph.get("qas", []):
            evidence: list[str] = []
            for ans in qa.get("answers", []):
                mid = f"{title}:{ans.get('utterance_id')}"
                if mid in known and mid not in evidence:
                    evidence.append(mid)
            qid = str(qa.get("id", f"{title}:{len(questions)}"))
            word = _question_type(qid, title)
            answers = [str(a.get("answer_text", "")) for a in qa.get("answers", [])]
            questions.append(
                EvalQuestion(
                    id=qid,
                    scope=scope,
                    question=str(qa["question"]),
                    answer=answers[0] if answers else "",
                    evidence=evidence,
                    any_of=True,
                    category=word,
                )
            )


def _question_type(qid: str, title: str) -> str:
    """The wh-word in the question id ('s01_e23_c06_Who_Paraphrased' -> 'who')."""
    rest = qid[len(title) :].strip("_") if qid.startswith(title) else qid
    return (rest.split("_")[0] or "other").lower()
