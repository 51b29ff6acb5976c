"""Pure governance decisions: effective policy, retention cut-offs, chain repair, receipts.

Nothing here touches the store; `memory.store.governance` runs the SQL these decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, Field

from speakermem.memory.attribution import attribution_refusal
from speakermem.memory.models import DeleteEvent, EditEvent, MessageEvent, RosterEvent

DAY_S = 86_400.0


class Receipt(BaseModel):
    """What one governance action changed: rows per table (never the forgotten text)."""

    action: str
    target: str = ""
    counts: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    complete: bool = True
    """False while part of the work failed: the forget is recorded and resumed, and the
    receipt says so instead of claiming it is done."""

    def add(self, table: str, n: int) -> None:
        if n:
            self.counts[table] = self.counts.get(table, 0) + int(n)

    def merge(self, other: Receipt) -> None:
        for table, n in other.counts.items():
            self.add(table, n)
        self.notes.extend(n for n in other.notes if n not in self.notes)
        self.complete = self.complete and other.complete

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """One line for a chat reply: 'messages 3, records 1, ...' or 'nothing changed'."""
        done = (
            ", ".join(f"{table} {n}" for table, n in sorted(self.counts.items()))
            if self.counts
            else "nothing changed"
        )
        if not self.complete:
            done += " (INCOMPLETE: the rest is retried automatically; see the audit log)"
        return done


class Refusal(StrEnum):
    """Why the admission gate turned a message (or an edit's text) away."""

    BOT = "bot"
    CHANNEL_OFF = "channel_off"
    FORGOTTEN = "forgotten"
    """Its author was forgotten (a tombstone) and has not opted in since."""
    OPTED_OUT = "opted_out"


def admission(*, is_bot: bool, channel_on: bool, author: Refusal | None = None) -> Refusal | None:
    """The one admission decision every entry path shares: None admits the message.
    `author` is what the author's tombstone or opt-out says (None: nothing against them)."""
    if is_bot:
        return Refusal.BOT
    if not channel_on:
        return Refusal.CHANNEL_OFF
    return author


COMMIT_CITES_GONE = "commit_cites_forgotten"
COMMIT_PERSON = "commit_forgotten_person"
COMMIT_OPTED_OUT = "commit_opted_out_person"
COMMIT_NAMES = "commit_names_forgotten"
COMMIT_TARGET_GONE = "commit_target_withdrawn"
"""Reasons the commit-time check drops a Writer record (counted in the Writer run log);
an attribution rule's reason (memory/attribution.py) is counted as commit_<reason>."""
COMMIT_PREFIX = "commit_"


def commit_refusal(
    *,
    from_ids: Sequence[str],
    live: set[str],
    people: Iterable[Refusal | None],
    names_forgotten: bool,
    target_present: bool,
    source: str,
    owner: str,
    speakers: Iterable[str],
) -> str | None:
    """Whether a Writer record may still be committed, decided inside the commit: every
    message it cites is live, neither its owner nor its source was forgotten or opted out,
    its text names no forgotten person, the record it updates was not withdrawn meanwhile,
    and its source wrote what it cites (`speakers`: the cited messages' author ids, as
    stored; memory/attribution.py). None commits it; otherwise the reason it is dropped."""
    if any(mid not in live for mid in from_ids):
        return COMMIT_CITES_GONE
    refusals = set(people)
    if Refusal.FORGOTTEN in refusals:
        return COMMIT_PERSON
    if Refusal.OPTED_OUT in refusals:
        return COMMIT_OPTED_OUT
    if names_forgotten:
        return COMMIT_NAMES
    if not target_present:
        return COMMIT_TARGET_GONE
    refusal = attribution_refusal(source=source, owner=owner, speakers=speakers)
    return None if refusal is None else COMMIT_PREFIX + refusal


def channel_enabled(explicit: bool | None, default: bool) -> bool:
    """A channel's memory: what an admin set, else the default for new channels."""
    return default if explicit is None else explicit


def effective_retention(channel_days: int | None, workspace_days: int | None) -> int | None:
    """Days messages are kept: the channel's own limit overrides the workspace's."""
    return channel_days if channel_days is not None else workspace_days


def retention_cutoff(now: float, days: int) -> float:
    """Messages with ts strictly before this are past the limit."""
    return now - days * DAY_S


@dataclass(frozen=True)
class ChainLink:
    """The links a surviving chain node gets after a withdrawal."""

    id: int
    supersedes: int | None
    superseded_by: int | None
    active: bool
    chain_root: int


def relink_chain(node_ids: Iterable[int], withdrawn: set[int]) -> list[ChainLink]:
    """Survivors of a chain, oldest first, linked to each other; the newest is the head.

    Chains are append-only, so id order is version order. Withdrawing a head makes the
    newest surviving version the head; withdrawing a middle version links its neighbours.
    """
    survivors = sorted(i for i in set(node_ids) if i not in withdrawn)
    if not survivors:
        return []
    root = survivors[0]
    links = []
    for n, rid in enumerate(survivors):
        prev = survivors[n - 1] if n > 0 else None
        nxt = survivors[n + 1] if n + 1 < len(survivors) else None
        links.append(ChainLink(rid, prev, nxt, nxt is None, root))
    return links


def remaining_support(from_ids: Sequence[str], forgotten: set[str]) -> list[str]:
    """The cited message ids that are not forgotten, in citation order."""
    return [mid for mid in dict.fromkeys(from_ids) if mid not in forgotten]


def should_rederive(
    *,
    was_head: bool,
    remaining: Sequence[str],
    people: Iterable[str],
    forgotten_people: set[str],
) -> bool:
    """Re-derive a withdrawn record when it was current knowledge, other support remains and
    it is not about (or from) someone being forgotten."""
    return was_head and bool(remaining) and not (set(people) & forgotten_people)


def visible_records(sources: Mapping[int, set[int]], readable_channel_pks: set[int]) -> set[int]:
    """Records whose every cited message lies in a channel the asker may read.

    A record with no known source is not shown: access fails closed.
    """
    return {rid for rid, chans in sources.items() if chans and chans <= readable_channel_pks}


@dataclass(frozen=True)
class Forgotten:
    """What one forget covered, for copies outside the store (the bot's spill): a person
    (every message, edit and roster event of theirs), some messages of a channel, or a
    whole channel (a purge). Holds ids only."""

    platform: str
    workspace: str
    user_id: str | None = None
    channel: str | None = None
    message_ids: tuple[str, ...] = ()

    def covers(self, event: object) -> bool:
        """Whether an event carries words this forget removed (a delete carries none)."""
        scope = getattr(event, "scope", None)
        if scope is None or (scope.platform, scope.workspace) != (self.platform, self.workspace):
            return False
        if isinstance(event, DeleteEvent):
            return False
        if self.user_id is not None:
            author = (
                event.speaker_id
                if isinstance(event, MessageEvent)
                else event.author_id
                if isinstance(event, EditEvent)
                else event.user_id
                if isinstance(event, RosterEvent)
                else None
            )
            if author == self.user_id:
                return True
        if self.channel is None or scope.channel != self.channel:
            return False
        if isinstance(event, RosterEvent):
            return False
        if not self.message_ids:
            return True
        return getattr(event, "message_id", None) in self.message_ids
