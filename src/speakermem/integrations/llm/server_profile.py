"""Which model server sits behind an OpenAI-compatible URL, and what that means for us.

Each server answers the same chat route but breaks in its own way (issue 32), and each
exposes enough to be recognised. What we read, and where the shape comes from:
- vLLM: `GET /v1/models` entries carry `owned_by: "vllm"` and `max_model_len` (ModelCard in
  vllm/entrypoints/openai/protocol.py). Structured output via `json_schema`; Qwen3-style
  thinking is switched off with `chat_template_kwargs: {"enable_thinking": false}`.
- llama.cpp's llama-server: `/v1/models` entries carry `owned_by: "llamacpp"`; `GET /props`
  gives `default_generation_settings.n_ctx` (a slot's context) and `total_slots` (its
  --parallel); `response_format` takes `{"type": "json_object", "schema": ...}`, and
  `chat_template_kwargs` reaches the template (tools/server/README.md). The Python server
  (llama-cpp-python 0.3.x) answers `json_schema` with HTTP 500 (measured, shared/TESTING.md)
  and has no /props: the first-call fallback below finds `json_object` for it.
- Ollama: `GET /api/version`; `POST /api/show` gives `parameters` (with `num_ctx` when the
  Modelfile sets it) and `capabilities` (with "thinking"); `GET /api/ps` gives a loaded
  model's `context_length` (since v0.9.7). Its OpenAI route ignores `num_ctx` in requests
  (docs/api/openai-compatibility.mdx) and, below v0.6.7, defaulted to a 2,048-token context,
  4,096 since (envconfig.ContextLength); a longer prompt is cut to fit, silently
  (llm/llama_server.go "truncating input prompt"). `OLLAMA_CONTEXT_LENGTH` (since v0.5.13)
  or a Modelfile's `PARAMETER num_ctx` raises it. `reasoning: {"effort": "none"}` turns
  thinking off (openai/openai.go, since v0.12.4).
- LM Studio: `GET /api/v1/models` (`models[].loaded_instances[].config.context_length`,
  `parallel`) or the older `GET /api/v0/models` (`max_context_length`); `json_schema`
  structured output (LM Studio docs, developer/openai-compat/structured-output).
The parsers are pure; `detect_server` does the GETs once and the caller remembers the result.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from yarl import URL

from speakermem.memory.url_masking import mask_url

log = logging.getLogger(__name__)

StructuredMode = Literal["json_schema", "json_object", "none"]
ServerKind = Literal["vllm", "llamacpp", "ollama", "lmstudio", "openai", "unknown"]

NAMES: dict[str, str] = {
    "vllm": "vLLM",
    "llamacpp": "llama.cpp server",
    "ollama": "Ollama",
    "lmstudio": "LM Studio",
    "openai": "OpenAI API",
    "unknown": "an OpenAI-compatible server",
}
MODES: dict[str, StructuredMode | None] = {
    "vllm": "json_schema",
    "llamacpp": "json_object",
    "ollama": "json_schema",
    "lmstudio": "json_schema",
    "openai": "json_schema",
    "unknown": None,  # json_schema first, then whatever the first call shows
}
THINKING_OFF_TEMPLATE = {"chat_template_kwargs": {"enable_thinking": False}}
THINKING_OFF_OLLAMA = {"reasoning": {"effort": "none"}}
OLLAMA_CONTEXT_4K_SINCE = (0, 6, 7)
"""Ollama's default context: 2,048 tokens before v0.6.7, 4,096 from it (newer releases size
it by GPU memory, 4,096 at the least): an assumption when nothing else says."""


@dataclass(frozen=True)
class ServerProfile:
    """What detection found (or was told) about the endpoint."""

    kind: ServerKind = "unknown"
    structured_mode: StructuredMode | None = None
    """The mode to use; None until the first call shows which one the server takes."""
    context_tokens: int | None = None
    context_source: str = "unknown"
    """Where `context_tokens` comes from: a server field, an assumed default, a setting, or
    a truncation we saw."""
    parallel: int | None = None
    """Requests the server serves at once, when it says (llama.cpp slots, LM Studio)."""
    version: str | None = None
    can_think: bool | None = None
    """The model is a reasoning model (Ollama / LM Studio capabilities); None: not said."""
    thinking_off: dict[str, Any] = field(default_factory=dict)
    """Request fields that turn thinking off on this server ({}: no known switch)."""
    learned_context: int | None = None
    """A smaller context the server proved (it cut a prompt, or refused one and said)."""
    learned_from: str = ""

    @property
    def name(self) -> str:
        return NAMES[self.kind] + (f" {self.version}" if self.version else "")

    def context_fix(self, needed: int | None = None) -> str:
        """The exact setting that gives this server a longer context."""
        n = max(8192, _round_up(needed or 0))
        return {
            "ollama": f"Ollama's OpenAI route ignores num_ctx in requests: start it with "
            f"OLLAMA_CONTEXT_LENGTH={n} (`OLLAMA_CONTEXT_LENGTH={n} ollama serve`), or "
            f"create a model whose Modelfile has `PARAMETER num_ctx {n}` and use that model",
            "vllm": f"start vLLM with --max-model-len {n} (or more)",
            "llamacpp": f"start llama-server with -c {n} or more (with --parallel N a slot "
            "may get 1/N of it)",
            "lmstudio": f"load the model with a longer context: lms load <model> "
            f"--context-length {n}",
        }.get(
            self.kind,
            f"give the model a context of at least {n} tokens on the server, or set "
            "SPEAKERMEM_LLM_CONTEXT_TOKENS to what it really has",
        )


def _round_up(n: int) -> int:
    return ((n + 4095) // 4096) * 4096


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(x) for x in m.groups()) if m else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ---- parsers (pure) ------------------------------------------------------------------------


def model_card(models: Any, model: str) -> dict[str, Any] | None:
    """The `/v1/models` entry for `model` (the only entry when the server serves one)."""
    data = models.get("data") if isinstance(models, dict) else None
    cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
    for card in cards:
        if card.get("id") == model:
            return card
    return cards[0] if len(cards) == 1 else None


def vllm_profile(card: dict[str, Any]) -> ServerProfile:
    length = _int(card.get("max_model_len"))
    return ServerProfile(
        kind="vllm",
        structured_mode=MODES["vllm"],
        context_tokens=length,
        context_source="vLLM max_model_len" if length else "unknown",
        thinking_off=dict(THINKING_OFF_TEMPLATE),
    )


def llamacpp_profile(props: dict[str, Any]) -> ServerProfile:
    settings = props.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    n_ctx = n_ctx or _int(props.get("n_ctx"))
    build = props.get("build_info")
    return ServerProfile(
        kind="llamacpp",
        structured_mode=MODES["llamacpp"],
        context_tokens=n_ctx,
        context_source="llama.cpp /props n_ctx (per slot)" if n_ctx else "unknown",
        parallel=_int(props.get("total_slots")),
        version=build if isinstance(build, str) and build else None,
        thinking_off=dict(THINKING_OFF_TEMPLATE),
    )


def ollama_num_ctx(parameters: Any) -> int | None:
    """`num_ctx` from /api/show's `parameters` text ("num_ctx    8192\\nstop ...")."""
    if not isinstance(parameters, str):
        return None
    m = re.search(r"^\s*num_ctx\s+(\d+)\s*$", parameters, re.MULTILINE)
    return int(m.group(1)) if m else None


