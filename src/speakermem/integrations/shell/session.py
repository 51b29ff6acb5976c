"""Wiring for `speakermem shell` and `speakermem demo`: the same services `run` starts.

Store -> embedder -> pipeline/dispatcher -> Writer scheduler, then the shell adapter in
place of the network adapters; stop in reverse order, draining in-flight Writer work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.scheduler import WriterScheduler
from speakermem.bot.settings import Settings
from speakermem.integrations.app import open_engine, open_llm
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.ports import LLM
from speakermem.memory.query.pipeline import RecallPipeline
from speakermem.memory.writer.runner import Writer

DEMO_DB = Path("speakermem-demo.db")
"""Where the demo and the shell keep their store unless --db or SPEAKERMEM_DB_PATH says."""


def local_settings(settings: Settings) -> Settings:
    """The settings with the demo database when the user chose none."""
    if "db_path" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"db_path": DEMO_DB})


@dataclass
class LocalBot:
    """The services behind every adapter, as `speakermem run` builds them."""

    settings: Settings
    engine: MemoryEngine
    llm: LLM | None
    writer: Writer | None
    scheduler: WriterScheduler
    pipeline: RecallPipeline
    dispatcher: Dispatcher
    background: bool = False

    def start_background(self) -> None:
        """Embed new messages and run the Writer scheduler, as `run` does (idempotent)."""
        if self.background:
            return
        self.background = True
        self.engine.start_background_embedding()
        self.engine.start_background_interactions()
        self.scheduler.start()


@asynccontextmanager
async def local_bot(settings: Settings, *, background: bool = True) -> AsyncIterator[LocalBot]:
    """Open the store and start the scheduler and background embedding; stop them on exit."""
    async with open_llm(settings) as llm, open_engine(settings) as engine:
        writer = Writer(engine, llm) if llm is not None else None
        scheduler = WriterScheduler(
            engine, writer, idle_seconds=settings.session_gap_minutes * 60.0
        )
        pipeline = RecallPipeline(engine, llm=llm)
        dispatcher = Dispatcher(engine, pipeline, on_message_stored=scheduler.kick)
        bot = LocalBot(settings, engine, llm, writer, scheduler, pipeline, dispatcher)
        if background:
            bot.start_background()
        try:
            yield bot
        finally:
            await scheduler.shutdown()
            await engine.stop_background_embedding()
            await engine.stop_background_interactions()
