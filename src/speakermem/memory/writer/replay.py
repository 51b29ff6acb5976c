"""Replay writer: records written ahead of time, committed as Writer output without an LLM.

LoCoMo `observation` entries become PERSON ADDs (owner = source = the speaker, refs = their
dia_ids), so System 2 can be evaluated offline; a scripted set (the demo's) can also carry
GROUP records and UPDATE chains. Either way each action goes through the same validation
(including the evidence gate) and commit path as a real Writer's actions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from speakermem.memory.datasets.common import Observation
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Layer, Scope
from speakermem.memory.writer.runner import gate_from
from speakermem.memory.writer.validate import (
    ValidationContext,
    ValidationReport,
    build_name_index,
    validate_actions,
)

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


class ScriptedUpdate(BaseModel):
    """A later node of a scripted record's chain: what changed, and the messages saying so."""

    model_config = ConfigDict(frozen=True)

    content: str
    refs: list[str]


class ScriptedRecord(BaseModel):
    """A record written down ahead of time (a fixture's or a demo's), replayed as Writer
    output: an ADD, then one UPDATE per entry of `updates`, each checked like a real one."""

    model_config = ConfigDict(frozen=True)

    layer: Layer
    source: str
    owner: str
    content: str
    event: str = ""
    refs: list[str]
    updates: list[ScriptedUpdate] = Field(default_factory=list)


async def replay_actions(
    engine: MemoryEngine,
    scope: Scope,
    actions: Sequence[Mapping[str, object]],
    *,
    model: str,
    prompt_version: str,
) -> tuple[ValidationReport, list[int]]:
    """Validate Writer-shaped actions against the channel's state (roster, heads, the evidence
    gate) and commit the accepted ones; returns the validation and the new record ids."""
    ids = sorted({str(mid) for a in actions for mid in a.get("refs", ())})  # type: ignore[attr-defined]
    messages = await engine.store.messages.by_ids(scope, ids)
    roster = await engine.members(scope, include_left=True)
    pks = await engine.channel_pks([scope])
    heads = {h.id: h for h in await engine.store.records.heads(pks)}
    ctx = ValidationContext(
        roster_ids={m.user_id for m in roster},
        heads=heads,
        all_records_channel={},
        ref_map=dict(messages),
        scope=scope,
        budget=len(actions),
        gate=gate_from(engine.config.writer),
        names=build_name_index(roster),
    )
    result = validate_actions({"actions": list(actions)}, ctx)
    records = [
        a.to_new_record(writer_model=model, prompt_version=prompt_version) for a in result.accepted
    ]
    if not records:
        return result, []
    vectors = (
        await engine.embedder.embed([r.content for r in records])
        if engine.embedder is not None
        else None
    )
    return result, await engine.store.records.add_records(scope, records, vectors)


async def replay_script(
    engine: MemoryEngine,
    scope: Scope,
    script: Sequence[ScriptedRecord],
    *,
    model: str,
    prompt_version: str,
) -> ReplayReport:
    """Replay scripted records into a channel that holds none yet (so a second run, or a
    channel a real Writer already wrote, is left as it is)."""
    report = ReplayReport()
    if not script or await engine.store.records.heads(await engine.channel_pks([scope])):
        return report
    for item in script:
        add = {"type": "ADD", **item.model_dump(exclude={"updates"})}
        result, ids = await replay_actions(
            engine, scope, [add], model=model, prompt_version=prompt_version
        )
        _tally(report, result, [item.content])
        for update in item.updates:
            if not ids:
                break
            change = {"type": "UPDATE", "entry_id": ids[0], **update.model_dump()}
            result, ids = await replay_actions(
                engine, scope, [change], model=model, prompt_version=prompt_version
            )
            _tally(report, result, [update.content])
    return report


def _tally(report: ReplayReport, result: ValidationReport, what: Sequence[str]) -> None:
    report.proposed += result.proposed
    report.accepted += len(result.accepted)
    for rej in result.rejected:
        report.rejected[rej.reason.value] += 1
        examples = report.examples.setdefault(rej.reason.value, [])
        if len(examples) < 3 and 0 <= rej.index < len(what):
            examples.append(what[rej.index])


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
    for (scope, _session), group in groups.items():
        actions = [
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
        result, _ids = await replay_actions(
            engine, scope, actions, model=REPLAY_MODEL, prompt_version=REPLAY_PROMPT_VERSION
        )
        _tally(report, result, [f"{obs.fact} <- {obs.evidence}" for obs in group])
        if on_progress:
            on_progress(len(group))
    return report