def ollama_profile(
    version: str | None, show: dict[str, Any] | None, ps: dict[str, Any] | None, model: str
) -> ServerProfile:
    """Context: the model's num_ctx, else the loaded model's context (/api/ps), else the
    release's default (an assumption the first truncation corrects)."""
    show = show or {}
    caps = show.get("capabilities")
    can_think = "thinking" in caps if isinstance(caps, list) else None
    num_ctx = ollama_num_ctx(show.get("parameters"))
    source = "Ollama num_ctx parameter"
    if num_ctx is None:
        for loaded in (ps or {}).get("models") or []:
            if isinstance(loaded, dict) and model in (loaded.get("name"), loaded.get("model")):
                num_ctx = _int(loaded.get("context_length"))
                source = "Ollama /api/ps context_length"
    if num_ctx is None:
        vt = _version_tuple(version)
        num_ctx = 4096 if vt is not None and vt >= OLLAMA_CONTEXT_4K_SINCE else 2048
        source = f"Ollama's default for {version or 'an unknown version'} (assumed)"
    vt = _version_tuple(version)
    switch = can_think and vt is not None and vt >= (0, 12, 4)
    return ServerProfile(
        kind="ollama",
        structured_mode=MODES["ollama"],
        context_tokens=num_ctx,
        context_source=source,
        version=version,
        can_think=can_think,
        thinking_off=dict(THINKING_OFF_OLLAMA) if switch else {},
    )


