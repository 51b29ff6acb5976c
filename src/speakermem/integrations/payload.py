"""Shared checks for raw platform payloads.

Adapters and importers see JSON from outside the process. These helpers turn a
bad field into one exception type, `PayloadError`, with a message naming the
field, so the dispatcher can log and drop a payload without guessing what broke.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from speakermem.memory.models import MAX_TEXT_CHARS

__all__ = [
    "MAX_TEXT_CHARS",
    "PayloadError",
    "build",
    "check_text",
    "opt_str",
    "parse_iso",
    "req_dict",
    "req_str",
]

T = TypeVar("T")


class PayloadError(ValueError):
    """A platform payload is malformed: a field is missing, of the wrong type or out of range."""


def req_dict(d: Any, key: str, where: str) -> dict[str, Any]:
    """The dict at `d[key]`; PayloadError when `d` is not a dict or the value is missing/not one."""
    if not isinstance(d, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(d).__name__}")
    value = d.get(key)
    if not isinstance(value, Mapping):
        raise PayloadError(f"{where}: field {key!r} must be an object, got {type(value).__name__}")
    return dict(value)


def req_str(d: Mapping[str, Any], key: str, where: str) -> str:
    """A required non-empty string (ids, timestamps)."""
    value = d.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        # Snowflakes occasionally arrive as numbers from hand-written or old payloads.
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise PayloadError(
            f"{where}: field {key!r} must be a non-empty string, got {type(value).__name__}"
        )
    return value


def opt_str(d: Mapping[str, Any], key: str, where: str) -> str | None:
    """An optional string: None when absent or null, PayloadError when of another type."""
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise PayloadError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def check_text(value: Any, where: str) -> str:
    """Message text: a string of at most MAX_TEXT_CHARS characters that encodes as UTF-8."""
    if not isinstance(value, str):
        raise PayloadError(f"{where}: text must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise PayloadError(
            f"{where}: text is {len(value)} characters; the limit is {MAX_TEXT_CHARS}"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(f"{where}: text is not valid UTF-8 ({exc.reason})") from exc
    return value


def parse_iso(value: Any, where: str) -> datetime:
    """An ISO 8601 timestamp as aware UTC (naive values are taken as UTC)."""
    if not isinstance(value, str):
        raise PayloadError(f"{where}: timestamp must be a string, got {type(value).__name__}")
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        ts = datetime.fromisoformat(text)
    except ValueError as exc:
        raise PayloadError(f"{where}: bad ISO 8601 timestamp {value!r}") from exc
    if ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC)


def build(factory: Callable[..., T], where: str, **fields: Any) -> T:
    """Construct a model, turning pydantic's ValidationError into PayloadError."""
    try:
        return factory(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise PayloadError(f"{where}: {loc}: {first.get('msg')}") from exc
