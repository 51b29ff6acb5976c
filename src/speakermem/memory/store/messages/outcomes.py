"""What an ingest, an edit or a delete of a message came to (callers report and count these)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from speakermem.memory.governance.policy import Refusal


class IngestStatus(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    """Known already (a forgotten or deleted message keeps its id as a tombstone)."""
    DELETED = "deleted"
    """Its delete arrived first: stored as a tombstone only."""
    # turned away by the admission gate (memory.governance.policy.admission): nothing stored
    BOT = Refusal.BOT.value
    CHANNEL_OFF = Refusal.CHANNEL_OFF.value
    FORGOTTEN = Refusal.FORGOTTEN.value
    OPTED_OUT = Refusal.OPTED_OUT.value

    @property
    def refused(self) -> bool:
        return self.value in REFUSALS


class ChangeStatus(StrEnum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    UNKNOWN = "unknown"
    # an edit whose text the gate turned away (its channel is off and the message is not
    # held, or its author was forgotten or opted out): no text kept
    CHANNEL_OFF = Refusal.CHANNEL_OFF.value
    FORGOTTEN = Refusal.FORGOTTEN.value
    OPTED_OUT = Refusal.OPTED_OUT.value

    @property
    def refused(self) -> bool:
        return self.value in REFUSALS


REFUSALS = frozenset(r.value for r in Refusal)


@dataclass(frozen=True)
class IngestOutcome:
    message_id: str
    status: IngestStatus
    pk: int | None = None
