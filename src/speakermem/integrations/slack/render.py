"""RecallAnswer → Slack Block Kit, as pure functions (unit-tested without Slack).

Recalled text is chat written by other people: it is escaped (``&``, ``<``, ``>``) so a
quoted ``<!channel>`` or ``<@U…>`` cannot ping anyone or forge a link, and the only
``<…>`` tokens in the output are the citation links this module writes. Sizes follow
Slack's limits: 3,000 characters per section/context text, 10 elements per context
block, 50 blocks per message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from speakermem.bot.governance import ConfirmPrompt
from speakermem.memory.query.answer import Citation, RecallAnswer

__all__ = [
    "CANCEL_ACTION",
    "CONFIRM_ACTION",
    "MAX_BLOCKS",
    "MAX_CONTEXT_ELEMENTS",
    "MAX_TEXT",
    "escape",
    "fallback_text",
    "render_blocks",
    "reply_blocks",
    "searched_line",
]

MAX_TEXT = 3000
"""Characters in one section or context-element text object."""
MAX_BLOCKS = 50
MAX_CONTEXT_ELEMENTS = 10
MAX_FALLBACK = 3000
"""The top-level ``text`` (notifications, screen readers); Slack allows more, nobody reads it."""

_CITE = re.compile(r"\[(\d+)\]")


def escape(text: str) -> str:
    """Slack mrkdwn control characters; nothing else needs escaping."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link_label(url: str, label: str) -> str:
    # A URL can hold '|' or '>' only percent-encoded inside <url|label>.
    safe = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
    return f"<{safe}|{label}>"


def _linked(text: str, links: dict[int, str]) -> str:
    """Escape `text`, then turn each [n] that has a link into <link|[n]>."""

    def sub(match: re.Match[str]) -> str:
        url = links.get(int(match.group(1)))
        return _link_label(url, match.group(0)) if url else match.group(0)

    return _CITE.sub(sub, escape(text))


def _cut_point(text: str, limit: int) -> int:
    """Where to split `text` (len > limit): a newline, else a space, never inside <…>."""
    cut = text.rfind("\n", 0, limit)
    if cut <= 0:
        cut = text.rfind(" ", 0, limit)
    if cut <= 0:
        cut = limit
    opened = text.rfind("<", 0, cut)
    if opened >= 0 and text.find(">", opened) >= cut:
        # splitting here would break a link token: cut before it, or after it if it leads
        cut = opened if opened > 0 else text.find(">", opened) + 1
    return cut


def _chunks(text: str, limit: int = MAX_TEXT) -> list[str]:
    out: list[str] = []
    while len(text) > limit:
        cut = _cut_point(text, limit)
        if cut <= 0 or cut > limit:
            cut = limit  # a single token longer than the limit: hard split
        head, text = text[:cut].rstrip(), text[cut:].lstrip("\n ")
        if head:
            out.append(head)
    if text.strip():
        out.append(text)
    return out


def _citation_line(c: Citation, link: str | None) -> str:
    speaker = escape(c.speaker or "?")[:200]
    when = c.time.strftime("%Y-%m-%d")
    target = _link_label(link, "message") if link else "message"
    return f"[{c.n}] {speaker} · {when} · {target}"


_CHANNEL_ID = re.compile(r"^[A-Z0-9]{2,32}$")
MAX_SEARCHED = 40
"""Channels a direct answer names one by one; more are counted."""


def searched_line(channels: Sequence[str]) -> str:
    """The channels a direct answer drew on, as Slack channel links: ids only, so each
    reader's Slack shows the name (and only of a channel they can see)."""
    ids = [c for c in dict.fromkeys(channels) if _CHANNEL_ID.match(c)]
    shown = ", ".join(f"<#{c}>" for c in ids[:MAX_SEARCHED])
    more = f" and {len(ids) - MAX_SEARCHED} more" if len(ids) > MAX_SEARCHED else ""
    return f"Searched the channels you can read: {shown}{more}."


