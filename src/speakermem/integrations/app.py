"""The composition root: the one place that wires settings, store, embedder and LLM together."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.render import MigrationBars
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.ports import LLM, Embedder

log = logging.getLogger(__name__)


def build_embedder(settings: Settings, *, foreground: bool = False) -> Embedder | None:
    """The configured embedder, or None when embeddings are off. `foreground`: embedding
    is the command's own work (an import), so MiniLM's batch threads keep normal priority."""
    if settings.embedder == "none":
        return None
    if settings.embedder == "openai":
        from speakermem.integrations.embeddings.openai_compat import OpenAIEmbedder

        if not settings.embedding_base_url:
            raise ValueError(
                "SPEAKERMEM_EMBEDDER=openai needs SPEAKERMEM_EMBEDDING_BASE_URL (e.g. "
                "http://localhost:8000/v1)"
            )
        return OpenAIEmbedder(
            base_url=settings.embedding_base_url,
            api_key=settings.embedding_api_key.get_secret_value() or "not-needed",
            model=settings.embedding_model,
            dim=settings.embedding_dim,
        )
    if settings.embedder.startswith("onnx:"):
        from speakermem.integrations.embeddings.local_model import LocalModelEmbedder, model_dir_of

        return LocalModelEmbedder(
            model_dir_of(settings.embedder),
            cache_dir=settings.model_cache_dir,
            quantize=settings.embed_quantize,
            threads=settings.embed_threads,
        )
    from speakermem.integrations.embeddings.minilm import (
        BACKGROUND_NICE,
        MiniLMEmbedder,
        locate_model_dir,
    )

    # found now, so a missing install stops the command at once with the command that fixes
    # it, not after an import or at the first message
    return MiniLMEmbedder(
        model_dir=locate_model_dir(),
        cache_dir=settings.model_cache_dir,
        quantize=settings.embed_quantize,
        query_quantize=settings.embed_query_quantize,
        threads=settings.embed_threads,
        nice=0 if foreground else BACKGROUND_NICE,
    )


def build_llm(settings: Settings) -> LLM | None:
    """The configured LLM endpoint, or None: then every stage uses its deterministic fallback."""
    if not settings.llm_base_url:
        return None
    from speakermem.integrations.llm.openai_compat import OpenAICompatLLM

    return OpenAICompatLLM(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value(),
        model=settings.llm_model,
        timeout_s=settings.llm_timeout_s,
        structured_mode=settings.llm_structured_mode,
        max_retries=settings.llm_max_retries,
        context_tokens=settings.llm_context_tokens,
        thinking_tokens=settings.llm_thinking_tokens,
    )


@asynccontextmanager
async def open_llm(settings: Settings) -> AsyncIterator[LLM | None]:
    """`build_llm`'s client, closed on the way out: its HTTP connections end with the
    command, not at garbage collection on a loop that has already closed."""
    llm = build_llm(settings)
    try:
        yield llm
    finally:
        close = getattr(llm, "aclose", None)
        if close is not None:
            await close()


def llm_probe(llm: LLM) -> Callable[[], Awaitable[bool]]:
    """Whether the LLM endpoint answers (for `status`); never raises."""

    async def probe() -> bool:
        check = getattr(llm, "check", None)
        if check is None:
            return True
        return str(await check()).startswith("ok")

    return probe


async def start_engine(
    settings: Settings, embedder: Embedder | None, *, check_embedder: bool = True
) -> MemoryEngine:
    """The engine over the store the settings select (PostgreSQL when SPEAKERMEM_DB_URL is
    set, else the SQLite file), open; the caller closes it. Every process opens its engine
    here: nothing else in integrations/ or bot/ builds a store."""
    bars = MigrationBars()  # an upgrade that re-indexes the store shows its progress
    try:
        return await MemoryEngine.open(
            settings.memory_config(), embedder, progress=bars, check_embedder=check_embedder
        )
    finally:
        bars.close()


@asynccontextmanager
async def open_engine(
    settings: Settings,
    *,
    with_embedder: bool = True,
    foreground_embedding: bool = False,
    check_embedder: bool = True,
) -> AsyncIterator[MemoryEngine]:
    """`start_engine` with the configured embedder (or none), closed on the way out;
    `foreground_embedding` as in `build_embedder`."""
    embedder = build_embedder(settings, foreground=foreground_embedding) if with_embedder else None
    engine = await start_engine(settings, embedder, check_embedder=check_embedder)
    try:
        yield engine
    finally:
        await engine.close()
