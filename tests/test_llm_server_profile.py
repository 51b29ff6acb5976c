"""The pure parts of talking to real model servers: identifying them from what they expose,
thinking separated from answers, cut and refused prompts, Retry-After."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speakermem.integrations.llm.context_guard import (
    context_overflow,
    looks_truncated,
    retry_after_seconds,
)
from speakermem.integrations.llm.reasoning import field_thinking, split_thinking, thinking_tokens
from speakermem.integrations.llm.server_profile import (
    llamacpp_profile,
    lmstudio_profile,
    model_card,
    ollama_num_ctx,
    ollama_profile,
    server_root,
    vllm_profile,
)

# ---- identification ------------------------------------------------------------------------


def test_vllm_context_comes_from_max_model_len() -> None:
    models = {
        "object": "list",
        "data": [
            {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "max_model_len": 32768}
        ],
    }
    card = model_card(models, "Qwen/Qwen3-8B")
    assert card is not None
    p = vllm_profile(card)
    assert (p.kind, p.structured_mode, p.context_tokens) == ("vllm", "json_schema", 32768)
    assert p.thinking_off == {"chat_template_kwargs": {"enable_thinking": False}}
    assert "--max-model-len" in p.context_fix(9000)


def test_model_card_picks_the_named_model_or_the_only_one() -> None:
    two = {"data": [{"id": "a"}, {"id": "b"}]}
    assert model_card(two, "b") == {"id": "b"}
    assert model_card(two, "c") is None
    assert model_card({"data": [{"id": "a"}]}, "alias") == {"id": "a"}
    assert model_card({"error": "nope"}, "a") is None


def test_llamacpp_context_is_a_slots_n_ctx_and_slots_cap_parallelism() -> None:
    props = {
        "default_generation_settings": {"n_ctx": 4096, "params": {}},
        "total_slots": 4,
        "build_info": "b6000-abc",
    }
    p = llamacpp_profile(props)
    assert (p.kind, p.structured_mode, p.context_tokens, p.parallel) == (
        "llamacpp",
        "json_object",
        4096,
        4,
    )
    assert p.name == "llama.cpp server b6000-abc"
    assert llamacpp_profile({}).context_tokens is None


@pytest.mark.parametrize(
    ("version", "parameters", "ps", "context", "source"),
    [
        ("0.6.5", 'stop "x"', None, 2048, "Ollama's default for 0.6.5 (assumed)"),
        ("0.6.7", 'stop "x"', None, 4096, "Ollama's default for 0.6.7 (assumed)"),
        ("0.12.0", "num_ctx 16384\nstop x", None, 16384, "Ollama num_ctx parameter"),
        (
            "0.12.0",
            "",
            {"models": [{"name": "qwen3:8b", "model": "qwen3:8b", "context_length": 8192}]},
            8192,
            "Ollama /api/ps context_length",
        ),
        (None, None, None, 2048, "Ollama's default for an unknown version (assumed)"),
    ],
)
def test_ollama_context_in_order_num_ctx_loaded_default(
    version: str | None, parameters: str | None, ps: dict | None, context: int, source: str
) -> None:
    p = ollama_profile(version, {"parameters": parameters}, ps, "qwen3:8b")
    assert (p.context_tokens, p.context_source) == (context, source)
    assert p.structured_mode == "json_schema"
    fix = p.context_fix(3000)
    assert "OLLAMA_CONTEXT_LENGTH=8192" in fix and "PARAMETER num_ctx 8192" in fix


def test_ollama_thinking_switch_only_where_the_release_has_it() -> None:
    show = {"capabilities": ["completion", "thinking"]}
    assert ollama_profile("0.12.4", show, None, "m").thinking_off == {
        "reasoning": {"effort": "none"}
    }
    old = ollama_profile("0.9.0", show, None, "m")
    assert old.can_think and old.thinking_off == {}
    plain = ollama_profile("0.12.4", {"capabilities": ["completion"]}, None, "m")
    assert plain.can_think is False and plain.thinking_off == {}


def test_ollama_num_ctx_parsing() -> None:
    assert ollama_num_ctx("num_keep 24\nnum_ctx      8192\nstop x") == 8192
    assert ollama_num_ctx("num_keep 24") is None
    assert ollama_num_ctx(None) is None


def test_lmstudio_reads_the_loaded_instance_or_the_v0_listing() -> None:
    v1 = {
        "models": [
            {
                "key": "qwen3-8b",
                "loaded_instances": [
                    {"id": "x", "config": {"context_length": 8192, "parallel": 2}}
                ],
                "max_context_length": 40960,
                "capabilities": {"reasoning": {"allowed_options": ["off", "on"]}},
            }
        ]
    }
    p = lmstudio_profile(v1, "qwen3-8b")
    assert p is not None and (p.context_tokens, p.parallel, p.can_think) == (8192, 2, True)
    v0 = {"data": [{"id": "m", "max_context_length": 32768, "loaded_context_length": 4096}]}
    p0 = lmstudio_profile(v0, "m")
    assert p0 is not None and p0.context_tokens == 4096  # loaded, not the model's maximum
    assert lmstudio_profile({"data": [{"id": "m"}]}, "m") is None  # not LM Studio's shape


def test_server_root_strips_the_openai_prefix() -> None:
    assert server_root("http://h:11434/v1") == "http://h:11434"
    assert server_root("http://h:8080/v1/") == "http://h:8080"
    assert server_root("http://h/proxy") == "http://h/proxy"


# ---- thinking ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "answer", "thinking"),
    [
        ('{"a": 1}', '{"a": 1}', ""),
        ('<think>draft {"a": 0}</think>\n{"a": 1}', '{"a": 1}', 'draft {"a": 0}'),
        ('draft {"a": 0}</think>{"a": 1}', '{"a": 1}', 'draft {"a": 0}'),  # opened by template
        ('<think>still going {"a": 0}', "", 'still going {"a": 0}'),  # cut while thinking
        ('<THINKING>x</THINKING> {"a": 1}', '{"a": 1}', "x"),
    ],
)
def test_split_thinking(content: str, answer: str, thinking: str) -> None:
    assert split_thinking(content) == (answer, thinking)


def test_field_thinking_reads_either_name_and_counts_tokens() -> None:
    assert field_thinking(SimpleNamespace(reasoning_content=" hmm ")) == "hmm"
    assert field_thinking(SimpleNamespace(model_extra={"reasoning": "ok"})) == "ok"
    assert field_thinking(SimpleNamespace(content="x")) == ""
    counted = SimpleNamespace(completion_tokens_details=SimpleNamespace(reasoning_tokens=42))
    assert thinking_tokens(counted, "x" * 400) == 42
    assert thinking_tokens(None, "x" * 400) == 100
    assert thinking_tokens(None, "") == 0


# ---- cut and refused prompts, Retry-After -----------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "read", "cut"),
    [
        (3000, 2048, True),  # Ollama at 2,048: cut to exactly its context
        (2200, 2048, True),  # a small cut to a round context still shows
        (2200, 2050, False),  # ...but not to an arbitrary count (a tokenizer difference)
        (3000, 2900, False),
        (3000, 3400, False),  # a real tokenizer counting more than 4 chars a token
        (3000, 0, False),  # not reported
        (100, 60, False),  # too few tokens missing to judge
    ],
)
def test_looks_truncated(sent: int, read: int, cut: bool) -> None:
    assert looks_truncated(sent, read) is cut


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            {
                "message": "This model's maximum context length is 4096 tokens. However, you "
                "requested 5000 tokens (4000 in the messages, 1000 in the completion).",
                "type": "BadRequestError",
            },
            (True, 4096),
        ),
        (
            400,
            {
                "error": {
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_ctx": 2048,
                }
            },
            (True, 2048),
        ),
        (400, {"error": {"code": "context_length_exceeded", "message": "too long"}}, (True, None)),
        (400, {"error": {"message": "unknown field chat_template_kwargs"}}, (False, None)),
        (500, {"error": {"message": "context length"}}, (False, None)),
    ],
)
def test_context_overflow(status: int, body: object, expected: tuple[bool, int | None]) -> None:
    assert context_overflow(status, body) == expected


def test_retry_after_seconds_date_and_ms() -> None:
    assert retry_after_seconds({"Retry-After": "7"}) == 7
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"}, 1445412500.0) == (
        pytest.approx(10.0)
    )
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None
