"""/recall in worker processes, so that a busy bot's ingestion and recalls stop sharing one
interpreter.

In one process, the platform connections, message storage and every /recall share the
event loop and the interpreter lock; under steady traffic each of a recall's ~25 store
reads waits for that lock twice (its reader thread starting, its result coming back), and
recalls slow down several-fold although cores are idle (bench/bench_load.py). With
`SPEAKERMEM_RECALL_PROCESSES=N` the bot starts N spawned processes; each opens the same
store, embedder and LLM endpoint and runs whole recalls, one at a time, sent over a pipe.

What a recall needs is in the store (rosters, channel switches, records), which several
processes already share safely (PostgreSQL workers, the CLI beside the bot), and recall
only reads: its inline interaction-graph catch-up is off in the children because the bot's
own background worker keeps the graph current. LLM calls made in a child are handed back
with its answer and counted by the bot's own metrics and health.

A child that dies (killed, out of memory) costs nothing but time: the recall it was running
is answered in the bot process, and a new child replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bot.settings import Settings
from integrations.app import build_embedder, build_llm
from integrations.ops.logs import configure_logging
from integrations.ops.metrics import LLMCall, MeteredLLM
from memory.engine import MemoryEngine
from memory.query.pipeline import Recaller, RecallPipeline, RecallRequest, RecallResult

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
"""A child opens the store and loads its embedder (MiniLM: seconds) before it is ready."""
STOP_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- the child process


@dataclass
class _ChildState:
    loop: asyncio.AbstractEventLoop
    engine: MemoryEngine
    pipeline: RecallPipeline
    calls: list[LLMCall] = field(default_factory=list)


def _open_child(settings: Settings, answer_llm: bool) -> _ChildState:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    embedder = build_embedder(settings)
    load = getattr(embedder, "load", None)
    if load is not None:  # a local model: loaded before "ready", not in the first recall
        load()
    engine = loop.run_until_complete(MemoryEngine.open(settings.memory_config(), embedder))
    calls: list[LLMCall] = []
    llm = build_llm(settings) if answer_llm else None
    metered = MeteredLLM(llm, None, role="answer", on_call=calls.append) if llm else None
    # the bot's background worker keeps the interaction graph: recall here only reads
    config = engine.config.recall.model_copy(update={"interaction_catchup": 0})
    return _ChildState(loop, engine, RecallPipeline(engine, llm=metered, config=config), calls)


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def serve(conn: Connection, settings: Settings, answer_llm: bool, log_level: str) -> None:
    """A recall process's main: answer `(request, answer)` messages until None or EOF.

    Replies are ("ok", RecallResult, calls) or ("error", exception, calls); the first
    message is ("ready", pid) or ("failed", reason)."""
    # Ctrl-C reaches the whole process group; the bot decides when its children stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level, settings.log_format)
    try:
        state = _open_child(settings, answer_llm)
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the bot is gone
                break
            if message is None:
                break
            request, answer = message
            state.calls.clear()
            try:
                result = state.loop.run_until_complete(state.pipeline.run(request, answer=answer))
                reply: tuple[str, Any, list[LLMCall]] = ("ok", result, list(state.calls))
            except Exception as exc:
                reply = ("error", _picklable(exc), list(state.calls))
            try:
                conn.send(reply)
            except (BrokenPipeError, EOFError, OSError):
                break
    finally:
        state.loop.run_until_complete(state.engine.close())
        state.loop.close()


# ---------------------------------------------------------------- the bot's side


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    conn: Connection


class RecallProcesses:
    """N recall processes behind the `Recaller` port; the Dispatcher cannot tell the
    difference. Recalls queue for an idle child; with no child left (they could not start
    again) they run in `fallback`, the bot's own pipeline."""

    def __init__(
        self,
        settings: Settings,
        engine: MemoryEngine,
        *,
        processes: int,
        fallback: Recaller,
        answer_llm: MeteredLLM | None = None,
    ) -> None:
        """`answer_llm`: the bot's metered answer LLM, or None for extractive answers. The
        children call the same endpoint; their calls are counted on this wrapper."""
        if processes < 1:
            raise ValueError("RecallProcesses needs at least one process")
        self.settings = settings
        self.engine = engine
        self.processes = processes
        self.fallback = fallback
        self.answer_llm = answer_llm
        self._ctx = multiprocessing.get_context("spawn")
        self._children: set[_Child] = set()
        self._idle: asyncio.Queue[_Child | None] = asyncio.Queue()
        self._stopping = False
        self._respawns: set[asyncio.Task[None]] = set()
        # one thread per child waits for its reply (not the loop's shared default pool)
        self._waits = ThreadPoolExecutor(processes, thread_name_prefix="speakermem-recall")
        self.replaced = 0
        """Children that died and were replaced (tests, logs)."""

    @property
    def pids(self) -> list[int]:
        return sorted(c.process.pid for c in self._children if c.process.pid is not None)

    async def start(self) -> None:
        """Start every child and wait until each has opened the store; raises with the
        child's reason when one cannot."""
        children = await asyncio.gather(
            *(self._spawn() for _ in range(self.processes)), return_exceptions=True
        )
        failed = [c for c in children if isinstance(c, BaseException)]
        for child in children:
            if isinstance(child, _Child):
                self._children.add(child)
                self._idle.put_nowait(child)
        if failed:
            await self.stop()
            raise RuntimeError(f"a recall process could not start: {failed[0]}")
        log.info("recall runs in %d processes (pids %s)", self.processes, self.pids)

    async def _spawn(self) -> _Child:
        ours, theirs = self._ctx.Pipe()
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        process = self._ctx.Process(
            target=serve,
            args=(theirs, self.settings, self.answer_llm is not None, level),
            name="speakermem-recall",
            daemon=True,  # never outlives the bot, even one that skipped its stop()
        )
        process.start()
        theirs.close()
        child = _Child(process, ours)
        try:
            kind, detail = await asyncio.wait_for(asyncio.to_thread(ours.recv), START_TIMEOUT_S)
        except (EOFError, OSError, TimeoutError) as exc:
            self._kill(child)
            raise RuntimeError(f"it exited before it was ready ({type(exc).__name__})") from exc
        if kind != "ready":
            self._kill(child)
            raise RuntimeError(str(detail))
        return child

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        child = await self._idle.get() if self._children and not self._stopping else None
        if child is None:
            if self._stopping or not self._children:
                self._idle.put_nowait(None)  # wake the next waiter too
            return await self.fallback.run(req, answer=answer)
        async with self.engine.foreground.serving():  # the bot's background embedding yields
            try:
                child.conn.send((req, answer))
            except OSError:
                return await self._died(child, req, answer)
            loop = asyncio.get_running_loop()
            reply = loop.run_in_executor(self._waits, child.conn.recv)
            try:
                kind, payload, calls = await asyncio.shield(reply)
            except asyncio.CancelledError:
                # the reply still comes: the child is idle again only once it is read
                reply.add_done_callback(lambda f: self._release(child, f))
                raise
            except (EOFError, OSError):
                return await self._died(child, req, answer)
        self._idle.put_nowait(child)
        if self.answer_llm is not None:
            for call in calls:
                self.answer_llm.observe(call)
        if kind == "error":
            raise payload
        result: RecallResult = payload
        return result

    async def _died(self, child: _Child, req: RecallRequest, answer: bool) -> RecallResult:
        log.error(
            "recall process %s died during a recall; answering it here and starting a new one",
            child.process.pid,
        )
        self._replace(child)
        return await self.fallback.run(req, answer=answer)

    def _release(self, child: _Child, reply: asyncio.Future[Any]) -> None:
        if reply.cancelled() or reply.exception() is not None:
            self._replace(child)
        else:
            self._idle.put_nowait(child)

    def _replace(self, child: _Child) -> None:
        self._children.discard(child)
        self._kill(child)
        if self._stopping:
            return
        task = asyncio.create_task(self._respawn(), name="speakermem-recall-respawn")
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self) -> None:
        try:
            child = await self._spawn()
        except Exception as exc:
            log.error(
                "a recall process could not be restarted (%s); %d left", exc, len(self._children)
            )
            if not self._children:
                self._idle.put_nowait(None)  # recalls run in the bot process from now on
            return
        if self._stopping:
            self._kill(child)
            return
        self.replaced += 1
        self._children.add(child)
        self._idle.put_nowait(child)

    @staticmethod
    def _kill(child: _Child) -> None:
        with contextlib.suppress(OSError):
            child.conn.close()
        if child.process.is_alive():
            child.process.kill()
        child.process.join(timeout=5)

    async def stop(self) -> None:
        """Let running recalls finish (the adapters have stopped taking new ones), then ask
        each child to close its store and exit; one that does not is killed."""
        self._stopping = True
        for task in list(self._respawns):
            task.cancel()
        waiting: list[_Child] = []
        deadline = asyncio.get_running_loop().time() + STOP_TIMEOUT_S
        while len(waiting) < len(self._children):
            left = deadline - asyncio.get_running_loop().time()
            try:
                child = await asyncio.wait_for(self._idle.get(), max(left, 0.0))
            except TimeoutError:
                break
            if child is not None:
                waiting.append(child)
        for child in self._children:
            with contextlib.suppress(OSError):
                if child in waiting:
                    child.conn.send(None)
        await asyncio.gather(*(self._join(c) for c in self._children))
        self._children.clear()
        self._waits.shutdown(wait=False, cancel_futures=True)

    async def _join(self, child: _Child) -> None:
        await asyncio.to_thread(child.process.join, STOP_TIMEOUT_S)
        if child.process.is_alive():
            log.warning("recall process %s did not stop; killing it", child.process.pid)
        self._kill(child)
