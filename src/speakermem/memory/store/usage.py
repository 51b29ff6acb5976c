"""What the Writer's LLM calls cost, from its run log (`writer_runs`) and its segments.

Portable SQL (SQLite and PostgreSQL alike): totals over the whole run log, per run and per
1,000 messages written, for `status`, the metrics and `speakermem writer` reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from speakermem.memory.config import WriterConfig
from speakermem.memory.store.protocol import Store


@dataclass(frozen=True)
class WriterUsage:
    runs: int
    """Writer runs that got an answer from the LLM (a deferred call costs nothing)."""
    messages: int
    """Messages in the segments the Writer has written."""
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def tokens_per_run(self) -> float:
        return self.tokens / self.runs if self.runs else 0.0

    @property
    def tokens_per_1k_messages(self) -> float:
        return self.tokens * 1000.0 / self.messages if self.messages else 0.0

    def cost_usd(self, prompt_per_mtok: float, completion_per_mtok: float) -> float:
        return (
            self.prompt_tokens * prompt_per_mtok + self.completion_tokens * completion_per_mtok
        ) / 1e6

    def report(self, prompt_per_mtok: float, completion_per_mtok: float) -> dict[str, Any]:
        """The figures `status` shows (JSON-ready)."""
        cost = self.cost_usd(prompt_per_mtok, completion_per_mtok)
        return {
            "runs": self.runs,
            "messages_written": self.messages,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens_per_run": round(self.tokens_per_run, 1),
            "tokens_per_1k_messages": round(self.tokens_per_1k_messages, 1),
            "cost_usd": round(cost, 6),
            "cost_per_1k_messages_usd": round(cost * 1000.0 / self.messages, 6)
            if self.messages
            else 0.0,
        }


_SCOPED = "(? IS NULL OR platform = ?) AND (? IS NULL OR workspace = ?)"
"""One workspace (or platform) when given, else all: `status` never shows another's usage."""


async def writer_usage(
    store: Store, platform: str | None = None, workspace: str | None = None
) -> WriterUsage:
    scoped = (platform, platform, workspace, workspace)
    runs = await store.db.read(
        "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)"
        f" FROM writer_runs WHERE prompt_tokens + completion_tokens > 0 AND {_SCOPED}",
        scoped,
    )
    written = await store.db.read(
        "SELECT coalesce(sum(n_messages), 0) FROM segments WHERE state = 'done'"
        f" AND channel_pk IN (SELECT id FROM channels WHERE {_SCOPED})",
        scoped,
    )
    r = runs[0]
    return WriterUsage(
        runs=int(r[0]),
        messages=int(written[0][0]),
        prompt_tokens=int(r[1]),
        completion_tokens=int(r[2]),
    )


async def _backlog(store: Store, platform: str | None, workspace: str | None) -> tuple[int, Any]:
    """(deferred pending segments, oldest pending opened_at) of the scope."""
    rows = await store.db.read(
        "SELECT coalesce(sum(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), 0), min(opened_at)"
        " FROM segments WHERE state = 'pending'"
        f" AND channel_pk IN (SELECT id FROM channels WHERE {_SCOPED})",
        (platform, platform, workspace, workspace),
    )
    return int(rows[0][0]), rows[0][1]


async def writer_status(
    store: Store, cfg: WriterConfig, platform: str | None = None, workspace: str | None = None
) -> dict[str, Any]:
    """The Writer's backlog (deferred segments, age of the oldest pending one) and its
    usage (tokens per run and per 1,000 messages, cost at the configured prices), for one
    workspace (or platform) when given, else the whole store."""
    deferred, oldest = await _backlog(store, platform, workspace)
    usage = await writer_usage(store, platform, workspace)
    return {
        "queue": {
            "deferred_segments": deferred,
            "oldest_pending_age_s": None if oldest is None else round(time.time() - oldest, 1),
        },
        "usage": usage.report(cfg.prompt_price_per_mtok, cfg.completion_price_per_mtok),
    }
