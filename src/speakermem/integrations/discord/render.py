"""RecallAnswer → a Discord embed (as a plain dict), within Discord's embed limits.

Pure so the limits and the link rewriting are unit-testable without a client; the
adapter turns the dict into ``discord.Embed.from_dict``. The answer text quotes what
people wrote, so everything except the citation markers is escaped: a message
containing ``[click](https://…)`` must not become a masked link in the bot's reply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from speakermem.memory.query.answer import Citation, RecallAnswer

__all__ = [
    "DESCRIPTION_LIMIT",
    "FIELD_LIMIT",
    "FIELD_NAME_LIMIT",
    "FIELD_VALUE_LIMIT",
    "TITLE_LIMIT",
    "TOTAL_LIMIT",
    "citation_url",
    "escape_markdown",
    "jump_url",
    "render_embed",
]

# https://discord.com/developers/docs/resources/message#embed-object-embed-limits
TITLE_LIMIT = 256
DESCRIPTION_LIMIT = 4096
FIELD_LIMIT = 25
FIELD_NAME_LIMIT = 256
FIELD_VALUE_LIMIT = 1024
FOOTER_LIMIT = 2048
TOTAL_LIMIT = 6000
"""Sum of title, description, field names and values, footer text and author name."""

COLOR_ANSWER = 0x5865F2
COLOR_REFUSED = 0xED4245

_MARKER = re.compile(r"\[(\d{1,4})\]")
_ESCAPE = re.compile(r"([\\\[\]*_~`|])")
_ELLIPSIS = "…"


def jump_url(guild_id: str, channel_id: str, message_id: str) -> str:
    """Discord's message link; for a thread message `channel_id` is the thread."""
    return f"https://discord.com/channels/{guild_id}/{channel_id}/{message_id}"


def escape_markdown(text: str) -> str:
    """Backslash the characters that make links, emphasis, code and spoilers."""
    return _ESCAPE.sub(r"\\\1", text)


def citation_url(c: Citation, links: Mapping[int, str] | None = None) -> str | None:
    """The adapter's link, else the pipeline's, else one derived from a Discord scope."""
    if links and links.get(c.n):
        return links[c.n]
    if c.link:
        return c.link
    if c.scope.platform == "discord":
        return jump_url(c.scope.workspace, c.scope.channel, c.message_id)
    return None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + _ELLIPSIS


def _description(text: str, urls: Mapping[int, str], limit: int) -> str:
    """Escape the text, link the [n] markers, and cut only between pieces or inside plain text."""
    pieces: list[tuple[bool, str]] = []
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            pieces.append((False, escape_markdown(text[pos : m.start()])))
        n = int(m.group(1))
        url = urls.get(n)
        pieces.append((True, f"[[{n}]]({url})") if url else (False, f"\\[{n}\\]"))
        pos = m.end()
    if pos < len(text):
        pieces.append((False, escape_markdown(text[pos:])))
    out: list[str] = []
    used = 0
    for is_link, piece in pieces:
        if used + len(piece) <= limit:
            out.append(piece)
            used += len(piece)
            continue
        room = limit - used - len(_ELLIPSIS)
        if not is_link and room > 0:
            cut = piece[:room]
            if (len(cut) - len(cut.rstrip("\\"))) % 2:
                cut = cut[:-1]  # never leave a dangling escape
            out.append(cut)
        out.append(_ELLIPSIS)
        break
    return "".join(out).strip() or "(no answer)"


def _source_line(c: Citation, url: str | None, channel_names: Mapping[str, str]) -> str:
    name = channel_names.get(c.scope.channel)
    where = f" · #{escape_markdown(name)}" if name else ""
    label = f"[[{c.n}]]({url})" if url else f"\\[{c.n}\\]"
    speaker = escape_markdown(_clip(c.speaker, 80))
    return f"{label} {speaker}{where} · {c.time:%Y-%m-%d %H:%M} UTC"


