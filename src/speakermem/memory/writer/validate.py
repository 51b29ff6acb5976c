"""Deterministic validation of Writer output: every rejected action gets exactly one reason.

The LLM proposes, this module verifies (structure, roster, scope, entries, refs, duplicates,
budget, evidence) and resolves what survives into the coordinates the commit needs. Invalid
actions are dropped with a reason code; valid ones in the same batch still commit. Pure: the
caller supplies the roster, heads, refs and gate; nothing here touches the store or a model.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from speakermem.memory import attribution
from speakermem.memory.models import (
    GROUP,
    LAYER_SCOPE,
    DerivedRecord,
    Layer,
    NewRecord,
    RecordScope,
    RecordState,
    RosterMember,
    Scope,
    StoredMessage,
)
from speakermem.memory.search.cjk import words_and_runs
from speakermem.memory.writer.gate import EvidenceGate, GateScore, date_terms
from speakermem.memory.writer.prompt import (
    WRITER_PROMPT_VERSION,
    AddAction,
    UpdateAction,
    WriterAction,
)


class RejectReason(StrEnum):
    INVALID_JSON = "invalid_json"
    SCHEMA_VIOLATION = "schema_violation"
    UNKNOWN_ACTION = "unknown_action"
    UNKNOWN_LAYER = "unknown_layer"
    SCOPE_MISMATCH = "scope_mismatch"
    UNKNOWN_SOURCE = "unknown_source"
    UNKNOWN_OWNER = "unknown_owner"
    UNKNOWN_ENTRY = "unknown_entry"
    ENTRY_NOT_ACTIVE = "entry_not_active"
    ENTRY_OTHER_CHANNEL = "entry_other_channel"
    MISSING_REFS = "missing_refs"
    UNKNOWN_REF = "unknown_ref"
    DUPLICATE_IN_BATCH = "duplicate_in_batch"
    DUPLICATE_OF_HEAD = "duplicate_of_head"
    TOO_MANY_ACTIONS = "too_many_actions"
    UNGROUNDED = "ungrounded"
    EMPTY_CONTENT = "empty_content"
    SOURCE_NOT_CITED = attribution.SOURCE_NOT_CITED
    SELF_REPORT_NOT_CITED = attribution.SELF_REPORT_NOT_CITED
    GROUP_ONE_SPEAKER = attribution.GROUP_ONE_SPEAKER
    ENTRY_NOT_SHOWN = "entry_not_shown"
    """An UPDATE of a record the Writer was not shown in that prompt (a guessed id)."""


BATCH_INDEX = -1
"""Rejection index used when the whole output is rejected (invalid JSON, no action list)."""

DenseSim = Callable[[str, Sequence[StoredMessage]], float | None]


def channel_key(scope: Scope) -> str:
    """The channel key used in `ValidationContext.all_records_channel` ('platform/ws/channel')."""
    return str(scope)


def normalize_content(text: str) -> str:
    """Comparison key for content: lowercase alphanumeric tokens and CJK runs joined by
    single spaces."""
    return " ".join(words_and_runs(text))


def build_name_index(roster: Sequence[RosterMember]) -> dict[str, str]:
    """Lowercase display name / alias -> user id, keeping only names that resolve uniquely."""
    seen: dict[str, set[str]] = {}
    for m in roster:
        for name in (m.display_name, *m.aliases):
            key = name.strip().lower()
            if key:
                seen.setdefault(key, set()).add(m.user_id)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


@dataclass
class ValidationContext:
    """Everything validation needs about the channel's state at the time of the Writer call.

    heads: ALL active records of this channel by id (an UPDATE of one the prompt did not
    show is told apart from an unknown id by `shown`). all_records_channel: record id ->
    `channel_key` of every record the caller knows (any state, any channel), to tell
    superseded / foreign entries from unknown ones. ref_map: local ref ("m1") -> message
    of THIS segment.
    names: lowercase display name/alias -> roster id (see `build_name_index`).
    dense_sim: optional (content, cited messages) -> cosine, precomputed by the caller.
    shown: ids of the records the prompt showed; an UPDATE may target only those (None:
    the caller names its targets itself, as a replayed script does).
    """

    roster_ids: set[str]
    heads: dict[int, DerivedRecord]
    all_records_channel: dict[int, str]
    ref_map: dict[str, StoredMessage]
    scope: Scope
    budget: int
    gate: EvidenceGate = field(default_factory=EvidenceGate)
    names: dict[str, str] = field(default_factory=dict)
    dense_sim: DenseSim | None = None
    shown: frozenset[int] | None = None


@dataclass(frozen=True)
class AcceptedAction:
    """A verified action with resolved coordinates; the commit fills chain links and ids."""

    index: int
    kind: Literal["ADD", "UPDATE"]
    layer: Layer
    record_scope: RecordScope
    source: str
    owner: str
    content: str
    event: str
    cited: tuple[StoredMessage, ...]
    """Supporting messages, oldest first, never empty."""
    target: DerivedRecord | None = None
    """The record an UPDATE supersedes (None for ADD)."""
    gate: GateScore | None = None

    @property
    def from_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.message_id for m in self.cited))

    @property
    def latest(self) -> StoredMessage:
        return self.cited[-1]

    @property
    def time(self) -> datetime:
        """Record time: the latest cited message."""
        return self.latest.ts

    @property
    def session_id(self) -> int:
        return self.latest.session_id

    def to_new_record(
        self, *, writer_model: str, prompt_version: str = WRITER_PROMPT_VERSION
    ) -> NewRecord:
        """The commit-ready record; `supersedes` is the UPDATE target's id."""
        return NewRecord(
            layer=self.layer,
            record_scope=self.record_scope,
            content=self.content,
            source=self.source,
            owner=self.owner,
            event=self.event,
            time=self.time,
            session_id=self.session_id,
            from_ids=self.from_ids,
            supersedes=self.target.id if self.target is not None else None,
            writer_model=writer_model,
            prompt_version=prompt_version,
        )


