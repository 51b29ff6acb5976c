"""`speakermem run`: wire the store, embedder, LLM, Writer, scheduler and adapters; drain on stop.

Start order: store -> embedder -> pipeline (or recall processes)/dispatcher -> scheduler
(resumes pending segments) -> adapters. Stop order is the reverse, and SIGTERM/SIGINT
trigger it: adapters stop taking events, in-flight Writer flushes finish, then the
database closes cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.health import LLMHealth
from speakermem.bot.scheduler import WriterScheduler
from speakermem.bot.settings import Settings
from speakermem.bot.spill import Spill
from speakermem.integrations.app import llm_probe, open_engine, open_llm
from speakermem.integrations.ops.heap import fix_mmap_threshold, trim_every
from speakermem.integrations.ops.metrics import MeteredLLM, Metrics
from speakermem.integrations.ops.server import OpsServer
from speakermem.integrations.recall_processes import RecallProcesses
from speakermem.integrations.recall_scaling import AutoRecallProcesses
from speakermem.memory.console import ConsoleReads
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.ports import LLM
from speakermem.memory.query.pipeline import Recaller, RecallPipeline
from speakermem.memory.writer.runner import Writer

if TYPE_CHECKING:
    from speakermem.integrations.web.server import WebConsole

log = logging.getLogger(__name__)


class Adapter(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def wait_for_death(adapters: list[Adapter]) -> str:
    """Return (with the adapter's name) when an adapter that can end by itself ends.

    The caller then exits non-zero so a supervisor restarts the process instead of leaving a
    bot that is up but deaf.

    Adapters with a `wait_closed()` (the Discord gateway client) end only after `stop()` or a
    fatal error; those without one (Slack's HTTP server) never end on their own.
    """
    watchers: dict[asyncio.Task[object], str] = {}
    for adapter in adapters:
        wait_closed = getattr(adapter, "wait_closed", None)
        if wait_closed is not None:
            watchers[asyncio.ensure_future(wait_closed())] = type(adapter).__name__
    if not watchers:
        await asyncio.Event().wait()  # never: cancelled by the caller
    try:
        done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in watchers:
            task.cancel()
    task = next(iter(done))
    name = watchers[task]
    if task.cancelled():
        return name
    error = task.exception()
    if error is not None:
        log.error("%s: the platform connection ended: %r", name, error)
    else:
        log.error("%s: the platform connection ended without an error", name)
    return name


class NothingToRun(RuntimeError):
    """No platform is configured."""


def build_spill(settings: Settings) -> Spill:
    return Spill(settings.spill_file, settings.spill_max_bytes)


def build_dispatcher(
    settings: Settings,
    engine: MemoryEngine,
    recaller: Recaller,
    *,
    governance: Governance | None = None,
    on_message_stored: Callable[[], None] | None = None,
    on_recall: Callable[[float, str], None] | None = None,
) -> Dispatcher:
    """The bot's dispatcher: events a full store refuses wait in the spill, retried every
    `spill_retry_s`."""
    return Dispatcher(
        engine,
        recaller,
        on_message_stored=on_message_stored,
        on_recall=on_recall,
        governance=governance,
        spill=build_spill(settings),
        spill_retry_s=settings.spill_retry_s,
        ask_per_minute=settings.ask_per_minute,
    )


def configured_platforms(settings: Settings) -> list[str]:
    platforms = []
    if settings.slack_bot_token is not None and settings.slack_bot_token.get_secret_value():
        platforms.append("slack")
    if settings.discord_token is not None and settings.discord_token.get_secret_value():
        platforms.append("discord")
    return platforms


def build_adapters(settings: Settings, dispatcher: Dispatcher, engine: object) -> list[Adapter]:
    adapters: list[Adapter] = []
    for platform in configured_platforms(settings):
        if platform == "slack":
            from speakermem.integrations.slack.adapter import SlackAdapter

            adapters.append(SlackAdapter(settings, dispatcher, engine))  # type: ignore[arg-type]
        else:
            from speakermem.integrations.discord.adapter import DiscordAdapter

            adapters.append(DiscordAdapter(settings, dispatcher, engine))  # type: ignore[arg-type]
    return adapters


async def start_console(
    settings: Settings,
    engine: MemoryEngine,
    governance: Governance,
    recaller: Recaller,
    llm: LLM | None,
) -> WebConsole | None:
    """The web console on SPEAKERMEM_WEB_PORT beside the bot (None when unset), over the
    bot's own governance (one audit log) and recall path."""
    if settings.web_port is None:
        return None
    from speakermem.integrations.web.server import WebConsole

    probe = llm_probe(llm) if llm is not None else None
    console = WebConsole(
        settings,
        ConsoleReads(engine, llm_probe=probe),
        governance,
        recaller=recaller,
        port=settings.web_port,
        out=sys.stdout,
    )
    await console.start()
    return console


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns an exit code."""
    platforms = configured_platforms(settings)
    if not platforms:
        raise NothingToRun(
            "no platform configured: set SPEAKERMEM_SLACK_BOT_TOKEN (+ SIGNING_SECRET or "
            "APP_TOKEN) and/or SPEAKERMEM_DISCORD_TOKEN"
        )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with open_llm(settings) as llm:
        return await _serve(settings, platforms, stop, llm)


async def _serve(
    settings: Settings, platforms: list[str], stop: asyncio.Event, llm: LLM | None
) -> int:
    """`run` once its signals and LLM client are set up."""
    metrics = Metrics(
        prompt_price_per_mtok=settings.llm_prompt_price_per_mtok,
        completion_price_per_mtok=settings.llm_completion_price_per_mtok,
    )
    llm_health = LLMHealth(configured=llm is not None)
    writer_llm = answer_llm = None
    if llm is not None:
        writer_llm = MeteredLLM(llm, metrics, role="writer", health=llm_health)
        answer_llm = MeteredLLM(llm, metrics, role="answer", health=llm_health)
    exit_code = 0
    async with open_engine(settings) as engine:
        writer = Writer(engine, writer_llm) if writer_llm is not None else None
        governance = Governance(engine, llm_probe=llm_probe(llm) if llm is not None else None)
        scheduler = WriterScheduler(
            engine,
            writer,
            idle_seconds=settings.session_gap_minutes * 60.0,
            governance=governance,
            writer_mode=settings.writer_mode,
        )
        pipeline = RecallPipeline(engine, llm=answer_llm)
        recaller: Recaller = pipeline
        processes: RecallProcesses | AutoRecallProcesses | None = None
        if settings.recall_processes == "auto":
            processes = AutoRecallProcesses(
                settings,
                engine,
                fallback=pipeline,
                stored=lambda: dispatcher.stats.handled["message_stored"],
                answer_llm=answer_llm,
                factory=RecallProcesses,
            )
            recaller = processes
        elif settings.recall_processes > 0:
            processes = RecallProcesses(
                settings,
                engine,
                processes=settings.recall_processes,
                fallback=pipeline,
                answer_llm=answer_llm,
            )
            await processes.start()
            recaller = processes
        dispatcher = build_dispatcher(
            settings,
            engine,
            recaller,
            governance=governance,
            on_message_stored=scheduler.kick,
            on_recall=metrics.observe_recall,
        )
        if isinstance(processes, AutoRecallProcesses):
            processes.start()  # watches the dispatcher's stored count
        engine.start_background_embedding()
        warm_questions = getattr(engine.embedder, "warm_questions", None)
        if warm_questions is not None:  # the first /recall in this process need not wait
            warm_questions()
        engine.start_background_interactions()
        scheduler.start()
        await dispatcher.replay_spill()  # what a full disk left behind last run
        replayer = asyncio.create_task(dispatcher.replay_spill_every(dispatcher.spill_retry_s))
        # large blocks by mmap, freed heap back to the system each minute: ops/heap.py
        fix_mmap_threshold()
        trimmer = asyncio.create_task(trim_every(), name="speakermem-heap-trim")
        adapters = build_adapters(settings, dispatcher, engine)
        named = dict(zip(platforms, adapters, strict=True))
        metrics.watch(dispatcher, named)
        if writer is not None:
            metrics.watch_writer(writer)
        ops: OpsServer | None = None
        if settings.ops_port is not None:
            ops = OpsServer(
                engine,
                metrics,
                named,
                llm=writer_llm,
                spill=dispatcher.spill,
                host=settings.ops_host,
                port=settings.ops_port,
            )
            await ops.start()  # before the adapters: a probe sees 503 until they connect
        web = await start_console(settings, engine, governance, recaller, llm)
        started: list[Adapter] = []
        try:
            for adapter in adapters:
                await adapter.start()
                started.append(adapter)
            log.info(
                "speakermem running: %s; writer %s; store %s",
                ", ".join(platforms),
                "off (no LLM)" if writer is None else "on" if scheduler.writes_here else "workers",
                settings.db_path,
            )
            stopper = asyncio.ensure_future(stop.wait())
            death = asyncio.ensure_future(wait_for_death(started))
            try:
                await asyncio.wait({stopper, death}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                death.cancel()
            if not stop.is_set() and death.done() and not death.cancelled():
                exit_code = 1
                log.error("stopping: %s died; exiting with status 1", death.result())
            log.info("stopping: draining in-flight work")
        finally:
            for adapter in reversed(started):
                try:
                    await adapter.stop()
                except Exception:
                    log.exception("adapter stop failed")
            with contextlib.suppress(TimeoutError):  # a notice being posted may finish
                await asyncio.wait_for(dispatcher.drain_notices(), timeout=5.0)
            replayer.cancel()
            trimmer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replayer  # a replay cut short is finished next start (idempotent)
            if processes is not None:
                await processes.stop()
            await scheduler.shutdown()
            await engine.stop_background_embedding()
            await engine.stop_background_interactions()
            if ops is not None:
                await ops.stop()
            if web is not None:
                await web.stop()
    if exit_code:
        log.error("stopped after a platform connection failed (exit %d)", exit_code)
        return exit_code
    log.info("stopped cleanly")
    return 0
