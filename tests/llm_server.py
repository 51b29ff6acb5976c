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

`LLMServer(persona=Persona(...))` makes it behave as one of the real servers (issue 32):
the endpoints it identifies itself by (vLLM's max_model_len in /v1/models, llama.cpp's
/props, Ollama's /api/version, /api/show and /api/ps, LM Studio's /api/v1/models), and the
way each one breaks: llama.cpp's Python server answering `json_schema` with HTTP 500, a
context that refuses (HTTP 400, vLLM / llama.cpp wording) or silently cuts (Ollama) a long
prompt, a reasoning model thinking inline (`<think>`) or in a `reasoning_content` /
`reasoning` field unless the server's switch turns it off. `vllm()`, `llamacpp()`,
`ollama()`, `lmstudio()` build the usual ones. Token counts are chars/4, as in usage.
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
from typing import Any, Literal

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

DRAFT_THOUGHT = (
    'Let me think. A first draft: {"actions": [{"type": "NOOP"}]}. No wait, message m1 '
    "says something durable, so the answer is an ADD."
)


@dataclass
class Persona:
    """One real server's identity and failure modes (see the module docstring)."""

    kind: Literal["openai", "vllm", "llamacpp", "llamacpp-python", "ollama", "lmstudio"] = "openai"
    context_tokens: int | None = None
    """The model's context; a longer prompt is refused, or cut when `truncate`."""
    truncate: bool = False
    """Cut an over-long prompt to the context from its beginning, and say nothing (Ollama)."""
    advertise_context: bool = True
    """Whether the server tells the context where it usually does (Ollama: `num_ctx` in
    /api/show only when the Modelfile sets it; otherwise the release's default applies)."""
    version: str | None = None
    json_schema_500: bool = False
    """HTTP 500 for `response_format: json_schema` (llama.cpp's Python server 0.3.x)."""
    thinking: Literal["content", "field"] | None = None
    """A reasoning model: thinking inline in `<think>` (drafting JSON there), or in a field."""
    thinking_field: str = "reasoning_content"
    thinking_switch: bool = True
    """Whether the server's switch (chat_template_kwargs / reasoning effort) stops it."""
    parallel: int | None = None

    def thinks(self, body: dict[str, Any]) -> bool:
        if self.thinking is None:
            return False
        if not self.thinking_switch:
            return True
        kwargs = body.get("chat_template_kwargs") or {}
        effort = (body.get("reasoning") or {}).get("effort") or body.get("reasoning_effort")
        return kwargs.get("enable_thinking") is not False and effort != "none"


def vllm(context: int = 8192, **kw: Any) -> Persona:
    return Persona(kind="vllm", context_tokens=context, **kw)


def llamacpp(context: int = 4096, *, python: bool = False, **kw: Any) -> Persona:
    """llama-server (/props, json_object + schema), or the Python server (no /props,
    HTTP 500 on json_schema) with `python=True`."""
    kind: Literal["llamacpp", "llamacpp-python"] = "llamacpp-python" if python else "llamacpp"
    kw.setdefault("json_schema_500", True)
    return Persona(kind=kind, context_tokens=context, **kw)


def ollama(context: int = 2048, **kw: Any) -> Persona:
    """Ollama's OpenAI route: it ignores num_ctx and cuts long prompts without a word."""
    kw.setdefault("version", "0.6.5")
    kw.setdefault("advertise_context", False)
    return Persona(kind="ollama", context_tokens=context, truncate=True, **kw)


def lmstudio(context: int = 4096, **kw: Any) -> Persona:
    return Persona(kind="lmstudio", context_tokens=context, **kw)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The fake tokenizer: 4 characters a token over the messages' contents."""
    return sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4


