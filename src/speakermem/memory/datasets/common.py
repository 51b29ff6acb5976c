"""The shape every dataset reader returns: messages, questions, optional observations."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from speakermem.memory.models import MessageEvent, Scope


class DatasetError(ValueError):
    """The file is not in the expected format; the message says where and why."""


class EvalQuestion(BaseModel):
    id: str
    scope: Scope
    question: str
    answer: str
    evidence: list[str] = Field(default_factory=list)
    """Gold message ids (platform ids within `scope`)."""
    any_of: bool = False
    """True when any one gold message counts as found (FriendsQA's alternative answers)."""
    category: str
    adversarial_answer: str | None = None
    difficulty: str | None = None
    """easy / medium / hard where the dataset grades its questions (SocialMemBench)."""
    answer_format: str | None = None
    """long_form, short_answer or multiple_choice (SocialMemBench); None = short free text."""
    options: dict[str, str] = Field(default_factory=dict)
    """Multiple choice: option letter -> text."""
    correct_option: str | None = None
    """Multiple choice: the right letter; short answers: a short gold answer."""
    group: str | None = None
    """The part of the dataset the question came from, where it has parts (SocialMemBench:
    the folder or file named on the command line), reported apart."""


class DatasetSession(BaseModel):
    """A session as the dataset describes it (topic and start), kept beside the messages."""

    scope: Scope
    index: int
    session_id: str
    topic: str
    start: datetime
    first_message_id: str


class Observation(BaseModel):
    """A derived fact with its evidence, usable as replayed Writer output."""

    scope: Scope
    speaker_id: str
    fact: str
    evidence: list[str]
    session: int


class Dataset(BaseModel):
    name: str
    messages: list[MessageEvent]
    questions: list[EvalQuestion]
    observations: list[Observation] = Field(default_factory=list)
    sessions: list[DatasetSession] = Field(default_factory=list)

    @property
    def scopes(self) -> list[Scope]:
        seen: dict[Scope, None] = {}
        for m in self.messages:
            seen.setdefault(m.scope, None)
        return list(seen)


def load_json(path: Path) -> Any:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


_SLUG = re.compile(r"[^a-z0-9]+")


def slug(name: str) -> str:
    """A stable user id from a display name ('Ross Geller' -> 'ross_geller')."""
    return _SLUG.sub("_", name.casefold()).strip("_") or "unknown"
