"""Reasoning models: separate the thinking from the answer (pure).

Qwen3, DeepSeek-R1 distills and their kin think before they answer, and servers hand that
thinking back in one of three ways:
- in a separate message field: `reasoning_content` (DeepSeek's name; llama.cpp's server and
  vLLM before its rename) or `reasoning` (vLLM since late 2025, vllm-project/vllm#27752;
  Ollama's OpenAI route, openai/openai.go; LM Studio for gpt-oss);
- inline, as `<think>...</think>` before the answer;
- inline without the opening tag, when the chat template already put `<think>` in the prompt
  (the content is "...thinking...</think>answer").
A draft inside the thinking (`{"type": "NOOP"}` while the model deliberates) is not the
answer: only what follows the thinking is.
"""

from __future__ import annotations

import re
from typing import Any

_BLOCK = re.compile(r"<(think|thinking)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"<(think|thinking)>", re.IGNORECASE)
_CLOSE = re.compile(r"</(think|thinking)>", re.IGNORECASE)

REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Message fields that carry a reasoning model's thinking, by server (see the docstring)."""


def split_thinking(content: str) -> tuple[str, str]:
    """(answer, thinking) of a reply's content; thinking is "" when there is none.

    An unclosed `<think>` (the model was cut off while thinking) leaves no answer at all.
    """
    thoughts: list[str] = []

    def keep(match: re.Match[str]) -> str:
        thoughts.append(match.group(2).strip())
        return ""

    answer = _BLOCK.sub(keep, content)
    close = _CLOSE.search(answer)
    if close is not None and _OPEN.search(answer[: close.start()]) is None:
        thoughts.insert(0, answer[: close.start()].strip())  # the template opened the block
        answer = answer[close.end() :]
    opened = _OPEN.search(answer)
    if opened is not None:  # thinking that never ended: there is no answer
        thoughts.append(answer[opened.end() :].strip())
        answer = answer[: opened.start()]
    return answer.strip(), "\n".join(t for t in thoughts if t)


def field_thinking(message: Any) -> str:
    """Thinking a server returned beside the content (either field name), or ""."""
    extra = getattr(message, "model_extra", None) or {}
    for name in REASONING_FIELDS:
        value = getattr(message, name, None) or extra.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def thinking_tokens(usage: Any, thinking: str) -> int:
    """Tokens spent thinking: the server's count when it gives one
    (`completion_tokens_details.reasoning_tokens`), else an estimate (4 characters a token)."""
    details = getattr(usage, "completion_tokens_details", None)
    counted = getattr(details, "reasoning_tokens", None) if details is not None else None
    if isinstance(counted, int) and counted > 0:
        return counted
    return (len(thinking) + 3) // 4 if thinking else 0
