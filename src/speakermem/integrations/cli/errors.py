"""Turn known failures into one readable line and exit code 2 (no traceback)."""

from __future__ import annotations

import json

from speakermem.integrations.embeddings.minilm import EmbedderUnavailable
from speakermem.memory.datasets import DatasetError
from speakermem.memory.engine import DriverUnavailable, StoreError, UnknownChannel


class CliError(Exception):
    """A user-facing error: the message says what went wrong and what to do."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
    DatasetError,
    UnknownChannel,
    StoreError,
    DriverUnavailable,
    EmbedderUnavailable,
    json.JSONDecodeError,
    ValueError,
)


def describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename}: no such file"
    return text
