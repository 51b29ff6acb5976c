"""After an edit: does the edited evidence still support each record that cites it?

The Writer's evidence gate (memory.writer.gate) judges, with what it judged at commit time:
the record's text against its cited messages' text, the speakers' names and aliases, the
people they address, the messages' dates, the record's owner and source, and the record it
superseded. `gate_inputs` gathers those terms (pure); `still_supported` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, DerivedRecord, StoredMessage
from speakermem.memory.writer.gate import EvidenceGate, date_terms


def gate_inputs(
    record: DerivedRecord,
    cited: Sequence[StoredMessage],
    names: dict[str, list[str]],
    superseded: DerivedRecord | None,
) -> tuple[list[str], list[str]]:
    """(speaker names, context terms) the gate matches the record against.

    `names`: user id -> display name and aliases of the channel's members."""
    speakers: list[str] = []
    context: list[str] = []
    for m in cited:
        speakers.append(m.speaker_name)
        speakers.extend(names.get(m.speaker_id, []))
        for uid in m.addressees:
            context.extend(names.get(uid, [uid]))
        context.extend(date_terms(m.ts))
    for uid in (record.owner, record.source):
        if uid != GROUP:
            context.extend(names.get(uid, []))
    if superseded is not None:
        context.append(superseded.content)
    return speakers, context


async def still_supported(engine: MemoryEngine, gate: EvidenceGate, record_id: int) -> bool:
    """Whether the record's live cited messages still pass the gate (a record already gone
    counts as supported: there is nothing to withdraw)."""
    got = await engine.store.records.get_many([record_id])
    rec = got.get(record_id)
    if rec is None:
        return True
    cited = list((await engine.store.messages.by_ids(rec.scope, rec.from_ids)).values())
    cited = [m for m in cited if not m.deleted]
    if not cited:
        return False
    names: dict[str, list[str]] = {}
    for member in await engine.members(rec.scope, include_left=True):
        names[member.user_id] = [member.display_name, *member.aliases]
    prev = None
    if rec.supersedes is not None:
        prev = (await engine.store.records.get_many([rec.supersedes])).get(rec.supersedes)
    speakers, context = gate_inputs(rec, cited, names, prev)
    score = gate.score(rec.content, [m.text for m in cited], speakers, context_terms=context)
    return score.passed
