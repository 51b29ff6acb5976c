"""Replay writer: LoCoMo `observation` entries as Writer output, without an LLM.

Each observation becomes a PERSON ADD (owner = source = the speaker, refs = its
dia_ids) and goes through the same validation (including the evidence gate) and
commit path as a real Writer's actions, so System 2 can be evaluated offline.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memory.datasets.common import Observation
from memory.engine import MemoryEngine
from memory.models import Layer, Scope
from memory.writer.runner import gate_from
from memory.writer.validate import ValidationContext, build_name_index, validate_actions

REPLAY_MODEL = "replay:locomo-observations"
REPLAY_PROMPT_VERSION = "replay-v1"

_CORE_MARKERS = re.compile(
    r"\b(is a|is an|identifies|works as|works at|lives in|grew up|was born|has (?:a|an|two|"
    r"three|\d+)|loves|likes|enjoys|favorite|favourite|passionate|always|usually|often|values|"
    r"believes|dreams? of|goal|plans? to|wants to|hopes to)\b",
    re.IGNORECASE,
)


def observation_layer(fact: str) -> Layer:
    """Stable traits, preferences and standing goals -> core; events and episodes -> profile."""
    return Layer.CORE if _CORE_MARKERS.search(fact) else Layer.PROFILE


@dataclass
class ReplayReport:
    proposed: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)


async def replay_observations(
    engine: MemoryEngine,
    observations: Sequence[Observation],
    *,
    on_progress: Callable[[int], None] | None = None,
) -> ReplayReport:
    report = ReplayReport()
    groups: dict[tuple[Scope, int], list[Observation]] = {}
    for obs in observations:
        groups.setdefault((obs.scope, obs.session), []).append(obs)
    gate = gate_from(engine.config.writer)
    for (scope, _session), group in groups.items():
        ids = sorted({mid for obs in group for mid in obs.evidence})
        messages = await engine.store.messages.by_ids(scope, ids)
        roster = await engine.members(scope, include_left=True)
        raw = {
            "actions": [
                {
                    "type": "ADD",
                    "layer": observation_layer(obs.fact).value,
                    "source": obs.speaker_id,
                    "owner": obs.speaker_id,
                    "content": obs.fact,
                    "event": "",
                    "refs": obs.evidence,
                }
                for obs in group
            ]
        }
        pks = await engine.channel_pks([scope])
        heads = {h.id: h for h in await engine.store.records.heads(pks)}
        ctx = ValidationContext(
            roster_ids={m.user_id for m in roster},
            heads=heads,
            all_records_channel={},
            ref_map=dict(messages),
            scope=scope,
            budget=len(group),
            gate=gate,
            names=build_name_index(roster),
        )
        result = validate_actions(raw, ctx)
        records = [
            a.to_new_record(writer_model=REPLAY_MODEL, prompt_version=REPLAY_PROMPT_VERSION)
            for a in result.accepted
        ]
        vectors = (
            await engine.embedder.embed([r.content for r in records])
            if records and engine.embedder is not None
            else None
        )
        if records:
            await engine.store.records.add_records(scope, records, vectors)
        report.proposed += result.proposed
        report.accepted += len(result.accepted)
        for rej in result.rejected:
            report.rejected[rej.reason.value] += 1
            examples = report.examples.setdefault(rej.reason.value, [])
            if len(examples) < 3 and 0 <= rej.index < len(group):
                examples.append(f"{group[rej.index].fact} <- {group[rej.index].evidence}")
        if on_progress:
            on_progress(len(group))
    return report
