"""Quoting untrusted text into prompts: chat text and names are data, never prompt structure.

Every string a chat member controls (message text, display names, aliases, channel names,
and record content derived from them) passes through here before it enters a Writer,
Project, Select or answer prompt. A prompt's structure is its lines and its tags, so:

- line separators of every kind (CR, LF, VT, FF, NEL U+0085, U+2028/2029, the file/group/
  record separators) end no line: a name becomes one line, message text keeps its line
  breaks only as indented continuation lines, which no prompt parses as a new item;
- invisible format characters (zero-width spaces and joiners, bidi controls, BOM) and other
  control characters are removed, so they cannot hide a tag or a fake line from a check;
- a tag-like sequence naming one of our delimiter tags is defanged, however it is spelled:
  spaces, full-width or other look-alike brackets and slashes, confusable letters and case
  ("＜／ｍｅｓｓａｇｅｓ＞", "</mеssages>" with a Cyrillic е) all become "[/messages]".

Pure; each prompt renderer calls `quote_line` or `quote_block` on what it quotes.
"""

from __future__ import annotations

import re
import unicodedata

STRUCTURAL_TAGS: frozenset[str] = frozenset(
    {
        "messages",
        "message",
        "question",
        "roster",
        "evidence",
        "excerpts",
        "memory",
        "records",
        "system",
        "user",
        "assistant",
        "instructions",
    }
)
"""Delimiter tags our prompts use (or a model may honour): never spelled by quoted text."""

_BREAKS = re.compile("\r\n|[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_LT = "<\uff1c\ufe64\u2039\u2329\u3008\u27e8\u1438\u02c2\u276e\u276c"
_GT = ">\uff1e\ufe65\u203a\u232a\u3009\u27e9\u1433\u02c3\u276f\u276d"
_SLASH = "/\uff0f\u2215\u2044\u29f8\u2571"
_TAG = re.compile(rf"[{_LT}]\s*([{_SLASH}]?)\s*([^\s{_LT}{_GT}]{{1,40}}?)\s*[{_GT}]")
_CONFUSABLES = str.maketrans(
    {
        "а": "a",
        "е": "e",
        "о": "o",
        "р": "p",
        "с": "c",
        "ѕ": "s",
        "і": "i",
        "ј": "j",
        "х": "x",
        "у": "y",
        "ԁ": "d",
        "ɡ": "g",
        "һ": "h",
        "ո": "n",
        "ѵ": "v",
        "ԝ": "w",
        "ο": "o",
        "α": "a",
        "ε": "e",
        "ι": "i",
        "κ": "k",
        "ν": "v",
        "τ": "t",
        "υ": "u",
        "ѡ": "w",
        "ӏ": "l",
    }
)


_ASCII_CONTROLS = {c: " " for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n"}
"""ASCII's control characters (Cc) but tab and newline; ASCII has no format character (Cf)."""


def _drop_invisible(text: str) -> str:
    """Remove format characters (Cf) and turn other control characters (but tab) to spaces.
    ASCII text, most chat text, takes one translate instead of a lookup per character (the
    Writer quotes every message of every segment)."""
    if text.isascii():
        return text.translate(_ASCII_CONTROLS)
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Cf":
            continue
        out.append(" " if cat == "Cc" and ch not in "\t\n" else ch)
    return "".join(out)


def _fold(name: str) -> str:
    """The letters of a tag name as a reader would see them (case, width, look-alikes)."""
    folded = unicodedata.normalize("NFKC", name).casefold().translate(_CONFUSABLES)
    return re.sub(r"[^a-z]", "", folded)


def _defang(text: str) -> str:
    def fix(m: re.Match[str]) -> str:
        name = _fold(m.group(2))
        if name not in STRUCTURAL_TAGS:
            return m.group(0)
        return f"[{'/' if m.group(1) else ''}{name}]"

    return _TAG.sub(fix, text)


def neutral(text: str) -> str:
    """Untrusted text with line breaks unified to '\\n', invisible and control characters
    removed and delimiter tags defanged (the step both quoting forms share)."""
    return _defang(_drop_invisible(_BREAKS.sub("\n", text)))


def quote_line(text: str, limit: int | None = None) -> str:
    """A name, alias, channel or short text as one line: every break becomes a space."""
    line = " ".join(neutral(text).split())
    if limit is not None and len(line) > limit:
        line = line[: max(0, limit - 1)] + "…"
    return line


def quote_block(text: str, indent: str = "    ") -> str:
    """Multi-line text under a line of our own: continuation lines are indented, so no
    line of the text can start a new item of the prompt."""
    return f"\n{indent}".join(neutral(text).strip().split("\n"))
