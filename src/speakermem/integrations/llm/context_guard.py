"""Signs in a server's answer that a prompt did not fit, or that it wants us to wait (pure).

- Silent truncation: the server reports far fewer prompt tokens than we sent. Ollama cuts
  an over-long prompt to its context and reports the cut length as `prompt_eval_count`
  (runner: `numPromptInputs` is taken after "truncating input prompt"), which its OpenAI
  route returns as `usage.prompt_tokens`.
- Refusal: HTTP 400 with a message about the context. vLLM: "This model's maximum context
  length is N tokens. However, you requested ..."; llama.cpp: "the request exceeds the
  available context size" (`n_ctx` in the error); newer Ollama: "the prompt is longer than
  the context length ..."; OpenAI: code `context_length_exceeded`.
- Retry-After: delta-seconds or an HTTP date (RFC 9110 §10.2.3); OpenAI also sends
  `retry-after-ms`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

TRUNCATION_RATIO = 0.75
"""Reported prompt tokens below this share of our estimate mean the server cut the prompt.
Real tokenizers count chat at 3 to 4.5 characters a token, so a whole prompt reports about
our 4-a-token estimate or more (ids, times and the chat template add tokens); caching does
not lower the count on the servers here (Ollama counts cached tokens too)."""
ROUND_CUT_RATIO = 0.95
"""A shortfall this small still means a cut when the count is a multiple of CUT_MULTIPLE:
Ollama cuts a prompt to exactly its context (runner: inputs[:numKeep] + the last
numCtx - numKeep), and contexts are round numbers."""
CUT_MULTIPLE = 256
TRUNCATION_MIN_GAP = 64
"""...and at least this many tokens missing (tiny prompts vary more than they are cut)."""

_CONTEXT_PHRASES = (
    "maximum context length",
    "context length",
    "context size",
    "context window",
    "context_length_exceeded",
    "exceed_context_size",
    "too many tokens",
    "prompt is too long",
)
_NUMBER_AFTER = re.compile(
    r"(?:maximum context length is|context length of|n_ctx\W+|context size(?: is)?\W+)"
    r"\s*(\d{3,7})",
    re.IGNORECASE,
)


def looks_truncated(sent_tokens: int, reported_tokens: int) -> bool:
    """Whether the server read far fewer prompt tokens than were sent (0 = not reported)."""
    if reported_tokens <= 0 or sent_tokens - reported_tokens < TRUNCATION_MIN_GAP:
        return False
    if reported_tokens < sent_tokens * TRUNCATION_RATIO:
        return True
    return reported_tokens < sent_tokens * ROUND_CUT_RATIO and reported_tokens % CUT_MULTIPLE == 0


def _texts(body: Any) -> list[str]:
    if isinstance(body, str):
        return [body]
    if isinstance(body, Mapping):
        out: list[str] = []
        for key in ("message", "code", "type", "error", "detail"):
            out += _texts(body.get(key))
        for key in ("n_ctx",):
            if isinstance(body.get(key), int):
                out.append(f"n_ctx {body[key]}")
        return out
    return []


def context_overflow(status: int, body: Any) -> tuple[bool, int | None]:
    """(the server refused the prompt as too long for its context, the context it named)."""
    if status not in (400, 413, 422):
        return False, None
    text = " ".join(_texts(body)).lower()
    if not any(p in text for p in _CONTEXT_PHRASES):
        return False, None
    m = _NUMBER_AFTER.search(text)
    return True, int(m.group(1)) if m else None


def retry_after_seconds(
    headers: Mapping[str, str] | None, now: float | None = None
) -> float | None:
    """Seconds a 429/503 asks us to wait: retry-after-ms, else Retry-After (seconds or a
    date); None when absent or unreadable."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
