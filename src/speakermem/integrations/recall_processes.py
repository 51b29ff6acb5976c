"""/recall in worker processes, so that a busy bot's ingestion and recalls stop sharing one
interpreter.

In one process, the platform connections, message storage and every /recall share the
event loop and the interpreter lock; under steady traffic each of a recall's ~25 store
reads waits for that lock twice (its reader thread starting, its result coming back), and
recalls slow down several-fold although cores are idle (bench/bench_load.py). With
`SPEAKERMEM_RECALL_PROCESSES=N` the bot starts N spawned processes; each opens the same
store, embedder and LLM endpoint and runs whole recalls sent over a pipe (the least busy
child gets the next one): one computes at a time, others run while it waits on the LLM.

What a recall needs is in the store (rosters, channel switches, records), which several
processes already share safely (PostgreSQL workers, the CLI beside the bot), and recall
only reads: its inline interaction-graph catch-up is off in the children because the bot's
own background worker keeps the graph current. LLM calls made in a child are handed back
with its answer and counted by the bot's own metrics and health.

A child that dies (killed, out of memory) costs nothing but time: the recalls it was running
are answered in the bot process, and a new child replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_embedder, build_llm, start_engine
from speakermem.integrations.ops.heap import (
    RECALL_ARENAS,
    fix_mmap_threshold,
    limit_arenas,
    trim_every,
)
from speakermem.integrations.ops.logs import configure_logging
from speakermem.integrations.ops.metrics import LLMCall, MeteredLLM
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.ports import LLM, LLMResult
from speakermem.memory.query.pipeline import Recaller, RecallPipeline, RecallRequest, RecallResult

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
"""A child opens the store and loads its embedder (MiniLM: seconds) before it is ready."""
STOP_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- the child process

_CALLS: contextvars.ContextVar[list[LLMCall]] = contextvars.ContextVar("recall_llm_calls")
"""The LLM calls of the recall running in this task (a child runs several at once)."""


class _Turn:
    """A child computes one recall at a time; one waiting on the LLM gives its turn away.

    On a busy machine recalls are CPU-bound, and interleaving them in one interpreter only
    made each slower (bench_load, MiniLM, two children: /recall p50 129 ms one at a time,
    157 ms interleaved); but a recall waiting seconds for an answer model must not hold
    the others up."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._lock:
            yield

    @contextlib.asynccontextmanager
    async def given_away(self) -> AsyncIterator[None]:
        """Inside `held`: let another recall compute meanwhile."""
        self._lock.release()
        try:
            yield
        finally:
            await self._lock.acquire()


class _TurnLLM(MeteredLLM):
    """A child's answer LLM: metered, and each call gives the recall's turn away while it
    waits (the turn is held by `_answer` around the whole recall)."""

    def __init__(self, inner: LLM, turn: _Turn) -> None:
        super().__init__(inner, None, role="answer", on_call=lambda c: _CALLS.get().append(c))
        self.turn = turn

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> LLMResult:
        async with self.turn.given_away():
            return await super()._call(fn, *args, **kwargs)


@dataclass
class _ChildState:
    engine: MemoryEngine
    pipeline: RecallPipeline
    turn: _Turn


async def _open_child(settings: Settings, answer_llm: bool) -> _ChildState:
    embedder = build_embedder(settings)
    # a local model: loaded before "ready", not in the first recall; only what questions
    # need (a recall process embeds no messages)
    load = getattr(embedder, "load_questions", None) or getattr(embedder, "load", None)
    if load is not None:
        load()
    engine = await start_engine(settings, embedder)
    llm = build_llm(settings) if answer_llm else None
    turn = _Turn()
    answers = _TurnLLM(llm, turn) if llm else None
    # the bot's background worker keeps the interaction graph: recall here only reads
    config = engine.config.recall.model_copy(update={"interaction_catchup": 0})
    return _ChildState(engine, RecallPipeline(engine, llm=answers, config=config), turn)


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def serve(conn: Connection, settings: Settings, answer_llm: bool, log_level: str) -> None:
    """A recall process's main. The first message it sends is ("ready", pid) or ("failed",
    reason); then it answers each `(id, request, answer)` with `(id, "ok", RecallResult,
    calls)` or `(id, "error", exception, calls)` until None or EOF, finishing the recalls
    it has started before it exits."""
    # Ctrl-C reaches the whole process group; the bot decides when its children stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_arenas(RECALL_ARENAS)  # before the store's and the embedder's threads
    fix_mmap_threshold()
    configure_logging(log_level, settings.log_format)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        state = loop.run_until_complete(_open_child(settings, answer_llm))
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        loop.close()
        return
    conn.send(("ready", os.getpid()))
    try:
        loop.run_until_complete(_serve(conn, state))
    finally:
        loop.run_until_complete(state.engine.close())
        loop.close()


async def _serve(conn: Connection, state: _ChildState) -> None:
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()
    running: set[asyncio.Task[None]] = set()

    def readable() -> None:
        try:
            while conn.poll():
                message = conn.recv()
                if message is None:
                    raise EOFError
                task = loop.create_task(_answer(conn, state, *message))
                running.add(task)
                task.add_done_callback(running.discard)
        except (EOFError, OSError):  # stop asked, or the bot is gone
            loop.remove_reader(conn.fileno())
            closed.set()

    loop.add_reader(conn.fileno(), readable)
    trimmer = asyncio.create_task(trim_every())
    await closed.wait()
    trimmer.cancel()
    while running:
        await asyncio.gather(*running, return_exceptions=True)


