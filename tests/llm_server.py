"""A scripted OpenAI-compatible server for tests, driven through the real `openai` client.

Why a real HTTP server instead of mocking the client: the adapter's job is exactly the edge
between our code and the wire (status codes, timeouts, odd bodies, SSE), so tests should
cross that edge. Usage:

    async with LLMServer() as server:
        server.script(Status(429), Reply(content='{"ok": true}'))
        llm = OpenAICompatLLM(server.base_url, "test-key", "test-model", 1.0, "json_schema")
        ...
        assert server.requests[-1]["response_format"]["type"] == "json_schema"

Each POST /v1/chat/completions takes the next scripted item (or `default` when the queue is
empty). `fail_next(n)` simulates an outage that takes precedence over the script;
`down()` / `up()` an outage of any length (every call fails until `up()`), and `times`
records when each chat call arrived (to count attempts in a window).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


@dataclass
class Reply:
    """A normal completion. Token counts default to a chars/4 estimate; usage=False omits it."""

    content: str | None = "{}"
    finish_reason: str | None = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage: bool = True
    model: str | None = None  # None: echo the requested model


@dataclass
class Status:
    """An HTTP error. `body`: dict -> JSON, str -> text/plain, None -> OpenAI error envelope."""

    code: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Delay:
    """Sleep before answering (to trip client timeouts), then answer with `then` or default."""

    seconds: float
    then: Item | None = None


@dataclass
class Garbage:
    """HTTP 200 with a body that is not a chat completion."""

    text: str = "<html><body>502 Bad Gateway</body></html>"
    content_type: str = "text/html"


@dataclass
class Disconnect:
    """Drop the connection without answering (the client sees a connection error)."""


@dataclass
class Handler:
    """Compute the answer from the parsed request body; `fn` may be sync or async."""

    fn: Callable[[dict[str, Any]], Item | Awaitable[Item]]


Item = Reply | Status | Delay | Garbage | Disconnect | Handler

NOOP = Reply(content="{}")


class LLMServer:
    """aiohttp app on 127.0.0.1:<random port>; an async context manager."""

    def __init__(self, default: Item = NOOP, models: list[str] | None = None) -> None:
        self.default: Item = default
        self.models: list[str] = models if models is not None else ["test-model"]
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.model_list_calls = 0
        self.unscripted = 0  # answered with `default` because the queue was empty
        self.times: list[float] = []
        """time.monotonic() at which each chat completion call arrived."""
        self.outage: Item | None = None
        """While set (`down()`), every call to any endpoint gets this item."""
        self._queue: deque[Item] = deque()
        self._fail: deque[Item] = deque()
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- scripting ---------------------------------------------------------------------------

    def script(self, *items: Item) -> LLMServer:
        """Queue answers for the next chat completion calls, in order."""
        self._queue.extend(items)
        return self

    def fail_next(self, n: int, status: int | None = 503) -> LLMServer:
        """Outage for the next `n` calls to any endpoint: `status`, or a dropped connection
        when `status` is None. Takes precedence over the script (which stays queued)."""
        item: Item = Status(status) if status is not None else Disconnect()
        self._fail.extend([item] * n)
        return self

    def down(self, status: int | None = 503) -> LLMServer:
        """Endpoint down until `up()`: `status`, or dropped connections when None."""
        self.outage = Status(status) if status is not None else Disconnect()
        return self

    def up(self) -> LLMServer:
        self.outage = None
        return self

    def calls_between(self, start: float, end: float) -> int:
        """Chat calls that arrived in [start, end) (time.monotonic() values)."""
        return sum(1 for t in self.times if start <= t < end)

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def last_request(self) -> dict[str, Any]:
        return self.requests[-1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> LLMServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> LLMServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- handlers ----------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.model_list_calls += 1
        if self.outage is not None:
            return await self._render(request, self.outage, {})
        if self._fail:
            return await self._render(request, self._fail.popleft(), {})
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.times.append(time.monotonic())
        if self.outage is not None:
            item = self.outage
        elif self._fail:
            item = self._fail.popleft()
        elif self._queue:
            item = self._queue.popleft()
        else:
            self.unscripted += 1
            item = self.default
        return await self._render(request, item, body)

    async def _render(
        self, request: web.Request, item: Item, body: dict[str, Any]
    ) -> web.StreamResponse:
        while isinstance(item, Handler | Delay):
            if isinstance(item, Handler):
                out = item.fn(body)
                item = await out if inspect.isawaitable(out) else out
            else:
                try:
                    await asyncio.wait_for(self._closing.wait(), item.seconds)
                except TimeoutError:
                    pass
                item = item.then if item.then is not None else self.default
        if isinstance(item, Status):
            return _status_response(item)
        if isinstance(item, Garbage):
            return web.Response(text=item.text, content_type=item.content_type)
        if isinstance(item, Disconnect):
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # nothing left to answer on
        if isinstance(item, Reply):
            if body.get("stream"):
                return await self._stream(request, item, body)
            return web.json_response(self._completion(item, body))
        raise TypeError(f"not a scripted item: {item!r}")

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or body.get("model", "test-model"),
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
        }
        if reply.usage:
            out["usage"] = _usage(reply, body)
        return out

    async def _stream(
        self, request: web.Request, reply: Reply, body: dict[str, Any]
    ) -> web.StreamResponse:
        """SSE like OpenAI/vLLM: role chunk, content pieces, finish chunk, usage chunk, DONE."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": reply.model or body.get("model", "test-model"),
        }

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {**base, "choices": choices, **extra}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def delta(d: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}]

        await send(delta({"role": "assistant", "content": ""}))
        text = reply.content or ""
        for i in range(0, len(text), 8):
            await send(delta({"content": text[i : i + 8]}))
        await send(delta({}, reply.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage") and reply.usage:
            await send([], usage=_usage(reply, body))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# A message line of the Writer's prompt: its ref, speaker id and text.
REF_LINE = re.compile(r"^(m\d+) \[[^\]]*\] .*? \(([^)]+)\)(?: \[[^\]]*\])?: (.*)$", re.M)


def one_add_per_segment(body: dict[str, Any]) -> Reply:
    """A Writer reply: one ADD per segment, its content the segment's first message (its
    words pass the evidence gate); NOOP for a prompt without message lines."""
    lines = REF_LINE.findall(str(body["messages"][-1]["content"]))
    if not lines:
        return Reply(content=json.dumps({"actions": [{"type": "NOOP"}]}))
    ref, uid, text = lines[0]
    action = {
        "type": "ADD",
        "layer": "profile",
        "source": uid,
        "owner": uid,
        "content": text,
        "event": "plan",
        "refs": [ref],
    }
    return Reply(content=json.dumps({"actions": [action]}))


def _usage(reply: Reply, body: dict[str, Any]) -> dict[str, int]:
    chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else max(1, chars // 4)
    if reply.completion_tokens is not None:
        done = reply.completion_tokens
    else:
        done = len(reply.content or "") // 4 + (1 if reply.content else 0)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _status_response(item: Status) -> web.Response:
    if isinstance(item.body, str):
        return web.Response(status=item.code, text=item.body, headers=item.headers)
    body = item.body
    if body is None:
        kind = "server_error" if item.code >= 500 else "invalid_request_error"
        body = {"error": {"message": f"scripted {item.code}", "type": kind, "code": item.code}}
    return web.json_response(body, status=item.code, headers=item.headers)
