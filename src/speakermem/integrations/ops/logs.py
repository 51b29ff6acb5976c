"""Structured logs: one JSON object per line when SPEAKERMEM_LOG_FORMAT=json.

Fields: ts (ISO 8601, UTC), level, logger, msg, plus exc (the formatted traceback) when
there is one and any `extra=` fields a call passes. Tokens never reach the log: nothing
here adds request data, and secrets are SecretStr in the settings.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record is emitted, so a stream swapped
    after configuration (redirection, a test's capture) never leaves a closed file behind."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(level: str, fmt: Literal["text", "json"] = "text") -> None:
    """Root logging to stderr, as text or JSON lines. Replaces only our own handler, so
    handlers others installed (a test runner's capture) stay."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, StderrHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