async def _answer(
    conn: Connection, state: _ChildState, rid: int, request: RecallRequest, answer: bool
) -> None:
    calls: list[LLMCall] = []
    _CALLS.set(calls)  # this task's own context
    try:
        async with state.turn.held():
            result = await state.pipeline.run(request, answer=answer)
        reply: tuple[int, str, Any, list[LLMCall]] = (rid, "ok", result, calls)
    except Exception as exc:
        reply = (rid, "error", _picklable(exc), calls)
    try:
        conn.send(reply)  # pickled whole before a byte is written
    except OSError:  # the bot is gone: nobody is waiting
        return
    except Exception as exc:  # the answer would not pickle: the asker still gets a reply
        failed = RuntimeError(f"the recall's result could not be sent: {type(exc).__name__}")
        with contextlib.suppress(OSError):
            conn.send((rid, "error", failed, calls))


# ---------------------------------------------------------------- the bot's side


class ChildDied(RuntimeError):
    """The recall process running a recall exited before answering it."""


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    conn: Connection
    pending: dict[int, asyncio.Future[tuple[str, Any, list[LLMCall]]]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None


class RecallProcesses:
    """N recall processes behind the `Recaller` port; the Dispatcher cannot tell the
    difference. Each recall goes to the child with the fewest running; with no child left
    (they could not start again) recalls run in `fallback`, the bot's own pipeline."""

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
        self._ids = itertools.count(1)
        self._stopping = False
        self._respawns: set[asyncio.Task[None]] = set()
        # a thread per child waits for its replies (not the loop's shared default pool);
        # a replaced child's thread ends with its pipe
        self._waits = ThreadPoolExecutor(2 * processes, thread_name_prefix="speakermem-recall")
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
                self._adopt(child)
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

    def _adopt(self, child: _Child) -> None:
        self._children.add(child)
        child.reader = asyncio.create_task(self._read(child), name="speakermem-recall-replies")

    async def _read(self, child: _Child) -> None:
        """Hand each reply to its waiting recall; on EOF the child is gone."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                rid, kind, payload, calls = await loop.run_in_executor(self._waits, child.conn.recv)
            except (EOFError, OSError):
                break
            waiter = child.pending.pop(rid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result((kind, payload, calls))
        self._lost(child)

    async def run(self, req: RecallRequest, *, answer: bool = True) -> RecallResult:
        child = self._pick()
        if child is None:
            return await self.fallback.run(req, answer=answer)
        rid = next(self._ids)
        waiter = asyncio.get_running_loop().create_future()
        child.pending[rid] = waiter
        async with self.engine.foreground.serving():  # the bot's background embedding yields
            try:
                child.conn.send((rid, req, answer))
                kind, payload, calls = await waiter
            except (ChildDied, OSError):
                log.error(
                    "recall process %s died during a recall; answering it here",
                    child.process.pid,
                )
                self._lost(child)
                return await self.fallback.run(req, answer=answer)
            finally:
                child.pending.pop(rid, None)
        if self.answer_llm is not None:
            for call in calls:
                self.answer_llm.observe(call)
        if kind == "error":
            raise payload
        result: RecallResult = payload
        return result

    def _pick(self) -> _Child | None:
        if self._stopping or not self._children:
            return None
        return min(self._children, key=lambda c: len(c.pending))

    def _lost(self, child: _Child) -> None:
        """A child is gone (or its pipe broke): fail its recalls over and replace it."""
        if child not in self._children:
            return
        self._children.discard(child)
        for waiter in child.pending.values():
            if not waiter.done():
                waiter.set_exception(ChildDied(f"recall process {child.process.pid} exited"))
        child.pending.clear()
        self._kill(child)
        if self._stopping:
            return
        log.error("recall process %s exited; starting a new one", child.process.pid)
        task = asyncio.create_task(self._respawn(), name="speakermem-recall-respawn")
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self) -> None:
        try:
            child = await self._spawn()
        except Exception as exc:
            log.error(
                "a recall process could not be restarted (%s); %d left%s",
                exc,
                len(self._children),
                "" if self._children else ": recalls run in the bot process",
            )
            return
        if self._stopping:
            self._kill(child)
            return
        self.replaced += 1
        self._adopt(child)

    @staticmethod
    def _kill(child: _Child) -> None:
        with contextlib.suppress(OSError):
            child.conn.close()
        if child.process.is_alive():
            child.process.kill()
        child.process.join(timeout=5)

    async def stop(self) -> None:
        """Ask each child to finish the recalls it has and exit (the adapters have stopped
        taking new ones); one that has not exited after STOP_TIMEOUT_S is killed."""
        self._stopping = True
        for task in list(self._respawns):
            task.cancel()
        children = list(self._children)
        for child in children:
            with contextlib.suppress(OSError):
                child.conn.send(None)
        await asyncio.gather(*(self._join(c) for c in children))
        self._children.clear()
        self._waits.shutdown(wait=False, cancel_futures=True)

    async def _join(self, child: _Child) -> None:
        await asyncio.to_thread(child.process.join, STOP_TIMEOUT_S)
        if child.process.is_alive():
            log.warning("recall process %s did not stop; killing it", child.process.pid)
        if child.reader is not None:  # the last replies are in; EOF ends it
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(child.reader, 5)
        for waiter in child.pending.values():
            if not waiter.done():
                waiter.set_exception(ChildDied(f"recall process {child.process.pid} stopped"))
        self._kill(child)
