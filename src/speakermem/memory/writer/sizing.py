"""Fit a segment's Writer prompt into the endpoint's context (pure).

A segment closes at 25 messages whatever the model behind the Writer; its prompt (the
instructions, the roster, the current memory, the messages) may not fit a small context.
Sent anyway, it is refused, or, on Ollama's OpenAI route, cut without a word, and the model
answers a prompt that lost its instructions. So, when the whole prompt does not fit:
1. the roster narrows to the people in the segment (speakers and whom they address);
2. the current memory shown gets at most a third of what is left;
3. the messages split into consecutive parts that each fit, each part its own call with
   its own refs (m1, m2, ...); a message too long even alone is shortened in the prompt.
The parts' actions are validated per part and merged (`merge_reports`), so one commit still
writes the whole segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from speakermem.memory.config import WriterConfig
from speakermem.memory.context_budget import PromptBudget, chat_tokens
from speakermem.memory.models import DerivedRecord, RosterMember, StoredMessage
from speakermem.memory.writer.prompt import (
    SegmentLinks,
    action_budget,
    heads_tokens,
    message_line_tokens,
    render_writer_messages,
    select_heads,
)
from speakermem.memory.writer.validate import (
    AcceptedAction,
    Rejection,
    RejectReason,
    ValidationReport,
    normalize_content,
)

LINE_OVERHEAD_TOKENS = 24
"""A message line's ref, time, speaker id and marks, beyond its text (for shortening)."""
REF_SLACK_TOKENS = 1
"""A part renumbers its refs from m1, and a mark may point outside it: a token of slack."""
HEADS_SHARE = 3
"""When the prompt must shrink, the current memory gets at most 1/HEADS_SHARE of the room."""
MIN_MESSAGE_TOKENS = 32
"""A message is never shortened below this many tokens of text."""
MIN_ROOM_TOKENS = 200
"""Below this much room beside the instructions, splitting cannot help: the prompt goes
whole, and the server's refusal or cut says the context is too small."""


@dataclass
class PromptPart:
    """One Writer call: its chat, its refs, the messages it covers, its action budget."""

    chat: list[dict[str, str]]
    refs: dict[str, str]
    messages: list[StoredMessage]
    budget: int
    tokens: int
    """Estimated prompt tokens."""
    shortened: int = 0
    """Messages whose text was cut to fit."""
    shown: frozenset[int] = frozenset()
    """Ids of the records the prompt shows as current memory: the only ones an UPDATE of
    this call may target."""


@dataclass
class SizingNotes:
    """What fitting did, for the run log."""

    parts: int = 1
    roster_narrowed: bool = False
    heads_cut: bool = False
    shortened: int = 0
    notes: list[str] = field(default_factory=list)


def _part(
    roster: Sequence[RosterMember],
    heads: Sequence[DerivedRecord],
    shown: Sequence[StoredMessage],
    originals: Sequence[StoredMessage],
    links: SegmentLinks | None,
    cfg: WriterConfig,
) -> PromptPart:
    budget = action_budget(len(shown), per_message=cfg.budget_per_message, cap=cfg.budget_cap)
    chat, refs = render_writer_messages(
        list(roster), list(heads), list(shown), budget=budget, links=links
    )
    shortened = sum(1 for a, b in zip(shown, originals, strict=True) if a.text != b.text)
    return PromptPart(
        chat,
        refs,
        list(originals),
        budget,
        chat_tokens(chat),
        shortened,
        frozenset(h.id for h in heads),
    )


def narrow_roster(
    roster: Sequence[RosterMember],
    messages: Sequence[StoredMessage],
    links: SegmentLinks | None,
) -> list[RosterMember]:
    """The members the segment involves: its speakers and whom they address."""
    wanted = {m.speaker_id for m in messages}
    for m in messages:
        wanted.update(m.addressees)
        if links is not None:
            wanted.update(a for a, _ in links.addressees.get(m.pk, []))
    return [m for m in roster if m.user_id in wanted]


def _shorten(msg: StoredMessage, tokens: int) -> StoredMessage:
    keep = max(MIN_MESSAGE_TOKENS, tokens) * 4
    if len(msg.text) <= keep:
        return msg
    return msg.model_copy(update={"text": msg.text[: keep - 1].rstrip() + "…"})


