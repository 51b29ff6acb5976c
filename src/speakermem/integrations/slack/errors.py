"""The Slack adapter's configuration error, and errors as short log lines.

Slack payloads carry people's words and errors can quote them, so a logged error is its
type and a bounded message, never the payload.
"""

from __future__ import annotations

from pydantic import SecretStr

__all__ = ["SlackConfigError", "brief", "required_secret"]


class SlackConfigError(ValueError):
    """A setting the chosen Slack mode needs is missing."""


def required_secret(value: SecretStr | None, env: str) -> str:
    """The secret's value, or a `SlackConfigError` naming the variable to set."""
    raw = value.get_secret_value() if value is not None else ""
    if not raw:
        raise SlackConfigError(f"{env} is not set")
    return raw


def brief(exc: BaseException) -> str:
    """An error for the log: its type and a bounded message (payload errors name fields)."""
    text = str(exc).replace("\n", " ")
    return f"{type(exc).__name__}: {text[:160]}"
