"""Conversions between SQLite rows and the core's typed models."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from speakermem.memory.models import (
    DerivedRecord,
    Layer,
    RecordScope,
    RecordState,
    Scope,
    Segment,
    SegmentState,
    StoredMessage,
)

MESSAGE_COLUMNS = (
    "id, platform, workspace, channel, message_id, thread_id, speaker_id, speaker_name, text,"
    " ts, session_id, turn_index, reply_to, addressees, edited_at, deleted_at"
)

RECORD_COLUMNS = (
    "id, platform, workspace, channel, layer, record_scope, content, source, owner, event, time,"
    " session_id, state, from_ids, supersedes, superseded_by, chain_root, writer_model,"
    " prompt_version"
)

SEGMENT_COLUMNS = (
    "id, platform, workspace, channel, state, n_messages, attempts, opened_at, last_message_at,"
    " next_attempt_at, last_error"
)


def to_ts(value: datetime) -> float:
    return value.timestamp()


def from_ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def message_from_row(row: Any) -> StoredMessage:
    return StoredMessage(
        pk=row[0],
        scope=Scope(platform=row[1], workspace=row[2], channel=row[3]),
        message_id=row[4],
        thread_id=row[5],
        speaker_id=row[6],
        speaker_name=row[7],
        text=row[8],
        ts=datetime.fromtimestamp(row[9], UTC),
        session_id=row[10],
        turn_index=row[11],
        reply_to=row[12],
        addressees=tuple(json.loads(row[13] or "[]")),
        edited_at=from_ts(row[14]),
        deleted=row[15] is not None,
    )


def record_from_row(row: Any) -> DerivedRecord:
    return DerivedRecord(
        id=row[0],
        scope=Scope(platform=row[1], workspace=row[2], channel=row[3]),
        layer=Layer(row[4]),
        record_scope=RecordScope(row[5]),
        content=row[6],
        source=row[7],
        owner=row[8],
        event=row[9],
        time=datetime.fromtimestamp(row[10], UTC),
        session_id=row[11],
        state=RecordState(row[12]),
        from_ids=tuple(json.loads(row[13])),
        supersedes=row[14],
        superseded_by=row[15],
        chain_root=row[16],
        writer_model=row[17],
        prompt_version=row[18],
    )


def segment_from_row(row: Any) -> Segment:
    return Segment(
        id=row[0],
        scope=Scope(platform=row[1], workspace=row[2], channel=row[3]),
        state=SegmentState(row[4]),
        n_messages=row[5],
        attempts=row[6],
        opened_at=datetime.fromtimestamp(row[7], UTC),
        last_message_at=datetime.fromtimestamp(row[8], UTC),
        next_attempt_at=from_ts(row[9]),
        last_error=row[10],
    )