SEARCHED = "Searched (the channels you can read)"
_SNOWFLAKE = re.compile(r"^\d{1,20}$")


def searched_value(channels: Sequence[str]) -> str:
    """A direct answer's channels as channel mentions (ids only: each reader's Discord shows
    the names), within one field's limit."""
    ids = [c for c in dict.fromkeys(channels) if _SNOWFLAKE.match(c)]
    out: list[str] = []
    for n, c in enumerate(ids):
        more = f" and {len(ids) - n} more"
        if len(", ".join([*out, f"<#{c}>"])) + len(more) > FIELD_VALUE_LIMIT:
            return ", ".join(out) + more
        out.append(f"<#{c}>")
    return ", ".join(out) or "-"


def render_embed(
    answer: RecallAnswer,
    links: Mapping[int, str] | None = None,
    *,
    question: str | None = None,
    channel_names: Mapping[str, str] | None = None,
    searched: Sequence[str] = (),
) -> dict[str, object]:
    """The embed for a /recall reply: linked answer text plus a 'Sources' list.

    `links` maps citation numbers to URLs (default: each citation's own link, else its
    Discord jump URL); `channel_names` maps channel ids to names for the source list.
    Every Discord limit holds for any input: description ≤ 4096, ≤ 25 fields, field
    values ≤ 1024, total ≤ 6000 characters.
    """
    names = channel_names or {}
    urls = {c.n: u for c in answer.citations if (u := citation_url(c, links))}
    embed: dict[str, object] = {
        "type": "rich",
        "color": COLOR_REFUSED if answer.refused else COLOR_ANSWER,
    }
    budget = TOTAL_LIMIT
    if question and question.strip():
        title = _clip(" ".join(question.split()), TITLE_LIMIT)
        embed["title"] = title
        budget -= len(title)
    footer = None
    if not answer.refused:
        footer = answer.notice() or (
            "Answered by the language model from the cited messages."
            if answer.used_llm
            else "Extractive answer: quoted from the cited messages."
        )
        embed["footer"] = {"text": footer}
        budget -= len(footer)
    where: dict[str, object] | None = None
    if searched and not answer.refused:
        where = {"name": SEARCHED, "value": searched_value(searched), "inline": False}
        budget -= len(SEARCHED) + len(str(where["value"]))
    # Keep room for at least one sources field when there are citations.
    reserve = (
        min(FIELD_VALUE_LIMIT + 32, 64 * len(answer.citations) + 32) if answer.citations else 0
    )
    description = _description(answer.text, urls, min(DESCRIPTION_LIMIT, budget - reserve))
    embed["description"] = description
    budget -= len(description)

    fields: list[dict[str, object]] = []
    lines = [
        _clip(_source_line(c, urls.get(c.n), names), FIELD_VALUE_LIMIT) for c in answer.citations
    ]
    current: list[str] = []
    shown = 0

    def flush() -> None:
        nonlocal budget
        if current:
            name = "Sources" if not fields else "Sources (cont.)"
            value = "\n".join(current)
            fields.append({"name": name, "value": value, "inline": False})
            budget -= len(name) + len(value)
            current.clear()

    for line in lines:
        candidate = [*current, line]
        if len("\n".join(candidate)) > FIELD_VALUE_LIMIT:
            flush()
            candidate = [line]
        name = "Sources" if not fields else "Sources (cont.)"
        full = len(fields) >= FIELD_LIMIT - (where is not None)
        if full or len(name) + len("\n".join(candidate)) > budget:
            break
        current[:] = candidate
        shown += 1
    flush()
    hidden = len(lines) - shown
    if hidden and fields:
        more = f"\n… and {hidden} more"
        last = fields[-1]
        value = str(last["value"])
        if len(value) + len(more) <= FIELD_VALUE_LIMIT and len(more) <= budget:
            last["value"] = value + more
    if where is not None:
        fields.insert(0, where)
    if fields:
        embed["fields"] = fields
    return embed
