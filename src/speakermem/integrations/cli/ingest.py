"""Loading messages through the engine, as `import`, `replay`, `eval` and `backfill` do:
the admission gate's outcomes counted and put in words, then the new messages embedded,
with progress bars."""

from __future__ import annotations

from collections import Counter

from speakermem.integrations.cli.render import advance, progress_bar
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent


async def ingest_events(
    engine: MemoryEngine, events: list[MessageEvent], label: str
) -> Counter[str]:
    """Ingest through the engine's admission gate; returns the outcomes by status."""
    with progress_bar(label, len(events)) as bar:
        outcomes = await engine.ingest_many(events, on_progress=lambda n: advance(bar, n))
    return Counter(o.status.value for o in outcomes)


def outcomes_line(outcomes: Counter[str]) -> str:
    """What was not stored, by the reason the store or its admission gate gave."""
    labels = {
        "duplicate": "already present",
        "deleted": "deleted before they arrived",
        "bot": "bot messages skipped",
        "channel_off": "in channels whose memory is off",
        "opted_out": "by opted-out members",
        "forgotten": "by forgotten members",
    }
    return ", ".join(f"{outcomes[k]} {label}" for k, label in labels.items() if outcomes[k]) or (
        "nothing else"
    )


async def embed_all(engine: MemoryEngine) -> int:
    if engine.embedder is None:
        return 0
    pending = await engine.count_unembedded()
    if not pending:
        return 0
    with progress_bar("embedding", pending) as bar:
        return await engine.embed_pending(on_progress=lambda n: advance(bar, n))
