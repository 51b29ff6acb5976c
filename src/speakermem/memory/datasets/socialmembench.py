"""SocialMemBench networks -> one channel per network, turns stored as platform messages.

A network file holds a group chat over dated sessions and its questions. Each turn becomes a
`MessageEvent` the way a live Discord reply arrives: `message_id` is the turn id, the speaker
keeps their stable `speaker_id` and display name, and a turn that answers another carries
`reply_to` = that turn's id with the replied-to author among its `addressees` (as
`integrations/discord/translate.py` stores a reply), so the interaction graph and the evidence
expansion read the same links they read live. Sessions keep their topic and time in
`Dataset.sessions`; the first turn of each session is marked as a session start.

Questions keep category, difficulty, answer format, options and the correct option; the gold
evidence is the set of their anchors' turn ids (every one is needed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speakermem.memory.datasets.common import (
    Dataset,
    DatasetError,
    DatasetSession,
    EvalQuestion,
    load_json,
)
from speakermem.memory.models import MessageEvent, Scope

PLATFORM = "socialmembench"
WORKSPACE = "socialmembench"

CATEGORY_NAMES = {
    "Q1": "preference inferred from behaviour",
    "Q2": "quiet disagreement with a group decision",
    "Q3": "each member's stance",
    "Q4": "who said it",
    "Q5": "knowing another member's preference",
    "Q6": "exception to a group norm",
    "Q7": "relationship between two members",
    "Q8": "change over time",
    "Q9": "members who left",
}
"""What each category asks (read from the questions; the dev set has Q1 to Q8)."""


INTERLEAVED = "interleaved"
"""The channel of the interleaved variant (`interleave`)."""


def network_files(paths: Iterable[Path]) -> list[Path]:
    """The network files named, folders expanded to their `*.json` files (sorted)."""
    return list(grouped_network_files(paths))


def grouped_network_files(paths: Iterable[Path]) -> dict[Path, str]:
    """Network file -> its group: the name of the folder named on the command line (or of
    a named file's folder), so the small and the larger development sets report apart."""
    out: dict[Path, str] = {}
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise DatasetError(f"{path}: no .json network files in this folder")
            for f in found:
                out.setdefault(f, path.resolve().name)
        elif path.exists():
            out.setdefault(path, path.resolve().parent.name)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return out


def read_socialmembench(paths: Path | Sequence[Path], *, sessions: bool = True) -> Dataset:
    """Networks from files and/or folders, a channel each. `sessions=False` drops the session
    markers (the turns' own times still separate sessions, as in a live channel)."""
    files = grouped_network_files([paths] if isinstance(paths, Path) else paths)
    dataset = Dataset(name="socialmembench", messages=[], questions=[])
    seen: dict[str, Path] = {}
    for path, group in files.items():
        data = load_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), list):
            raise DatasetError(
                f"{path}: expected a SocialMemBench network (an object with sessions)"
            )
        try:
            part = read_network(data, sessions=sessions)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise DatasetError(f"{path}: network is malformed ({exc!r})") from exc
        channel = part.messages[0].scope.channel if part.messages else path.stem
        if channel in seen:
            raise DatasetError(f"{path}: network {channel} was already read from {seen[channel]}")
        seen[channel] = path
        dataset.messages.extend(part.messages)
        dataset.questions.extend(q.model_copy(update={"group": group}) for q in part.questions)
        dataset.sessions.extend(part.sessions)
    return dataset


def network_id(data: dict[str, Any]) -> str:
    meta = data.get("meta") or {}
    nid = meta.get("network_id") if isinstance(meta, dict) else None
    if nid:
        return str(nid)
    first = data["sessions"][0]["session_id"]
    return str(first).rsplit("_s", 1)[0]