def render_blocks(
    answer: RecallAnswer, links: dict[int, str], *, searched: Sequence[str] = ()
) -> list[dict]:
    """Sections with the answer (each [n] linked) and context blocks listing the citations;
    `searched` (a direct message's answer) names the channels it drew on.

    An extractive answer gets a context line under the answer saying so (and why, when the
    language model is configured but did not answer)."""
    body = _linked(answer.text, links) if answer.text.strip() else "_(no answer)_"
    blocks: list[dict] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": chunk}} for chunk in _chunks(body)
    ]
    if answer.refused:
        return blocks[:MAX_BLOCKS]
    if searched:
        blocks = blocks[: MAX_BLOCKS - 4]
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": searched_line(searched)}]}
        )
    notice = answer.notice()
    if notice:  # right under the answer, so no truncation of the sources can drop it
        blocks = blocks[: MAX_BLOCKS - 3]
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"_{escape(notice)}_"}]}
        )

    cited = sorted(answer.citations, key=lambda c: c.n)
    elements = [
        {"type": "mrkdwn", "text": _citation_line(c, links.get(c.n) or c.link)[:MAX_TEXT]}
        for c in cited
    ]
    contexts = [
        {"type": "context", "elements": elements[i : i + MAX_CONTEXT_ELEMENTS]}
        for i in range(0, len(elements), MAX_CONTEXT_ELEMENTS)
    ]
    if contexts:
        blocks.append({"type": "divider"})
    blocks.extend(contexts)
    if len(blocks) > MAX_BLOCKS:
        blocks = blocks[: MAX_BLOCKS - 1]
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": "_(answer truncated to fit Slack)_"}],
            }
        )
    return blocks


def fallback_text(answer: RecallAnswer) -> str:
    """Top-level text for notifications; escaped too, since Slack parses it as mrkdwn."""
    text = answer.text.strip() or "(no answer)"
    if len(text) > MAX_FALLBACK:
        text = text[: MAX_FALLBACK - 1] + "…"
    return escape(text)


# --- /memory replies ------------------------------------------------------------------------

CONFIRM_ACTION = "speakermem_confirm"
CANCEL_ACTION = "speakermem_cancel"
"""``action_id``s of the Confirm/Cancel buttons; the button's ``value`` is the token."""
MAX_BUTTON_TEXT = 75


def reply_blocks(
    text: str, *, confirm: ConfirmPrompt | None = None, data: Mapping[str, Any] | None = None
) -> list[dict]:
    """A `/memory` reply: escaped text, JSON data inline when it fits (else a pointer to
    the CLI), and Confirm/Cancel buttons for a destructive action."""
    body = escape(text.strip() or "(nothing to say)")
    if confirm is not None and confirm.summary not in text:
        body += "\n" + escape(confirm.summary)
    blocks: list[dict] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": chunk}} for chunk in _chunks(body)
    ]
    if data is not None:
        raw = json.dumps(data, ensure_ascii=False, indent=1, default=str)
        fenced = "```" + escape(raw) + "```"
        if len(fenced) <= MAX_TEXT:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": fenced}})
        else:
            note = (
                f"_The JSON is {len(raw):,} characters, too long for a Slack message: run "
                "`speakermem export user` on the bot's machine for the full file._"
            )
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]})
    blocks = blocks[: MAX_BLOCKS - 1]
    if confirm is not None:
        blocks.append(
            {
                "type": "actions",
                "block_id": "speakermem_confirm",
                "elements": [
                    {
                        "type": "button",
                        "action_id": CONFIRM_ACTION,
                        "style": "danger",
                        "value": confirm.token,
                        "text": {
                            "type": "plain_text",
                            "text": confirm.confirm_label[:MAX_BUTTON_TEXT],
                        },
                    },
                    {
                        "type": "button",
                        "action_id": CANCEL_ACTION,
                        "value": confirm.token,
                        "text": {
                            "type": "plain_text",
                            "text": confirm.cancel_label[:MAX_BUTTON_TEXT],
                        },
                    },
                ],
            }
        )
    return blocks