def _split(
    messages: Sequence[StoredMessage], costs: Sequence[int], room: int
) -> list[list[StoredMessage]]:
    """Consecutive runs of messages whose lines fit `room` tokens (at least one each)."""
    runs: list[list[StoredMessage]] = []
    current: list[StoredMessage] = []
    used = 0
    for msg, cost in zip(messages, costs, strict=True):
        if current and used + cost > room:
            runs.append(current)
            current, used = [], 0
        current.append(msg)
        used += cost
    if current:
        runs.append(current)
    return runs


def plan_prompts(
    roster: Sequence[RosterMember],
    heads: Sequence[DerivedRecord],
    messages: Sequence[StoredMessage],
    *,
    links: SegmentLinks | None,
    budget: PromptBudget,
    cfg: WriterConfig,
) -> tuple[list[PromptPart], SizingNotes]:
    """The Writer calls for one segment: one when its prompt fits, else several that do."""
    notes = SizingNotes()
    speakers = {m.speaker_id for m in messages}
    text = " ".join(m.text for m in messages)
    shown = select_heads(heads, speakers, text, token_budget=cfg.heads_token_budget)
    whole = _part(roster, shown, messages, messages, links, cfg)
    if budget.fits(whole.tokens):
        return [whole], notes
    assert budget.input_tokens is not None
    narrow = narrow_roster(roster, messages, links)
    notes.roster_narrowed = len(narrow) < len(roster)
    fixed = chat_tokens(render_writer_messages(narrow, [], [], budget=1)[0])
    room = max(0, budget.input_tokens - fixed)
    if room < MIN_ROOM_TOKENS:  # the instructions alone fill the context: no split helps
        notes.notes.append(f"the context leaves {room} tokens beside the instructions")
        return [whole], notes
    pool = heads_tokens(select_heads(heads, speakers, text, token_budget=1 << 30))
    heads_room = min(cfg.heads_token_budget, room // HEADS_SHARE, pool)
    notes.heads_cut = heads_room < min(cfg.heads_token_budget, pool)
    message_room = max(MIN_MESSAGE_TOKENS + LINE_OVERHEAD_TOKENS, room - heads_room)
    parts: list[PromptPart] = []
    costs = [c + REF_SLACK_TOKENS for c in message_line_tokens(narrow, messages, links)]
    runs = _split(messages, costs, message_room)
    while runs:
        run = runs.pop(0)
        shown_run = [_shorten(m, message_room - LINE_OVERHEAD_TOKENS) for m in run]
        run_heads = select_heads(
            heads,
            {m.speaker_id for m in run},
            " ".join(m.text for m in run),
            token_budget=heads_room,
        )
        part = _part(narrow, run_heads, shown_run, run, links, cfg)
        if len(run) > 1 and not budget.fits(part.tokens):  # the estimate was short: halve
            half = len(run) // 2
            runs[:0] = [run[:half], run[half:]]
            continue
        parts.append(part)
    notes.parts = len(parts)
    notes.shortened = sum(p.shortened for p in parts)
    if notes.parts > 1:
        notes.notes.append(f"split into {notes.parts} calls to fit the context")
    if notes.shortened:
        notes.notes.append(f"shortened {notes.shortened} long message(s)")
    return parts, notes


def merge_reports(reports: Sequence[ValidationReport]) -> ValidationReport:
    """One report for a segment written in parts: what a later part repeats (the same ADD,
    a second UPDATE of one entry) is a duplicate in the batch, as within one output."""
    merged = ValidationReport()
    seen: set[tuple[object, ...]] = set()
    updated: set[int] = set()
    offset = 0
    for report in reports:
        merged.proposed += report.proposed
        merged.noops += report.noops
        for rej in report.rejected:
            index = rej.index if rej.index < 0 else rej.index + offset
            merged.rejected.append(Rejection(index, rej.reason, rej.detail))
        for act in report.accepted:
            key = _key(act)
            if key in seen or (act.target is not None and act.target.id in updated):
                merged.rejected.append(
                    Rejection(act.index + offset, RejectReason.DUPLICATE_IN_BATCH, "repeated")
                )
                continue
            seen.add(key)
            if act.target is not None:
                updated.add(act.target.id)
            merged.accepted.append(act)
        offset += report.proposed
    return merged


def _key(act: AcceptedAction) -> tuple[object, ...]:
    norm = normalize_content(act.content)
    if act.target is not None:
        return ("UPDATE", act.target.id, norm)
    return ("ADD", act.owner, act.source, act.layer.value, norm)
