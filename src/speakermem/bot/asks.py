"""Asking where people talk: a mention of the bot, a reply that mentions it, a direct
message to it, a message's context menu. Platform-neutral rules the adapters share.

Every one of them is a `/recall` underneath (`Dispatcher.recall`), with the same access
rule and the same answer; what differs is where the question came from (`Via`), which
thread it is about, and, for a direct message, that it draws on every channel the asker
can read. Each member gets `ask_per_minute` of these in any 60 seconds (the slash command
is not counted), so a mention loop or a flood of direct messages cannot tie up recall.

A direct message to the bot is never stored: it is a question, not group conversation.
The adapters do not hand direct messages to the dispatcher's event path at all, and the
translators drop them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

ASKS_PER_MINUTE = 6
"""Questions a member may ask by mention, reply, direct message or context menu per minute."""

Via = Literal["command", "mention", "reply", "dm", "context"]
"""How a question reached the bot: the slash command, a mention in a channel or thread, a
reply that mentions the bot, a direct message, or a message's context menu."""

RATE_LIMITED = (
    "You have asked me a lot in the last minute; please wait a moment and ask again "
    "(or use `/recall`)."
)
EMPTY_QUESTION = "Ask me something after the mention, e.g. “what did we decide?”"
NOTHING_READABLE = (
    "I found no channel you can read where I remember anything, so I have nothing to answer from."
)
CONTEXT_QUESTION = "What is the context of this message, and what was decided about it?"
"""The question the context menu asks about the chosen message (its text is appended)."""
MAX_CONTEXT_CHARS = 500
"""How much of the chosen message's text the context-menu question quotes."""


def question_text(text: str, bot_ids: Iterable[str]) -> str:
    """The question in a message that mentions the bot: its mentions of the bot removed
    (Slack ``<@U…>``/``<@U…|name>``, Discord ``<@id>``/``<@!id>``), whitespace collapsed."""
    for bot_id in {b for b in bot_ids if b}:
        text = re.sub(rf"<@!?{re.escape(bot_id)}(?:\|[^>]*)?>", " ", text)
    return " ".join(text.split())


def context_question(message_text: str) -> str:
    """The context menu's question about one message (its text quoted, cut)."""
    quoted = " ".join(message_text.split())[:MAX_CONTEXT_CHARS]
    return f"{CONTEXT_QUESTION} “{quoted}”" if quoted else CONTEXT_QUESTION


def reply_question(question: str, replied_text: str) -> str:
    """A reply's question about the message it replies to: the question with that message
    quoted (it is what "why?" or "who agreed?" is about); no question asks its context."""
    if not question.strip():
        return context_question(replied_text)
    quoted = " ".join(replied_text.split())[:MAX_CONTEXT_CHARS]
    return f"{question} (about: “{quoted}”)" if quoted else question
