"""Pure governance decisions: effective policy, retention cut-offs, chain repair, receipts.

Nothing here touches the store; `memory.store.governance` runs the SQL these decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

DAY_S = 86_400.0


class Receipt(BaseModel):
    """What one governance action changed: rows per table (never the forgotten text)."""

    action: str
    target: str = ""
    counts: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def add(self, table: str, n: int) -> None:
        if n:
            self.counts[table] = self.counts.get(table, 0) + int(n)

    def merge(self, other: Receipt) -> None:
        for table, n in other.counts.items():
            self.add(table, n)
        self.notes.extend(n for n in other.notes if n not in self.notes)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """One line for a chat reply: 'messages 3, records 1, ...' or 'nothing changed'."""
        if not self.counts:
            return "nothing changed"
        return ", ".join(f"{table} {n}" for table, n in sorted(self.counts.items()))


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
