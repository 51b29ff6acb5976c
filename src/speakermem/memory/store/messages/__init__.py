"""System 1's messages: ingest, edits and deletes, reads (each backend adds its search)."""

from speakermem.memory.store.messages.outcomes import (
    REFUSALS,
    ChangeStatus,
    IngestOutcome,
    IngestStatus,
)
from speakermem.memory.store.messages.repo import MessageRepo
from speakermem.memory.store.messages.text import embed_text, speaker_phrase

__all__ = [
    "REFUSALS",
    "ChangeStatus",
    "IngestOutcome",
    "IngestStatus",
    "MessageRepo",
    "embed_text",
    "speaker_phrase",
]