def lmstudio_profile(payload: dict[str, Any], model: str) -> ServerProfile | None:
    """From /api/v1/models (`models`) or /api/v0/models (`data`); None if neither shape."""
    context: int | None = None
    parallel: int | None = None
    can_think: bool | None = None
    source = "unknown"
    if isinstance(payload.get("models"), list):
        for entry in payload["models"]:
            if not isinstance(entry, dict) or entry.get("key") != model:
                continue
            for inst in entry.get("loaded_instances") or []:
                cfg = inst.get("config") if isinstance(inst, dict) else None
                if isinstance(cfg, dict):
                    context = context or _int(cfg.get("context_length"))
                    parallel = parallel or _int(cfg.get("parallel"))
            reasoning = (entry.get("capabilities") or {}).get("reasoning")
            can_think = isinstance(reasoning, dict) or None
            source = "LM Studio loaded context_length" if context else source
    elif isinstance(payload.get("data"), list) and any(
        isinstance(e, dict) and "max_context_length" in e for e in payload["data"]
    ):
        for entry in payload["data"]:
            if isinstance(entry, dict) and entry.get("id") == model:
                context = _int(entry.get("loaded_context_length"))
                source = "LM Studio loaded_context_length" if context else source
    else:
        return None
    return ServerProfile(
        kind="lmstudio",
        structured_mode=MODES["lmstudio"],
        context_tokens=context,
        context_source=source,
        parallel=parallel,
        can_think=can_think,
    )


# ---- detection (I/O) -----------------------------------------------------------------------


def server_root(base_url: str) -> str:
    """The server's root URL: the OpenAI base without its trailing /v1."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


async def _get_json(http: aiohttp.ClientSession, url: str, body: Any = None) -> Any:
    """JSON of a 200 answer (a POST of `body` when given), else None: 404s and odd bodies
    simply mean "not this server"."""
    try:
        request = http.get(url) if body is None else http.post(url, json=body)
        async with request as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def detect_server(
    base_url: str, api_key: str, model: str, *, timeout_s: float = 10.0
) -> ServerProfile | None:
    """Identify the server (a few GETs); None when it cannot be reached (try again later)."""
    root = server_root(base_url)
    headers = {"Authorization": f"Bearer {api_key or 'none'}"}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        try:
            async with http.get(base_url.rstrip("/") + "/models") as resp:
                status = resp.status
                models = await resp.json(content_type=None) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info(
                "llm server detection: %s unreachable (%s)", mask_url(base_url), type(exc).__name__
            )
            return None
        except ValueError:
            status, models = 200, None
        if status >= 500:
            return None
        card = model_card(models, model) or {}
        owned_by = card.get("owned_by")
        if owned_by == "vllm":
            return vllm_profile(card)
        if owned_by == "llamacpp":
            props = await _get_json(http, root + "/props")
            return llamacpp_profile(props if isinstance(props, dict) else {})
        version = await _get_json(http, root + "/api/version")
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            show = await _get_json(http, root + "/api/show", {"model": model})
            ps = await _get_json(http, root + "/api/ps")
            return ollama_profile(
                version["version"],
                show if isinstance(show, dict) else None,
                ps if isinstance(ps, dict) else None,
                model,
            )
        for path in ("/api/v1/models", "/api/v0/models"):
            payload = await _get_json(http, root + path)
            found = lmstudio_profile(payload, model) if isinstance(payload, dict) else None
            if found is not None:
                return found
        props = await _get_json(http, root + "/props")
        if isinstance(props, dict) and "default_generation_settings" in props:
            return llamacpp_profile(props)
    if URL(base_url).host == "api.openai.com":
        return ServerProfile(kind="openai", structured_mode=MODES["openai"])
    return ServerProfile()