def _time(value: Any) -> datetime:
    ts = datetime.fromisoformat(str(value))
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def read_network(data: dict[str, Any], *, sessions: bool = True) -> Dataset:
    """One network as a channel: messages in session and turn order, then its questions."""
    nid = network_id(data)
    scope = Scope(platform=PLATFORM, workspace=WORKSPACE, channel=nid)
    messages: list[MessageEvent] = []
    speaker_of: dict[str, str] = {}
    dsessions: list[DatasetSession] = []
    ordered = sorted(data["sessions"], key=lambda s: int(s.get("session_index", 0)))
    for session in ordered:
        turns = list(session.get("turns") or [])
        if not turns:
            continue
        start = _time(session.get("ts") or turns[0]["ts"])
        dsessions.append(
            DatasetSession(
                scope=scope,
                index=int(session.get("session_index", len(dsessions) + 1)),
                session_id=str(session.get("session_id", "")),
                topic=str(session.get("topic", "")),
                start=start,
                first_message_id=str(turns[0]["turn"]),
            )
        )
        for n, turn in enumerate(turns):
            mid = str(turn["turn"])
            speaker_id = str(turn.get("speaker_id") or turn["speaker"])
            parent = str(turn.get("reply_to") or "") or None
            if parent is not None and parent not in speaker_of:
                parent = None  # a reply to a turn the file does not have: stored as plain
            addressees: tuple[str, ...] = ()
            if parent is not None and speaker_of[parent] != speaker_id:
                addressees = (speaker_of[parent],)
            messages.append(
                MessageEvent(
                    scope=scope,
                    message_id=mid,
                    speaker_id=speaker_id,
                    speaker_name=str(turn["speaker"]),
                    text=str(turn.get("content", "")),
                    ts=_time(turn["ts"]),
                    reply_to=parent,
                    addressees=addressees,
                    session_break=sessions and n == 0,
                )
            )
            speaker_of[mid] = speaker_id
    questions = [
        _question(qa, scope, nid, i, speaker_of) for i, qa in enumerate(data.get("qa_pairs") or [])
    ]
    return Dataset(
        name="socialmembench", messages=messages, questions=questions, sessions=dsessions
    )


def _question(
    qa: dict[str, Any], scope: Scope, nid: str, i: int, known: dict[str, str]
) -> EvalQuestion:
    evidence: list[str] = []
    for anchor in qa.get("evidence_anchors") or []:
        mid = str(anchor.get("turn_id", "")) if isinstance(anchor, dict) else ""
        if mid in known and mid not in evidence:
            evidence.append(mid)
    options = qa.get("options") or {}
    fmt = str(qa.get("answer_format") or "long_form")
    correct = str(qa.get("correct_option") or "")
    return EvalQuestion(
        id=f"{nid}:{qa.get('id') or f'q{i}'}",
        scope=scope,
        question=str(qa["question"]),
        answer=str(qa.get("answer", "")),
        evidence=evidence,
        category=str(qa.get("category") or "other"),
        difficulty=str(qa["difficulty"]) if qa.get("difficulty") else None,
        answer_format=fmt,
        options={str(k): str(v) for k, v in options.items()} if isinstance(options, dict) else {},
        correct_option=correct or None,
    )


def interleave(dataset: Dataset) -> Dataset:
    """Every network of `dataset` in one channel, a bigger haystack: each session kept
    whole, sessions in order of their start (ties by network order), speaker ids prefixed
    by their network so members of different networks stay distinct people (display names
    may repeat, as in a real channel). Questions keep their gold turn ids and group."""
    scope = Scope(platform=PLATFORM, workspace=WORKSPACE, channel=INTERLEAVED)
    starts = {s.first_message_id: s for s in dataset.sessions}
    order = {sc: i for i, sc in enumerate(dataset.scopes)}
    blocks: list[tuple[datetime, int, int, list[MessageEvent]]] = []
    for m in dataset.messages:
        if m.message_id in starts or not blocks:
            start = starts[m.message_id].start if m.message_id in starts else m.ts
            blocks.append((start, order[m.scope], len(blocks), []))
        blocks[-1][3].append(m)
    blocks.sort(key=lambda b: (b[0], b[1], b[2]))
    messages = [
        m.model_copy(
            update={
                "scope": scope,
                "speaker_id": f"{m.scope.channel}:{m.speaker_id}",
                "addressees": tuple(f"{m.scope.channel}:{a}" for a in m.addressees),
            }
        )
        for *_, block in blocks
        for m in block
    ]
    sessions = [
        s.model_copy(update={"scope": scope})
        for s in sorted(dataset.sessions, key=lambda s: (s.start, order[s.scope]))
    ]
    questions = [q.model_copy(update={"scope": scope}) for q in dataset.questions]
    return Dataset(
        name=f"{dataset.name}-{INTERLEAVED}",
        messages=messages,
        questions=questions,
        sessions=sessions,
    )
