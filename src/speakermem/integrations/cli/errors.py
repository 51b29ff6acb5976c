"""Turn known failures into one readable line and exit code 2 (no traceback)."""

from __future__ import annotations

import json


class CliError(Exception):
    """A user-facing error: the message says what went wrong and what to do."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The failures shown as one line. Their classes are imported here, when a command has
    failed, not when the CLI starts: they live in the store, the embedder and the datasets."""
    from speakermem.integrations.embeddings.model_package import EmbedderUnavailable
    from speakermem.memory.datasets import DatasetError
    from speakermem.memory.engine import DriverUnavailable, StoreError, UnknownChannel

    return (
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
