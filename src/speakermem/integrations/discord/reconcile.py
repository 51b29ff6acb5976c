"""Discord history as reconciliation reads it (`bot.reconcile.HistoryCheck`).

``GET /channels/{id}/messages?before=`` answers the `page_size` messages just before a
snowflake, newest first, so a span is read from its top down: each page vouches for every
message from its oldest one up to the span's top, and a short page (or one reaching below
the span) for the rest of it. A thread's replies come the same way from the thread's own
channel id. Payloads go through the gateway's translator, so texts compare like for like;
``edited_timestamp`` is the edit mark.

A 404 with code 10003 (Unknown Channel) means the channel or thread was deleted; a 403
(Missing Access) is not a deletion and stops the channel with an error. discord.py waits
out 429s by itself, per route; `Budget.read` cuts such a wait off when the run's budget
for the channel is spent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import discord

from speakermem.bot.events import Scope
from speakermem.bot.reconcile import Budget, Gone, PlatformMessage, Seen
from speakermem.integrations.discord import translate as tr
from speakermem.integrations.discord.history import DISCORD_EPOCH_MS, ChannelReader
from speakermem.integrations.payload import PayloadError, parse_iso

__all__ = ["DiscordHistoryCheck"]

UNKNOWN_CHANNEL = 10003


def snowflake_after(ts: float) -> int:
    """The smallest snowflake after every message of `ts`'s millisecond (for ``before=``)."""
    return max(0, (int(ts * 1000) + 1 - DISCORD_EPOCH_MS) << 22)


def snowflake_time(message_id: str) -> float | None:
    try:
        return ((int(message_id) >> 22) + DISCORD_EPOCH_MS) / 1000
    except ValueError:
        return None


def _when(value: Any) -> float | None:
    """An ISO timestamp as stored message times are (`parse_iso`), None if absent or bad."""
    try:
        return parse_iso(value, "discord history").timestamp() if value is not None else None
    except PayloadError:
        return None


class DiscordHistoryCheck(ChannelReader):
    """Reconciliation: a span of a channel (or thread) as Discord holds it now."""

    async def channel(
        self, scope: Scope, low: float, high: float, budget: Budget
    ) -> AsyncIterator[Seen]:
        async for seen in self._pages(scope, scope.channel, low, high, budget):
            yield seen

    async def thread(
        self, scope: Scope, thread_id: str, low: float, high: float, budget: Budget
    ) -> Seen:
        present: dict[str, PlatformMessage] = {}
        async for seen in self._pages(scope, thread_id, low, high, budget):
            present.update(seen.messages)
        return Seen(low=low, high=high, messages=present)

    async def _pages(
        self, scope: Scope, channel_id: str, low: float, high: float, budget: Budget
    ) -> AsyncIterator[Seen]:
        before = snowflake_after(high)
        top = high
        parents = self.parents(scope.workspace)
        while True:
            try:
                raw = await budget.read(
                    self.client.http.logs_from(int(channel_id), self.page_size, before=before)
                )
            except discord.NotFound as exc:
                if exc.code == UNKNOWN_CHANNEL:
                    raise Gone(f"discord channel {channel_id} not found") from exc
                raise
            present: dict[str, PlatformMessage] = {}
            times: list[float] = []
            for d in raw:
                at = _when(d.get("timestamp")) or snowflake_time(str(d.get("id", "")))
                if at is not None:
                    times.append(at)
                try:
                    event = tr.message_create(
                        {**d, "guild_id": scope.workspace}, channel_parent=parents
                    )
                except PayloadError:
                    self.skipped += 1
                    continue
                if event is not None:
                    edited = _when(d.get("edited_timestamp"))
                    present[event.message_id] = PlatformMessage(text=event.text, edited_at=edited)
            oldest = min(times) if times else low
            last = len(raw) < self.page_size or oldest <= low
            yield Seen(low=low if last else oldest, high=top, messages=present)
            if last:
                return
            top = oldest
            before = min(int(d["id"]) for d in raw)
