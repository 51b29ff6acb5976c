"""The structured-output modes an OpenAI-compatible server may take, as request fields.

- `json_schema`: `response_format: {"type": "json_schema", ...}` (vLLM, Ollama, LM Studio,
  OpenAI);
- `json_object`: `{"type": "json_object", "schema": ...}` (llama.cpp's server; the Python
  server answers json_schema with HTTP 500);
- `none`: the schema in the system prompt, for servers that take neither.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from speakermem.integrations.llm.server_profile import StructuredMode
from speakermem.memory.ports import LLMContextOverflow, LLMRequestRejected, LLMUnavailable

ModeSetting = Literal["auto", "json_schema", "json_object", "none"]
"""The setting: a mode, or `auto` (identify the server, integrations/llm/server_profile.py)."""

MODE_ORDER: tuple[StructuredMode, ...] = ("json_schema", "json_object", "none")
"""What an unidentified server is offered, in turn, until its first call succeeds."""

SCHEMA_PROMPT = (
    "Reply with exactly one JSON object and nothing else (no prose, no code fences). "
    "It must match this JSON schema:\n"
)


def refuses_mode(exc: Exception) -> bool:
    """An answer that may mean "not this structured mode": HTTP 500 (llama.cpp's Python
    server on json_schema) or a 4xx refusal that is not about the context."""
    if isinstance(exc, LLMUnavailable):
        return exc.status == 500
    return isinstance(exc, LLMRequestRejected) and not isinstance(exc, LLMContextOverflow)


def for_mode(
    payload: list[dict[str, Any]], schema: dict[str, Any], name: str, mode: StructuredMode
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and request fields of one structured mode."""
    if mode == "json_schema":
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": False},
        }
        return payload, {"response_format": fmt}
    if mode == "json_object":
        # llama.cpp server 0.3.x: json_schema -> HTTP 500; json_object + schema works.
        return payload, {"response_format": {"type": "json_object", "schema": schema}}
    return with_schema_prompt(payload, schema), {}


def with_schema_prompt(messages: list[dict[str, Any]], schema: dict[str, Any]) -> list[dict]:
    """Mode "none": the schema travels in the system prompt (first system message or new)."""
    note = SCHEMA_PROMPT + json.dumps(schema, ensure_ascii=False)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{note}"
    else:
        out.insert(0, {"role": "system", "content": note})
    return out
