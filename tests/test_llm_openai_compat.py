"""OpenAICompatLLM against the scripted server with the real openai client, plus extract_json."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from speakermem.integrations.llm.json_extract import extract_json
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.integrations.llm.structured_modes import SCHEMA_PROMPT
from speakermem.memory.ports import (
    LLM,
    ChatMessage,
    LLMBadOutput,
    LLMRequestRejected,
    LLMUnavailable,
)
from tests.llm_fixtures import llm_server  # noqa: F401  (fixture)
from tests.llm_server import Delay, Garbage, Handler, LLMServer, Reply, Status

KEY = "sk-test-DO-NOT-LEAK-1234567890"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
    "required": ["facts"],
}
MESSAGES = [
    ChatMessage(role="system", content="You extract facts."),
    ChatMessage(role="user", content="alice: I moved to Lisbon"),
]


def make(server: LLMServer, mode: str = "json_schema", **kw: Any) -> OpenAICompatLLM:
    opts: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.001, "backoff_max_s": 0.005}
    opts.update(kw)
    timeout = opts.pop("timeout_s", 2.0)
    return OpenAICompatLLM(server.base_url, KEY, "test-model", timeout, mode, **opts)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def llm(llm_server: LLMServer) -> AsyncIterator[OpenAICompatLLM]:  # noqa: F811
    client = make(llm_server)
    yield client
    await client.aclose()


async def ask(client: OpenAICompatLLM) -> Any:
    return await client.complete_json(MESSAGES, SCHEMA, schema_name="facts")


# -- request shapes -----------------------------------------------------------------------------


def test_satisfies_port(llm: OpenAICompatLLM) -> None:
    assert isinstance(llm, LLM)
    assert KEY not in repr(llm)


async def test_json_schema_mode_request_shape(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
) -> None:
    llm_server.script(Reply(content='{"facts": ["alice lives in Lisbon"]}'))
    result = await llm.complete_json(
        MESSAGES, SCHEMA, schema_name="facts", max_tokens=64, temperature=0.2
    )
    assert result.data == {"facts": ["alice lives in Lisbon"]}
    assert result.parse_error is None and result.finish_reason == "stop"
    sent = llm_server.last_request
    assert sent["model"] == "test-model"
    assert sent["max_tokens"] == 64 and sent["temperature"] == 0.2
    assert sent["messages"] == [m.model_dump() for m in MESSAGES]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "facts", "schema": SCHEMA, "strict": False},
    }
    assert llm_server.headers[-1]["Authorization"] == f"Bearer {KEY}"


async def test_json_object_mode_sends_schema_inline(llm_server: LLMServer) -> None:  # noqa: F811
    async with make(llm_server, "json_object") as client:
        llm_server.script(Reply(content='{"facts": []}'))
        result = await ask(client)
    assert result.data == {"facts": []}
    sent = llm_server.last_request
    assert sent["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert sent["messages"] == [m.model_dump() for m in MESSAGES]
    assert "max_tokens" not in sent


async def test_none_mode_puts_schema_in_system_prompt(llm_server: LLMServer) -> None:  # noqa: F811
    async with make(llm_server, "none") as client:
        llm_server.script(Reply(content='{"facts": []}'), Reply(content='{"facts": []}'))
        await ask(client)
        await client.complete_json(
            [ChatMessage(role="user", content="hi")], SCHEMA, schema_name="facts"
        )
    first, second = llm_server.requests
    assert "response_format" not in first
    system = first["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith("You extract facts.")
    assert SCHEMA_PROMPT in system["content"] and json.dumps(SCHEMA) in system["content"]
    assert first["messages"][1] == MESSAGES[1].model_dump()
    # No system message given: one is inserted in front.
    assert second["messages"][0]["role"] == "system"
    assert second["messages"][1] == {"role": "user", "content": "hi"}
    assert MESSAGES[0].content == "You extract facts."  # caller's messages untouched


async def test_handler_answers_from_prompt(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
) -> None:
    def echo(body: dict[str, Any]) -> Reply:
        return Reply(content=json.dumps({"facts": [body["messages"][-1]["content"]]}))

    llm_server.script(Handler(echo))
    result = await ask(llm)
    assert result.data == {"facts": ["alice: I moved to Lisbon"]}


async def test_unknown_mode_rejected(llm_server: LLMServer) -> None:  # noqa: F811
    with pytest.raises(ValueError):
        make(llm_server, "grammar")


# -- defensive parsing through the wire -----------------------------------------------------------


async def test_code_fenced_reply_parsed(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Reply(content='Sure!\n```json\n{"facts": ["x"]}\n```\nAnything else?'))
    result = await ask(llm)
    assert result.data == {"facts": ["x"]} and result.parse_error is None
    assert result.raw_text.startswith("Sure!")


async def test_trailing_text_parsed(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Reply(content='{"facts": ["a {b}"]} I hope this helps {really}.'))
    assert (await ask(llm)).data == {"facts": ["a {b}"]}


async def test_truncated_output_returns_parse_error(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
) -> None:
    llm_server.script(Reply(content='{"facts": ["alice lives in Lis', finish_reason="length"))
    result = await ask(llm)
    assert result.data is None
    assert result.parse_error == "truncated"
    assert result.finish_reason == "length"
    assert llm.stats.parse_errors == {"truncated": 1}
    assert llm.stats.errors == {}


async def test_empty_content_is_parse_error(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Reply(content=None), Reply(content="I cannot help with that."))
    assert (await ask(llm)).parse_error == "empty"
    assert (await ask(llm)).parse_error == "no_json"


@pytest.mark.parametrize(
    "garbage",
    [
        Garbage(),
        Garbage("{not json", "application/json"),
        Garbage('{"hello": 1}', "application/json"),
    ],
)
async def test_garbage_body_raises_bad_output(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
    garbage: Garbage,
) -> None:
    llm_server.script(garbage)
    with pytest.raises(LLMBadOutput):
        await ask(llm)
    assert len(llm_server.requests) == 1  # not retried
    assert llm.stats.errors == {"bad_response": 1}


# -- retries and error mapping ------------------------------------------------------------------


async def test_429_then_success_is_retried(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Status(429), Reply(content='{"facts": []}'))
    result = await ask(llm)
    assert result.data == {"facts": []}
    assert len(llm_server.requests) == 2
    stats = llm.stats
    assert (stats.calls, stats.attempts, stats.retries) == (1, 2, 1)
    assert stats.errors == {"rate_limited": 1}


async def test_a_long_retry_after_is_handed_to_the_caller(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
) -> None:
    """Retry-After beyond the backoff cap (5 ms here): no retry sooner than the server
    asked, and no call hanging for it: the caller (the Writer's breaker) waits."""
    llm_server.script(Status(429, headers={"Retry-After": "30"}), Reply(content='{"facts": []}'))
    started = time.monotonic()
    with pytest.raises(LLMUnavailable) as info:
        await ask(llm)
    assert time.monotonic() - started < 5
    assert info.value.retry_after == 30 and info.value.overloaded and info.value.status == 429
    assert len(llm_server.requests) == 1 and llm_server.pending == 1


async def test_a_short_retry_after_is_waited_then_retried(llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Status(503, headers={"Retry-After": "0.4"}), Reply(content='{"facts": []}'))
    async with make(llm_server, backoff_max_s=2.0) as client:
        assert (await ask(client)).data == {"facts": []}
    first, second = llm_server.times
    assert second - first >= 0.4  # the server's wait, not our 1 ms base backoff


async def test_500_until_retries_exhausted(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(*[Status(500)] * 3, Reply(content='{"facts": []}'))
    with pytest.raises(LLMUnavailable) as info:
        await ask(llm)
    assert info.value.retryable
    assert "http 500" in str(info.value)
    assert len(llm_server.requests) == 3  # max_retries=2 -> 3 attempts
    assert llm.stats.errors == {"server_error": 3, "unavailable": 1}
    assert llm_server.pending == 1


async def test_outage_then_recovery(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.fail_next(2, status=503).script(Reply(content='{"facts": ["ok"]}'))
    assert (await ask(llm)).data == {"facts": ["ok"]}
    assert llm.stats.errors == {"server_error": 2}


async def test_dropped_connections_are_retried(
    llm: OpenAICompatLLM,
    llm_server: LLMServer,  # noqa: F811
) -> None:
    llm_server.fail_next(1, status=None).script(Reply(content='{"facts": []}'))
    assert (await ask(llm)).data == {"facts": []}
    assert llm.stats.errors == {"connection": 1}


async def test_400_rejected_without_retry(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Status(400), Reply(content="{}"))
    with pytest.raises(LLMRequestRejected) as info:
        await ask(llm)
    assert not info.value.retryable
    assert str(info.value) == "http 400"
    assert len(llm_server.requests) == 1
    assert llm.stats.errors == {"rejected": 1}


async def test_timeout_retried_then_unavailable(llm_server: LLMServer) -> None:  # noqa: F811
    async with make(llm_server, timeout_s=0.1, max_retries=1) as client:
        llm_server.script(Delay(5), Delay(5), Reply(content="{}"))
        with pytest.raises(LLMUnavailable, match="timeout"):
            await ask(client)
        assert len(llm_server.requests) == 2
        assert client.stats.errors == {"timeout": 2, "unavailable": 1}


async def test_unreachable_endpoint(llm_server: LLMServer) -> None:  # noqa: F811
    port = llm_server.port
    await llm_server.stop()
    url = f"http://127.0.0.1:{port}/v1"
    client = OpenAICompatLLM(url, KEY, "m", 0.5, "json_schema", max_retries=1, backoff_base_s=0.001)
    async with client:
        with pytest.raises(LLMUnavailable, match="connection"):
            await ask(client)
        assert (await client.check()).startswith("down: connection")


# -- accounting ---------------------------------------------------------------------------------


async def test_usage_and_latency_recorded(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(
        Reply(content='{"facts": []}', prompt_tokens=120, completion_tokens=7),
        Reply(content="plain words", prompt_tokens=30, completion_tokens=3),
        Reply(content='{"facts": []}', usage=False),
    )
    first = await ask(llm)
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (120, 7)
    assert first.usage.latency_ms > 0
    assert first.model == "test-model"
    text = await llm.complete_text(MESSAGES, max_tokens=16)
    assert text.raw_text == "plain words" and text.data is None and text.parse_error is None
    assert "response_format" not in llm_server.last_request
    missing = await ask(llm)
    assert (missing.usage.prompt_tokens, missing.usage.completion_tokens) == (0, 0)
    stats = llm.stats
    assert (stats.calls, stats.prompt_tokens, stats.completion_tokens) == (3, 150, 10)
    total = first.usage.latency_ms + text.usage.latency_ms + missing.usage.latency_ms
    assert stats.latency_ms_total == pytest.approx(total, rel=0.05)


async def test_check_lists_models(llm: OpenAICompatLLM, llm_server: LLMServer) -> None:  # noqa: F811
    assert await llm.check() == "ok: test-model available"
    llm_server.models = ["other"]
    assert "not listed" in await llm.check()
    llm_server.fail_next(1, status=503)
    assert await llm.check() == "down: http 503"
    assert llm_server.model_list_calls == 3


# -- streaming (proves the server speaks SSE to the real client) --------------------------------


async def test_streaming_through_server(llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(Reply(content='{"facts": ["streamed answer"]}', completion_tokens=9))
    client = AsyncOpenAI(base_url=llm_server.base_url, api_key=KEY, max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        parts: list[str] = []
        finish = None
        usage = None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    finally:
        await client.close()
    assert "".join(parts) == '{"facts": ["streamed answer"]}'
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 9
    assert llm_server.last_request["stream"] is True


# -- secrets ------------------------------------------------------------------------------------


async def test_api_key_never_logged(
    llm_server: LLMServer,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    leaky = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_key"}}
    async with make(llm_server, max_retries=1) as client:
        llm_server.script(Status(401, body=leaky))
        with pytest.raises(LLMRequestRejected) as rejected:
            await ask(client)
        llm_server.script(Status(500, body=leaky), Status(500, body=leaky))
        with pytest.raises(LLMUnavailable) as unavailable:
            await ask(client)
        llm_server.script(Reply(content="not json"))
        await ask(client)
    for exc in (rejected.value, unavailable.value):
        assert KEY not in str(exc)
        assert exc.__cause__ is None and exc.__suppress_context__
    assert caplog.records  # something was logged at all
    assert KEY not in caplog.text


# -- extract_json (pure) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": 1}\n', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('Here you go:\n```json\n{"a": [1, 2]}\n```\nLet me know!', {"a": [1, 2]}),
        ('Sure, the answer is {"a": 1} as requested.', {"a": 1}),
        ('{"a": 1}\n\nExplanation: I used {braces} here }', {"a": 1}),
        ('{"s": "a } b { c"}', {"s": "a } b { c"}),
        ('{"s": "he said \\"}\\" ok"}', {"s": 'he said "}" ok'}),
        ('{"s": "back\\\\"} tail', {"s": "back\\"}),
        ('{"name": "José ☕ 東京", "e": "\\u00e9"}', {"name": "José ☕ 東京", "e": "é"}),
        ('{"o": {"i": {"deep": [1, {"x": null}]}}}', {"o": {"i": {"deep": [1, {"x": None}]}}}),
        ("Use {name} as placeholder. {\"a\": 1}", {"a": 1}),
        ('[see below] {"a": 1}', {"a": 1}),
        ('[1, 2] then {"a": 1}', {"a": 1}),
        ('{"a": [1, 2,], "b": 3,}', {"a": [1, 2], "b": 3}),
        ("\ufeff{\"a\": 1}", {"a": 1}),
        ("{}", {}),
    ],
)  # fmt: skip
def test_extract_json_ok(text: str, expected: dict[str, Any]) -> None:
    assert extract_json(text, "stop") == (expected, None)


@pytest.mark.parametrize(
    ("text", "finish", "error"),
    [
        ("", "stop", "empty"),
        ("   \n ", "stop", "empty"),
        (None, None, "empty"),
        ("no json here at all", "stop", "no_json"),
        ("I would say {name} is unknown", "stop", "no_json"),
        ('{"a": 1', "stop", "truncated"),
        ('{"facts": ["one", "tw', "length", "truncated"),
        ('{"facts": [{"a": 1}, {"b": 2', "length", "truncated"),  # never an inner fragment
        ('```json\n{"a": {"b": 1}', "length", "truncated"),
        ("Let me think about this carefully and", "length", "truncated"),
        ("[1, 2, 3]", "stop", "not_object"),
        ('[{"a": 1}]', "stop", "not_object"),
        ("{'a': 1}", "stop", "invalid_json"),
        ('{"a": 1 "b": 2}', "stop", "invalid_json"),
        ('{"a": undefined}', "stop", "invalid_json"),
    ],
)
def test_extract_json_errors(text: str | None, finish: str | None, error: str) -> None:
    assert extract_json(text, finish) == (None, error)


def test_extract_json_complete_object_survives_length() -> None:
    """A closed object followed by rambling into the token limit is still an answer."""
    assert extract_json('{"a": 1}\n\n\n   and then the model kept going', "length") == (
        {"a": 1},
        None,
    )


def test_extract_json_prefers_fenced_block() -> None:
    text = 'Example format: {"facts": ["example"]}\n```json\n{"facts": ["real"]}\n```'
    assert extract_json(text, "stop") == ({"facts": ["real"]}, None)
