"""Typed records shared by every part of the memory core.

These are the boundary models: what adapters hand in (events), what the store
hands back (stored messages, derived records, roster members). Keeping them in
one module gives every layer the same vocabulary.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

MAX_TEXT_CHARS = 40_000
"""Longest message text we store. Discord caps at 4,000 and Slack at 40,000 characters."""

NonEmptyId = Annotated[str, StringConstraints(min_length=1, max_length=256, strip_whitespace=True)]


class Scope(BaseModel):
    """Where a row lives: platform, workspace (guild/team) and channel."""

    model_config = ConfigDict(frozen=True)

    platform: NonEmptyId
    workspace: NonEmptyId
    channel: NonEmptyId

    def key(self) -> tuple[str, str, str]:
        return (self.platform, self.workspace, self.channel)

    def __str__(self) -> str:
        return f"{self.platform}/{self.workspace}/{self.channel}"


def _check_text(value: str) -> str:
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"text is {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    # Lone surrogates come from invalid UTF-8 decoded with surrogateescape: unstorable.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text is not valid UTF-8") from exc
    return value


def utc(ts: datetime) -> datetime:
    """Normalise a timestamp to aware UTC (naive values are taken as UTC)."""
    if ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC)


Text = Annotated[str, AfterValidator(_check_text)]
UtcDatetime = Annotated[datetime, AfterValidator(utc)]


class MessageEvent(BaseModel):
    """A message as an adapter or importer hands it in: the System 1 input."""

    model_config = ConfigDict(frozen=True)

    scope: Scope
    message_id: NonEmptyId
    speaker_id: NonEmptyId
    speaker_name: str = Field(min_length=1, max_length=256)
    text: Text
    ts: UtcDatetime
    thread_id: str | None = None
    reply_to: str | None = None
    addressees: tuple[str, ...] = ()
    speaker_is_bot: bool = False
    session_break: bool = False
    """Force a new session here (importers whose data marks sessions explicitly)."""


class EditEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    scope: Scope
    message_id: NonEmptyId
    text: Text
    edited_at: UtcDatetime
    author_id: str | None = None
    """Who wrote the message, when the platform says: the admission gate keeps no text of
    an edit by a member who opted out or was forgotten, even before the message arrives."""


class DeleteEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    scope: Scope
    message_id: NonEmptyId


class RosterAction(StrEnum):
    JOIN = "join"
    LEAVE = "leave"
    RENAME = "rename"
    ALIAS = "alias"


class RosterEvent(BaseModel):
    """A membership change. `name` is the display name (join/rename) or the alias (alias)."""

    model_config = ConfigDict(frozen=True)

    scope: Scope
    action: RosterAction
    user_id: NonEmptyId
    name: str | None = None
    is_bot: bool = False
    at: UtcDatetime = Field(default_factory=lambda: datetime.now(UTC))


class StoredMessage(BaseModel):
    """A System 1 row as read back from the store."""

    pk: int
    scope: Scope
    message_id: str
    thread_id: str | None
    speaker_id: str
    speaker_name: str
    text: str
    ts: datetime
    session_id: int
    turn_index: int
    reply_to: str | None
    addressees: tuple[str, ...]
    edited_at: datetime | None
    deleted: bool = False


class Layer(StrEnum):
    CORE = "core"
    PROFILE = "profile"
    INTERACTION = "interaction"
    INSIGHT = "insight"


class RecordScope(StrEnum):
    PERSON = "PERSON"
    GROUP = "GROUP"


LAYER_SCOPE: dict[Layer, RecordScope] = {
    Layer.CORE: RecordScope.PERSON,
    Layer.PROFILE: RecordScope.PERSON,
    Layer.INTERACTION: RecordScope.GROUP,
    Layer.INSIGHT: RecordScope.GROUP,
}

GROUP = "GROUP"
"""The owner/source value for group-scoped records."""


class RecordState(StrEnum):
    ACTIVE = "active"
    SUPERSEDED = "superseded"


class DerivedRecord(BaseModel):
    """A System 2 record. Chains are append-only: an update adds a node and links it."""

    id: int
    scope: Scope
    layer: Layer
    record_scope: RecordScope
    content: str
    source: str
    owner: str
    event: str
    time: datetime
    session_id: int | None
    state: RecordState
    from_ids: tuple[str, ...] = Field(min_length=1)
    supersedes: int | None = None
    superseded_by: int | None = None
    chain_root: int
    writer_model: str
    prompt_version: str


class NewRecord(BaseModel):
    """A validated record ready to commit; the system filled every coordinate."""

    layer: Layer
    record_scope: RecordScope
    content: str
    source: str
    owner: str
    event: str
    time: datetime
    session_id: int | None
    from_ids: tuple[str, ...] = Field(min_length=1)
    supersedes: int | None = None
    writer_model: str
    prompt_version: str


class RosterMember(BaseModel):
    user_id: str
    display_name: str
    aliases: tuple[str, ...] = ()
    is_bot: bool = False
    joined_at: datetime | None = None
    left_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.left_at is None


class SearchHit(BaseModel):
    """One ranked System 1 result with the scores that put it there."""

    message: StoredMessage
    score: float
    lexical_rank: int | None = None
    dense_rank: int | None = None


class SegmentState(StrEnum):
    OPEN = "open"
    PENDING = "pending"
    DONE = "done"


class Segment(BaseModel):
    id: int
    scope: Scope
    state: SegmentState
    n_messages: int
    attempts: int
    opened_at: datetime
    last_message_at: datetime
    next_attempt_at: datetime | None = None
    last_error: str | None = None


Tense = Literal["head", "full"]
