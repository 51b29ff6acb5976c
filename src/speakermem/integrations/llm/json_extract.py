"""Pull one JSON object out of whatever a chat model actually wrote.

Small and local models wrap JSON in code fences, prepend "Sure! Here is...", append
explanations, or get cut off by `max_tokens`. Even with server-side structured output some
servers (or `structured_mode="none"`) leave that to us. This module is pure and never raises:
it returns the first complete top-level JSON object, or a short error code that callers count.
Schema validation is not its job; callers validate the dict with pydantic.

Error codes: "empty", "no_json", "invalid_json", "truncated", "not_object".
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}
# What may follow an opening bracket (after whitespace) for it to plausibly start JSON; this
# keeps prose such as "{name}" or "[see below]" from being mistaken for a truncated object.
_OBJ_NEXT = frozenset("\"'}")
_LIST_NEXT = frozenset("{[]\"'-0123456789tfn")


def extract_json(
    text: str | None, finish_reason: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Return (object, None) for the first complete JSON object in `text`, else (None, code).

    A complete object is returned even when `finish_reason == "length"` (a model that closed
    its object and then rambled into the token limit still gave a usable answer); when no
    complete object exists and the output was cut off, or an object is left unclosed, the code
    is "truncated". A top-level array is "not_object": callers ask for objects only.
    """
    if text is None:
        return None, "empty"
    text = text.lstrip("\ufeff")
    if not text.strip():
        return None, "empty"

    # Prefer what sits inside a ```json fence, then fall back to the whole text.
    candidates = [m.group(1) for m in _FENCE.finditer(text)]
    candidates.append(text)
    best_error: str | None = None
    for chunk in candidates:
        obj, error = _scan(chunk)
        if obj is not None:
            return obj, None
        if best_error is None or _RANK[error] > _RANK[best_error]:
            best_error = error
    assert best_error is not None
    if finish_reason == "length" and best_error not in ("truncated", "not_object"):
        return None, "truncated"
    return None, best_error


# When fenced and unfenced scans disagree, report the most informative failure.
_RANK = {"no_json": 0, "invalid_json": 1, "not_object": 2, "truncated": 3}


def _scan(text: str) -> tuple[dict[str, Any] | None, str]:
    """Walk candidate openings left to right; return the first object that parses."""
    saw_invalid = saw_list = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch not in _OPENERS or not _plausible_start(text, i):
            i += 1
            continue
        end = _match(text, i)
        if end is None:
            # Everything after an unclosed opener belongs to it: nested fragments are not
            # answers, so stop here rather than return an inner object.
            return None, "truncated"
        value = _loads(text[i : end + 1])
        if isinstance(value, dict):
            return value, ""
        if isinstance(value, list):
            saw_list = True
        else:
            saw_invalid = True
        i = end + 1
    if saw_list:
        return None, "not_object"
    if saw_invalid:
        return None, "invalid_json"
    return None, "no_json"


def _plausible_start(text: str, i: int) -> bool:
    allowed = _OBJ_NEXT if text[i] == "{" else _LIST_NEXT
    j = i + 1
    while j < len(text) and text[j].isspace():
        j += 1
    return j == len(text) or text[j] in allowed


def _match(text: str, start: int) -> int | None:
    """Index of the bracket closing the one at `start`, honouring strings and escapes.

    Returns None if the text ends first (truncated). A mismatched closer ends the candidate
    there so that the parse fails as invalid rather than swallowing the rest of the text.
    """
    stack = [_OPENERS[text[start]]]
    in_string = escaped = False
    quote = ""
    for j in range(start + 1, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                in_string = False
            continue
        if c == '"' or (c == "'" and stack[-1] == "}" and _prev_nonspace(text, j) in "{,:"):
            in_string, quote = True, c
        elif c in _OPENERS:
            stack.append(_OPENERS[c])
        elif c in "}]":
            if c != stack.pop():
                return j
            if not stack:
                return j
    return None


def _prev_nonspace(text: str, j: int) -> str:
    k = j - 1
    while k >= 0 and text[k].isspace():
        k -= 1
    return text[k] if k >= 0 else ""


def _loads(fragment: str) -> Any:
    """json.loads, then once more without trailing commas (a common small-model slip)."""
    try:
        return json.loads(fragment)
    except ValueError:
        pass
    repaired = _strip_trailing_commas(fragment)
    if repaired != fragment:
        try:
            return json.loads(repaired)
        except ValueError:
            pass
    return None


def _strip_trailing_commas(fragment: str) -> str:
    out: list[str] = []
    in_string = escaped = False
    for c in fragment:
        if in_string:
            out.append(c)
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c in "}]":
            k = len(out) - 1
            while k >= 0 and out[k].isspace():
                k -= 1
            if k >= 0 and out[k] == ",":
                del out[k]
        out.append(c)
    return "".join(out)
