"""The words of a Slack message when ``text`` is not all of them, as pure functions over dicts.

Bot and integration posts (alerts, deploys, RSS, Jira) often carry their words only in
``blocks`` or legacy ``attachments`` and leave ``text`` empty or a one-line summary; file
shares carry only the file's name and title. The live feed and the export importer read
all three the same way:

- ``blocks`` stand in for ``text`` only when ``text`` is empty (Slack mirrors a person's
  message into a ``rich_text`` block, so reading both would say it twice);
- ``attachments`` (``pretext``, ``title``, ``text``, else ``fallback``) are added for bots
  and integrations, and for anyone's message that has no text of its own; a person's
  link previews are the linked page's words, not theirs, so they are left out;
- ``files`` (title, else name) name what was shared when nothing else gives text.

Interactive parts (buttons, menus, inputs) are not words anybody said and are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speakermem.integrations.payload import MAX_TEXT_CHARS

__all__ = ["attachments_text", "blocks_text", "compose_text", "files_text"]

_SKIPPED_BLOCKS = frozenset({"actions", "input", "divider", "file", "image", "video", "call"})
_MAX_DEPTH = 12
"""Block nesting we follow (rich_text → list → section → element is 4 deep)."""


def _inline(element: Mapping[str, Any]) -> str:
    kind = element.get("type")
    if kind in ("text", "mrkdwn", "plain_text"):
        text = element.get("text")
        return text if isinstance(text, str) else ""
    if kind == "link":
        text, url = element.get("text"), element.get("url")
        return text if isinstance(text, str) and text else url if isinstance(url, str) else ""
    if kind == "user" and isinstance(element.get("user_id"), str):
        return f"<@{element['user_id']}>"
    if kind == "channel" and isinstance(element.get("channel_id"), str):
        return f"<#{element['channel_id']}>"
    if kind == "emoji" and isinstance(element.get("name"), str):
        return f":{element['name']}:"
    return ""


def _block_lines(block: Any, depth: int, out: list[str]) -> None:
    if not isinstance(block, Mapping) or depth > _MAX_DEPTH:
        return
    kind = block.get("type")
    if kind in _SKIPPED_BLOCKS:
        return
    if kind in ("rich_text_section", "rich_text_preformatted", "rich_text_quote"):
        elements = block.get("elements")
        if isinstance(elements, list):
            line = "".join(_inline(e) for e in elements if isinstance(e, Mapping))
            if line.strip():
                out.append(line)
        return
    inline = _inline(block)
    if inline.strip():
        out.append(inline)
        return
    text = block.get("text")
    if isinstance(text, Mapping):
        _block_lines(text, depth + 1, out)
    for key in ("elements", "fields"):
        children = block.get(key)
        if isinstance(children, list):
            for child in children:
                _block_lines(child, depth + 1, out)


def blocks_text(blocks: Any) -> str:
    """The readable text of Block Kit ``blocks``, one line per section."""
    out: list[str] = []
    if isinstance(blocks, list):
        for block in blocks:
            _block_lines(block, 0, out)
    return "\n".join(out)


def attachments_text(attachments: Any) -> str:
    """Legacy attachments' pretext, title and text (their fallback when they have none)."""
    parts: list[str] = []
    if not isinstance(attachments, list):
        return ""
    for att in attachments:
        if not isinstance(att, Mapping):
            continue
        own = [
            att[key].strip()
            for key in ("pretext", "title", "text")
            if isinstance(att.get(key), str) and att[key].strip()
        ]
        if not own and isinstance(att.get("blocks"), list):
            own = [line for line in [blocks_text(att["blocks"]).strip()] if line]
        if not own and isinstance(att.get("fallback"), str) and att["fallback"].strip():
            own = [att["fallback"].strip()]
        parts.extend(own)
    return "\n".join(parts)


def files_text(files: Any) -> str:
    """``[shared file: title, …]`` for the files of a file share, '' without any."""
    names: list[str] = []
    if isinstance(files, list):
        for f in files:
            if not isinstance(f, Mapping):
                continue
            for key in ("title", "name"):
                value = f.get(key)
                if isinstance(value, str) and value.strip():
                    names.append(value.strip())
                    break
    return "[shared file: " + ", ".join(names) + "]" if names else ""


def compose_text(msg: Mapping[str, Any], text: str, *, from_app: bool) -> str:
    """`text` (the message's own) completed from blocks, attachments and files; see the
    module docstring for which apply when. Derived text is cut at the message size limit."""
    parts = [text] if text.strip() else []
    if not parts:
        from_blocks = blocks_text(msg.get("blocks")).strip()
        if from_blocks:
            parts.append(from_blocks)
    if from_app or not parts:
        extra = attachments_text(msg.get("attachments"))
        for line in extra.splitlines():
            if line.strip() and not any(line.strip() in p for p in parts):
                parts.append(line.strip())
    if not parts:
        shared = files_text(msg.get("files"))
        if shared:
            parts.append(shared)
    combined = "\n".join(parts)
    if combined == text or len(combined) <= MAX_TEXT_CHARS:
        return combined
    return combined[:MAX_TEXT_CHARS]
