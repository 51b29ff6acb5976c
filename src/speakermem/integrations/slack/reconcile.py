"""Slack history as reconciliation reads it (`bot.reconcile.HistoryCheck`).

``conversations.history`` with ``oldest``/``latest``, ``inclusive``, answers newest first and
pages backwards with a cursor: each page vouches for every top-level message from its oldest
``ts`` up to the span's top (the last page, down to the span's bottom). A thread's replies come
from ``conversations.replies`` over the same span. Payloads go through the live translator,
so a stored text and the platform's text compare like for like; a parent deleted while its
replies remain is a ``tombstone`` message, which counts as deleted.

Rate limits: a 429 is waited out for its ``Retry-After`` only while the run's budget allows
(`RateLimitedApi` sleeping through `Budget.sleep`); a wait past it stops the channel there,
newest part checked. Give it a client without the SDK's own rate-limit retry handler, or
that handler sleeps first (the budget still cuts it off, later).

``channel_not_found`` for the channel is confirmed with ``conversations.info`` before the
channel counts as deleted: what the bot can no longer see at all is gone for it too (a
private channel it was removed from); ``thread_not_found`` means the thread's parent and
replies are all gone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.bot.events import MessageEvent, Scope
from speakermem.bot.reconcile import Budget, Gone, PlatformMessage, Seen
from speakermem.integrations.slack.roster_sync import RateLimitedApi
from speakermem.integrations.slack.translate import PLATFORM, PayloadError, translate_event

__all__ = ["SlackHistoryCheck"]

PAGE = 200


def _fmt(ts: float) -> str:
    return f"{ts:.6f}"


def _float_ts(value: Any) -> float | None:
    try:
        return float(Decimal(str(value))) if value is not None else None
    except InvalidOperation:
        return None


def _error(exc: SlackApiError) -> str:
    response = exc.response
    data = getattr(response, "data", None)
    if isinstance(data, Mapping):
        return str(data.get("error") or "")
    return ""


class SlackHistoryCheck:
    platform = PLATFORM

    def __init__(
        self, client: AsyncWebClient, *, page_size: int = PAGE, max_retries: int = 5
    ) -> None:
        self.client = client
        self.page_size = page_size
        self.max_retries = max_retries
        self.skipped = 0

    def _api(self, budget: Budget) -> RateLimitedApi:
        return RateLimitedApi(self.client, max_retries=self.max_retries, sleep=budget.sleep)

    def _present(self, scope: Scope, msgs: list[Any], *, skip: str | None = None) -> dict:
        """Platform messages by id, as the translator would store them."""
        out: dict[str, PlatformMessage] = {}
        for msg in msgs:
            if not isinstance(msg, dict) or msg.get("ts") == skip:
                continue
            if msg.get("subtype") == "tombstone":
                continue  # a deleted parent that keeps its replies
            try:
                event = translate_event(
                    {**msg, "type": "message", "channel": scope.channel}, team_id=scope.workspace
                )
            except PayloadError:
                self.skipped += 1
                continue
            if not isinstance(event, MessageEvent):
                continue
            edited = msg.get("edited")
            at = _float_ts(edited.get("ts")) if isinstance(edited, Mapping) else None
            out[event.message_id] = PlatformMessage(text=event.text, edited_at=at)
        return out

    async def channel(
        self, scope: Scope, low: float, high: float, budget: Budget
    ) -> AsyncIterator[Seen]:
        api = self._api(budget)
        cursor: str | None = None
        top = high
        while True:
            try:
                page = await budget.read(
                    api.call(
                        "conversations.history",
                        channel=scope.channel,
                        oldest=_fmt(low),
                        latest=_fmt(high),
                        inclusive=True,
                        limit=self.page_size,
                        cursor=cursor,
                    )
                )
            except SlackApiError as exc:
                if _error(exc) == "channel_not_found" and await self._missing(api, budget, scope):
                    raise Gone(f"slack channel {scope.channel} not found") from exc
                raise
            msgs = [m for m in page.get("messages") or [] if isinstance(m, dict)]
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not page.get("has_more", True):
                cursor = None
            times = [t for t in (_float_ts(m.get("ts")) for m in msgs) if t is not None]
            bottom = min(times) if cursor and times else low
            yield Seen(low=bottom, high=top, messages=self._present(scope, msgs))
            if cursor is None:
                return
            top = bottom

    async def _missing(self, api: RateLimitedApi, budget: Budget, scope: Scope) -> bool:
        try:
            await budget.read(api.call("conversations.info", channel=scope.channel))
        except SlackApiError as exc:
            return _error(exc) == "channel_not_found"
        return False

    async def thread(
        self, scope: Scope, thread_id: str, low: float, high: float, budget: Budget
    ) -> Seen:
        api = self._api(budget)
        cursor: str | None = None
        present: dict[str, PlatformMessage] = {}
        while True:
            try:
                page = await budget.read(
                    api.call(
                        "conversations.replies",
                        channel=scope.channel,
                        ts=thread_id,
                        oldest=_fmt(low),
                        latest=_fmt(high),
                        inclusive=True,
                        limit=self.page_size,
                        cursor=cursor,
                    )
                )
            except SlackApiError as exc:
                if _error(exc) == "thread_not_found":
                    raise Gone(f"slack thread {thread_id} not found") from exc
                raise
            msgs = [m for m in page.get("messages") or [] if isinstance(m, dict)]
            present.update(self._present(scope, msgs, skip=thread_id))
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor or not page.get("has_more", True):
                return Seen(low=low, high=high, messages=present)
