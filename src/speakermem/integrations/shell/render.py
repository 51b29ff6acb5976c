"""Plain-text rendering for the terminal: answers with numbered citations, command replies.

Pure functions over the platform-neutral answer models; the adapter looks up the cited
messages' text and passes it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from speakermem.memory.models import RosterMember
from speakermem.memory.query.answer import Citation, RecallAnswer

QUOTE_CHARS = 160


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTE_CHARS else flat[: QUOTE_CHARS - 1] + "…"


def citation_line(c: Citation, text: str | None) -> str:
    """`[2] Bob · #general · Tue 2025-03-04 10:12 · id g031` and the quoted message."""
    head = (
        f"[{c.n}] {c.speaker} · #{c.scope.channel} · {c.time:%a %Y-%m-%d %H:%M} · id {c.message_id}"
    )
    if text is None:
        return head + "\n      (message no longer stored)"
    return f"{head}\n      “{_quote(text)}”"


def render_answer(answer: RecallAnswer, texts: Mapping[tuple[str, str], str]) -> str:
    """The reply, then one numbered line per citation (texts keyed by (channel, message id)),
    then, for an extractive answer, the line saying so (and why)."""
    lines = [answer.text.strip()]
    if answer.citations:
        lines.append("")
        for c in answer.citations:
            line = citation_line(c, texts.get((c.scope.channel, c.message_id)))
            # an extractive answer already quotes each excerpt: keep only the heads
            lines.append(line if answer.used_llm else line.split("\n")[0])
    notice = answer.notice()
    if notice:
        lines.extend(["", f"({notice})"])
    return "\n".join(lines)


def render_roster(channel: str, private: bool, members: Sequence[RosterMember]) -> str:
    kind = "private" if private else "public"
    if not members:
        return f"#{channel} ({kind}) has no members yet: post or /join to become one."
    names = ", ".join(
        m.display_name + (f" (aka {', '.join(m.aliases)})" if m.aliases else "") for m in members
    )
    return f"#{channel} ({kind}): {names}"


def prompt(speaker: str, channel: str) -> str:
    return f"{speaker} in #{channel}> "