@dataclass(frozen=True)
class Rejection:
    index: int
    reason: RejectReason
    detail: str = ""


@dataclass
class ValidationReport:
    accepted: list[AcceptedAction] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    proposed: int = 0
    """Number of items in the output (NOOPs included)."""
    noops: int = 0

    @property
    def json_valid(self) -> bool:
        return not any(r.reason == RejectReason.INVALID_JSON for r in self.rejected)

    def reason_counts(self) -> dict[str, int]:
        """Rejections per reason code, for logs and metrics."""
        return dict(Counter(r.reason.value for r in self.rejected))


# ---------------------------------------------------------------- parsing

_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def parse_writer_output(text: str | None) -> tuple[Any, str | None]:
    """Parse an LLM reply defensively: plain JSON, fenced JSON, or the outermost {...} / [...].

    Returns (parsed, None) or (None, error detail). Used where the endpoint cannot enforce
    the JSON schema.
    """
    if not text or not text.strip():
        return None, "empty output"
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE_RE.findall(text)]
    for open_c, close_c in (("{", "}"), ("[", "]")):
        start, end = text.find(open_c), text.rfind(close_c)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    error = "no JSON value found"
    for cand in candidates:
        try:
            return json.loads(cand), None
        except json.JSONDecodeError as exc:
            error = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return None, error


def proposed_contents(raw: Any) -> list[str]:
    """Contents of the proposed ADD/UPDATE items, so a caller can embed them for `dense_sim`."""
    items = _items(raw)
    if items is None:
        return []
    out = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("content"), str):
            out.append(item["content"].strip())
    return out


# ---------------------------------------------------------------- validation

_ACTION_ADAPTER: TypeAdapter[Any] = TypeAdapter(WriterAction)
_KNOWN_ACTIONS = ("ADD", "UPDATE", "NOOP")


def _items(raw: Any) -> list[Any] | None:
    if isinstance(raw, list):
        return raw
    if isinstance(raw, dict):
        if "actions" in raw:
            return raw["actions"] if isinstance(raw["actions"], list) else None
        if "type" in raw:  # a lone action object
            return [raw]
    return None


def _kind(item: Any) -> str | None:
    if isinstance(item, dict) and isinstance(item.get("type"), str):
        return item["type"].strip().upper()
    return None


def _prepare(item: dict[str, Any]) -> dict[str, Any]:
    """Forgive cosmetic deviations (case, a comma-separated ref string) before the model."""
    out = dict(item)
    out["type"] = str(out["type"]).strip().upper()
    if isinstance(out.get("layer"), str):
        out["layer"] = out["layer"].strip().lower()
    if isinstance(out.get("refs"), str):
        out["refs"] = [r for r in re.split(r"[,\s]+", out["refs"]) if r]
    if out["type"] == "UPDATE" and isinstance(out.get("entry_id"), str):
        digits = out["entry_id"].strip().lstrip("#")
        if digits.isdigit():
            out["entry_id"] = int(digits)
    return out


