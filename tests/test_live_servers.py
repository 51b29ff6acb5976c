"""Live recipes: doctor and the Writer against each real model server, default settings.

Marked `live`: excluded by default and from CI. Each test runs only when its server's URL
is set, so start one server (docs/guides/serving-a-writer-model.md) and run its test:

    # vLLM (GPU): vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 16384
    SPEAKERMEM_LIVE_VLLM_URL=http://localhost:8000/v1 \\
    SPEAKERMEM_LIVE_VLLM_MODEL=Qwen/Qwen2.5-7B-Instruct pytest -m live tests/test_live_servers.py

    # llama.cpp: llama-server -hf Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M -c 8192 --jinja
    SPEAKERMEM_LIVE_LLAMACPP_URL=http://localhost:8080/v1 pytest -m live tests/test_live_servers.py

    # Ollama: ollama serve; ollama pull qwen2.5:7b-instruct
    SPEAKERMEM_LIVE_OLLAMA_URL=http://localhost:11434/v1 \\
    SPEAKERMEM_LIVE_OLLAMA_MODEL=qwen2.5:7b-instruct pytest -m live tests/test_live_servers.py

    # LM Studio: lms server start; lms load <model> --context-length 8192
    SPEAKERMEM_LIVE_LMSTUDIO_URL=http://localhost:1234/v1 \\
    SPEAKERMEM_LIVE_LMSTUDIO_MODEL=<model key> pytest -m live tests/test_live_servers.py

A reasoning model (e.g. Qwen3 on vLLM with --reasoning-parser qwen3) can be pointed at any of
them: the thinking check then reports whether the server's switch turned it off.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_llm, open_engine
from speakermem.integrations.doctor import llm_checks
from speakermem.integrations.doctor_checks import exit_code
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.models import Scope
from speakermem.memory.writer.runner import Writer
from tests.conftest import msg

pytestmark = pytest.mark.live

SERVERS = {
    "vllm": ("SPEAKERMEM_LIVE_VLLM", "vLLM", "default"),
    "llamacpp": ("SPEAKERMEM_LIVE_LLAMACPP", "llama.cpp server", "default"),
    "ollama": ("SPEAKERMEM_LIVE_OLLAMA", "Ollama", "qwen2.5:7b-instruct"),
    "lmstudio": ("SPEAKERMEM_LIVE_LMSTUDIO", "LM Studio", "default"),
}
SCOPE = Scope(platform="live", workspace="w", channel="offsite")
LINES = [
    ("Alice", "I'm vegetarian, so please no meat at the offsite dinner."),
    ("Bob", "Noted. I booked the Lakeside venue for March 14, confirmation is in the drive."),
    ("Carol", "I moved to the payments team last Monday, so I'm in the Berlin office now."),
    ("Bob", "Congrats Carol! Who covers your Thursday on-call shift during the release?"),
    ("Dan", "I'll cover Thursday if someone swaps my Saturday shift with me."),
]


def settings_for(tmp_path: Path, kind: str) -> Settings:
    prefix, _, default_model = SERVERS[kind]
    url = os.environ.get(f"{prefix}_URL")
    if not url:
        pytest.skip(f"set {prefix}_URL (and {prefix}_MODEL) to run the {kind} recipe")
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        db_path=tmp_path / "live.db",
        embedder="none",
        llm_base_url=url,
        llm_model=os.environ.get(f"{prefix}_MODEL", default_model),
        llm_api_key=os.environ.get(f"{prefix}_API_KEY", "not-needed"),
        llm_timeout_s=float(os.environ.get("SPEAKERMEM_LIVE_TIMEOUT_S", "180")),
    )


@pytest.mark.parametrize("kind", list(SERVERS))
async def test_doctor_on_a_real_server(tmp_path: Path, kind: str) -> None:
    checks = await llm_checks(settings_for(tmp_path, kind))
    by = {c.name.split(" (")[0]: c for c in checks}
    print("\n".join(f"{c.status:5} {c.name}: {c.detail} {c.fix or ''}" for c in checks))
    assert SERVERS[kind][1] in by["server"].detail
    assert by["structured output"].status == "ok", by["structured output"]
    assert by["context"].status != "fail", by["context"]
    assert exit_code(checks) == 0


@pytest.mark.parametrize("kind", list(SERVERS))
async def test_the_writer_on_a_real_server_with_defaults(tmp_path: Path, kind: str) -> None:
    """25 messages (five lines, five times over with new details) in one segment."""
    settings = settings_for(tmp_path, kind)
    llm = build_llm(settings)
    assert isinstance(llm, OpenAICompatLLM)
    try:
        async with open_engine(settings, with_embedder=False) as engine:
            events = [
                msg(SCOPE, f"m{i}", who, f"{text} (round {i // len(LINES) + 1})", i)
                for i, (who, text) in enumerate(LINES * 5)
            ]
            await engine.ingest_many([*events, msg(SCOPE, "next", "Alice", "ok", 99)])
            outcomes = await Writer(engine, llm).flush_due()
    finally:
        await llm.aclose()
    print(outcomes, llm.stats, llm.profile)
    assert [o.status for o in outcomes] == ["committed"]
    assert outcomes[0].accepted >= 1, outcomes[0].rejected
    assert llm.stats.truncations == 0 or llm.context_tokens is not None