def cut_prompt(body: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The body with its messages cut from the front to `tokens` (what Ollama's runner
    does to an over-long prompt: the instructions and the roster go first)."""
    budget = tokens * 4
    kept: list[dict[str, Any]] = []
    for m in reversed(body.get("messages", [])):
        text = str(m.get("content", ""))
        if budget <= 0:
            break
        kept.append({**m, "content": text[-budget:]})
        budget -= len(text)
    return {**body, "messages": list(reversed(kept))}


class LLMServer:
    """aiohttp app on 127.0.0.1:<random port>; an async context manager."""

    def __init__(
        self, default: Item = NOOP, models: list[str] | None = None, persona: Persona | None = None
    ) -> None:
        self.default: Item = default
        self.models: list[str] = models if models is not None else ["test-model"]
        self.persona = persona or Persona()
        self.cut: list[int] = []
        """Prompt tokens of each request the server cut to its context (sent, before)."""
        self.info_calls: dict[str, int] = {}
        """Calls to the identification endpoints (/props, /api/show, ...), by path."""
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
        kind = self.persona.kind
        if kind == "llamacpp":
            app.router.add_get("/props", self._info)
        if kind == "ollama":
            for path in ("/api/version", "/api/ps"):
                app.router.add_get(path, self._info)
            app.router.add_post("/api/show", self._info)
        if kind == "lmstudio":
            app.router.add_get("/api/v1/models", self._info)
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
        owner = {"vllm": "vllm", "llamacpp": "llamacpp", "ollama": "library"}.get(
            self.persona.kind, "test"
        )
        data: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": 0, "owned_by": owner} for m in self.models
        ]
        if self.persona.kind == "vllm" and self.persona.advertise_context:
            for card in data:
                card["max_model_len"] = self.persona.context_tokens
        return web.json_response({"object": "list", "data": data})

    async def _info(self, request: web.Request) -> web.Response:
        """The identification endpoints of the persona's server, as that server shapes them."""
        path = request.path
        self.info_calls[path] = self.info_calls.get(path, 0) + 1
        p = self.persona
        ctx = p.context_tokens if p.advertise_context else None
        if path == "/props":
            return web.json_response(
                {
                    "default_generation_settings": {"n_ctx": ctx or 0, "params": {}},
                    "total_slots": p.parallel or 1,
                    "build_info": p.version or "b6000-test",
                }
            )
        if path == "/api/version":
            return web.json_response({"version": p.version or "0.9.0"})
        if path == "/api/show":
            params = 'stop "<|im_end|>"' + (f"\nnum_ctx {ctx}" if ctx else "")
            caps = ["completion"] + (["thinking"] if p.thinking else [])
            return web.json_response(
                {
                    "parameters": params,
                    "model_info": {"general.architecture": "qwen3", "qwen3.context_length": 40960},
                    "capabilities": caps,
                }
            )
        if path == "/api/ps":
            return web.json_response({"models": []})  # nothing loaded yet
        # LM Studio /api/v1/models
        config = {"context_length": p.context_tokens, "parallel": p.parallel or 4}
        models = [
            {
                "type": "llm",
                "key": m,
                "loaded_instances": [{"id": m, "config": config}],
                "max_context_length": 32768,
                "capabilities": {"reasoning": {"allowed_options": ["on"]}} if p.thinking else {},
            }
            for m in self.models
        ]
        return web.json_response({"models": models})

    def _context_check(self, body: dict[str, Any]) -> tuple[Item | None, dict[str, Any]]:
        """A refusal for an over-long prompt, or the body as the model will read it."""
        p = self.persona
        if p.json_schema_500 and (body.get("response_format") or {}).get("type") == "json_schema":
            return Status(500, body={"error": {"message": "json_schema not supported"}}), body
        ctx = p.context_tokens
        sent = prompt_tokens(body)
        if ctx is None or sent <= ctx:
            return None, body
        if p.truncate:
            self.cut.append(sent)
            return None, cut_prompt(body, ctx)
        if p.kind in ("llamacpp", "llamacpp-python"):
            error = {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": sent,
                "n_ctx": ctx,
            }
        else:
            error = {
                "message": f"This model's maximum context length is {ctx} tokens. However, "
                f"you requested {sent + int(body.get('max_tokens') or 0)} tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        return Status(400, body={"error": error}), body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.times.append(time.monotonic())
        refusal, seen = self._context_check(body)
        if self.outage is not None:
            item = self.outage
        elif self._fail:
            item = self._fail.popleft()
        elif refusal is not None:
            item = refusal
        elif self._queue:
            item = self._queue.popleft()
        else:
            self.unscripted += 1
            item = self.default
        return await self._render(request, item, seen)

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
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        thought = 0
        if self.persona.thinks(body):
            thought = len(DRAFT_THOUGHT) // 4
            if self.persona.thinking == "content":
                message["content"] = f"<think>{DRAFT_THOUGHT}</think>\n{reply.content or ''}"
            else:
                message[self.persona.thinking_field] = DRAFT_THOUGHT
        out: dict[str, Any] = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or body.get("model", "test-model"),
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
        }
        if reply.usage:
            out["usage"] = _usage(reply, body)
            out["usage"]["completion_tokens"] += thought
            out["usage"]["total_tokens"] += thought
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


def writer_model(body: dict[str, Any]) -> Reply:
    """A model that follows the Writer's instructions when it sees them (one ADD per prompt,
    `one_add_per_segment`) and, given a prompt cut before them, knows nothing to do."""
    if not any("You are the Writer" in str(m.get("content", "")) for m in body["messages"]):
        return Reply(content=json.dumps({"actions": [{"type": "NOOP"}]}))
    return one_add_per_segment(body)


def _usage(reply: Reply, body: dict[str, Any]) -> dict[str, int]:
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else max(1, prompt_tokens(body))
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