def _schema_detail(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"][1:] or err["loc"])
    return f"{loc}: {err['msg']}"[:200]


def _resolve_person(value: str, ctx: ValidationContext) -> str | None:
    """Roster id, "GROUP", or a display name/alias that resolves uniquely; else None."""
    v = value.strip()
    if v in ctx.roster_ids:
        return v
    if v.upper() == GROUP:
        return GROUP
    low = v.lower().lstrip("@")
    if low in ctx.names and ctx.names[low] in ctx.roster_ids:
        return ctx.names[low]
    # "Alice (U123)" or "<@U123>" forms copied from the prompt or a mention.
    m = re.fullmatch(r".*\(([^()]+)\)\s*|<@!?([^<>]+)>", v)
    if m:
        uid = (m.group(1) or m.group(2) or "").strip()
        if uid in ctx.roster_ids:
            return uid
    return None


def _resolve_refs(
    refs: list[str], ctx: ValidationContext, by_message_id: dict[str, StoredMessage]
) -> tuple[list[StoredMessage], str | None]:
    """Resolve local refs (or raw message ids of this segment); returns (messages, bad ref)."""
    lowered = {k.lower(): v for k, v in ctx.ref_map.items()}
    out: dict[int, StoredMessage] = {}
    for ref in refs:
        r = ref.strip().strip("[]()#").strip()
        msg = ctx.ref_map.get(r) or lowered.get(r.lower()) or by_message_id.get(r)
        if msg is None:
            return [], ref
        out[msg.pk] = msg
    return sorted(out.values(), key=lambda m: (m.ts, m.pk)), None


def _same_channel(key: str, scope: Scope) -> bool:
    return key in (channel_key(scope), scope.channel)


def _gate_context(
    cited: Sequence[StoredMessage],
    ctx: ValidationContext,
    id_names: dict[str, list[str]],
) -> tuple[list[str], list[str]]:
    """Speaker names of the cited messages and metadata terms that support a record.

    The record's own source and owner names are no evidence: a record naming Alice is not
    supported by Alice's name, only by what the cited messages (and their speakers) say."""
    speakers: list[str] = []
    context: list[str] = []
    segment = {m.message_id: m for m in ctx.ref_map.values()}
    for m in cited:
        speakers.append(m.speaker_name)
        speakers.extend(id_names.get(m.speaker_id, []))
        for uid in m.addressees:
            context.extend(id_names.get(uid, [uid]))
        if m.reply_to and m.reply_to in segment:
            context.append(segment[m.reply_to].speaker_name)
        context.extend(date_terms(m.ts))
    return speakers, context


def validate_actions(
    raw: Any, ctx: ValidationContext, *, parse_error: str | None = None
) -> ValidationReport:
    """Validate parsed Writer output against the channel state; one reason per rejection."""
    report = ValidationReport()
    if parse_error is not None or raw is None:
        detail = parse_error or "no output"
        report.rejected.append(Rejection(BATCH_INDEX, RejectReason.INVALID_JSON, detail))
        return report
    items = _items(raw)
    if items is None:
        report.rejected.append(
            Rejection(BATCH_INDEX, RejectReason.SCHEMA_VIOLATION, "expected {'actions': [...]}")
        )
        return report

    report.proposed = len(items)
    by_message_id = {m.message_id: m for m in ctx.ref_map.values()}
    id_names: dict[str, list[str]] = {}
    for name, uid in ctx.names.items():
        id_names.setdefault(uid, []).append(name)
    seen_keys: set[tuple[Any, ...]] = set()
    updated_entries: set[int] = set()
    counted = 0

    def reject(i: int, reason: RejectReason, detail: str = "") -> None:
        report.rejected.append(Rejection(i, reason, detail))

    for i, item in enumerate(items):
        kind = _kind(item)
        if kind == "NOOP":
            report.noops += 1
            continue
        counted += 1
        if counted > ctx.budget:
            reject(i, RejectReason.TOO_MANY_ACTIONS, f"budget is {ctx.budget}")
            continue
        if kind is None:
            reject(i, RejectReason.SCHEMA_VIOLATION, "item is not an object with a 'type'")
            continue
        if kind not in _KNOWN_ACTIONS:
            reject(i, RejectReason.UNKNOWN_ACTION, f"type {item['type']!r}")
            continue
        prepared = _prepare(item)
        layer_raw = prepared.get("layer")
        if kind == "ADD" and isinstance(layer_raw, str) and layer_raw not in set(Layer):
            reject(i, RejectReason.UNKNOWN_LAYER, f"layer {layer_raw!r}")
            continue
        try:
            action = _ACTION_ADAPTER.validate_python(prepared)
        except ValidationError as exc:
            reject(i, RejectReason.SCHEMA_VIOLATION, _schema_detail(exc))
            continue
        content = " ".join(action.content.split())
        if not normalize_content(content):
            reject(i, RejectReason.EMPTY_CONTENT)
            continue

        target: DerivedRecord | None = None
        if isinstance(action, AddAction):
            layer = action.layer
            record_scope = LAYER_SCOPE[layer]
            source = _resolve_person(action.source, ctx)
            if source is None:
                reject(i, RejectReason.UNKNOWN_SOURCE, f"source {action.source!r}")
                continue
            owner = _resolve_person(action.owner, ctx)
            if owner is None:
                reject(i, RejectReason.UNKNOWN_OWNER, f"owner {action.owner!r}")
                continue
            if (record_scope == RecordScope.GROUP) != (owner == GROUP):
                reject(
                    i,
                    RejectReason.SCOPE_MISMATCH,
                    f"{layer.value} is {record_scope.value}-scoped; owner {owner!r}",
                )
                continue
            event = " ".join(action.event.split())
        else:
            assert isinstance(action, UpdateAction)
            eid = action.entry_id
            target = ctx.heads.get(eid)
            if target is None or target.state != RecordState.ACTIVE:
                where = ctx.all_records_channel.get(eid)
                if where is not None and not _same_channel(where, ctx.scope):
                    reject(i, RejectReason.ENTRY_OTHER_CHANNEL, f"entry {eid}")
                elif target is not None or where is not None:
                    reject(i, RejectReason.ENTRY_NOT_ACTIVE, f"entry {eid}")
                else:
                    reject(i, RejectReason.UNKNOWN_ENTRY, f"entry {eid}")
                continue
            if target.scope.key() != ctx.scope.key():
                reject(i, RejectReason.ENTRY_OTHER_CHANNEL, f"entry {eid}")
                continue
            if ctx.shown is not None and eid not in ctx.shown:
                reject(i, RejectReason.ENTRY_NOT_SHOWN, f"entry {eid}")
                continue
            layer, record_scope = target.layer, target.record_scope
            source, owner, event = target.source, target.owner, target.event

        if not action.refs:
            reject(i, RejectReason.MISSING_REFS)
            continue
        cited, bad = _resolve_refs(action.refs, ctx, by_message_id)
        if bad is not None:
            reject(i, RejectReason.UNKNOWN_REF, f"ref {bad!r}")
            continue
        refusal = attribution.attribution_refusal(
            source=source, owner=owner, speakers=[m.speaker_id for m in cited]
        )
        if refusal is not None:
            who = ", ".join(sorted({m.speaker_id for m in cited}))
            reject(i, RejectReason(refusal), f"source {source!r}; cited speakers: {who}")
            continue

        norm = normalize_content(content)
        if target is None:
            key: tuple[Any, ...] = ("ADD", owner, source, layer.value, norm)
            if key in seen_keys:
                reject(i, RejectReason.DUPLICATE_IN_BATCH)
                continue
            dup = next(
                (
                    h.id
                    for h in ctx.heads.values()
                    if h.owner == owner
                    and h.layer == layer
                    and h.state == RecordState.ACTIVE
                    and normalize_content(h.content) == norm
                ),
                None,
            )
            if dup is not None:
                reject(i, RejectReason.DUPLICATE_OF_HEAD, f"same as entry {dup}")
                continue
        else:
            key = ("UPDATE", target.id, norm)
            if key in seen_keys or target.id in updated_entries:
                reject(i, RejectReason.DUPLICATE_IN_BATCH, f"entry {target.id} already updated")
                continue
            if normalize_content(target.content) == norm:
                reject(i, RejectReason.DUPLICATE_OF_HEAD, f"same as entry {target.id}")
                continue

        speakers, context = _gate_context(cited, ctx, id_names)
        if target is not None:
            # An UPDATE restates its grounded predecessor; only the new part needs new evidence.
            context.append(target.content)
        dense = ctx.dense_sim(content, cited) if ctx.dense_sim is not None else None
        score = ctx.gate.score(
            content,
            [m.text for m in cited],
            speakers,
            dense_sim=dense,
            context_terms=context,
        )
        if not score.passed:
            missing = ", ".join(score.unsupported[:8])
            reject(
                i, RejectReason.UNGROUNDED, f"lexical={score.lexical:.2f}; unsupported: {missing}"
            )
            continue

        seen_keys.add(key)
        if target is not None:
            updated_entries.add(target.id)
        report.accepted.append(
            AcceptedAction(
                index=i,
                kind="ADD" if target is None else "UPDATE",
                layer=layer,
                record_scope=record_scope,
                source=source,
                owner=owner,
                content=content,
                event=event,
                cited=tuple(cited),
                target=target,
                gate=score,
            )
        )
    return report
