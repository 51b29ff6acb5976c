"""`speakermem worker`: a Writer worker process (issue 13).

Any number of workers run beside the bot processes (`SPEAKERMEM_WRITER_MODE=workers`, so the
bots only close segments) and beside the LLM endpoint. Each round a worker claims segments
with a lease (`SegmentRepo.claim`: on PostgreSQL `FOR UPDATE SKIP LOCKED`, each the oldest
pending segment of its channel), writes them with the ordinary Writer and commits them; the
lease is renewed during long LLM calls. SIGTERM/SIGINT cancel the round in flight and release
its segments for the other workers; a worker killed outright holds its segments only until
their leases run out. The re-derivation queue (what a forgetting withdrew) is worked by one
worker at a time, under the store's cluster-wide job lock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speakermem.bot.settings import Settings
    from speakermem.memory.writer.runner import FlushOutcome, Writer

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 2.0
"""How long an idle worker waits before claiming again."""


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "worker",
        help="run a Writer worker: claim pending segments, write them, commit",
        description="Write pending segments through the configured LLM "
        "(SPEAKERMEM_LLM_BASE_URL) in a process of its own. Run any number of workers on one "
        "store (PostgreSQL: SPEAKERMEM_DB_URL) with SPEAKERMEM_WRITER_MODE=workers on the bot "
        "processes. Each segment is leased to one worker; a worker that dies loses its lease "
        "after --lease-s and another worker writes the segment. SIGTERM releases the "
        "segments in flight and exits.",
    )
    common(p)
    p.add_argument(
        "--id",
        default=None,
        help="worker id recorded on its claims (default: HOSTNAME-PID)",
    )
    p.add_argument(
        "--lease-s",
        type=float,
        default=None,
        help="lease on a claimed segment, renewed while it is written "
        "(default: $SPEAKERMEM_WRITER_LEASE_S, 120)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="segments (of different channels) written at once "
        "(default: $SPEAKERMEM_WRITER_CONCURRENCY)",
    )
    p.add_argument(
        "--poll-s",
        type=float,
        default=DEFAULT_POLL_S,
        help=f"wait between claims when nothing is pending (default {DEFAULT_POLL_S:g})",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="exit when nothing is left to claim instead of waiting for more",
    )
    p.set_defaults(handler="speakermem.integrations.cli.commands_worker:cmd_worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def work(
    writer: Writer,
    worker_id: str,
    *,
    lease_s: float,
    poll_s: float,
    once: bool,
    stop: asyncio.Event,
) -> Counter[str]:
    """Claim-write-commit rounds until `stop` is set (or, with `once`, nothing is left to
    claim); the outcomes counted by status. Setting `stop` cancels the round in flight,
    which releases its segments."""
    engine = writer.engine
    totals: Counter[str] = Counter()
    last_rederive = float("-inf")

    async def one_round() -> list[FlushOutcome]:
        nonlocal last_rederive
        # the re-derivation queue: one worker at a time, looked at every poll period
        if time.monotonic() - last_rederive >= poll_s:
            last_rederive = time.monotonic()
            async with engine.job_lock("rederive") as mine:
                if mine:
                    for outcome in await writer.rederive_due():
                        totals[f"rederive-{outcome.status}"] += 1
        return await writer.write_claimed(worker_id, lease_s=lease_s)

    while not stop.is_set():
        round_task = asyncio.ensure_future(one_round())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({round_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not round_task.done():  # stopping: give the segments in flight back
            writer.request_stop()
            round_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await round_task
            break
        try:
            outcomes = round_task.result()
        except Exception:  # the store failed (a restart, a full disk): try again later
            log.exception("worker %s: claim round failed", worker_id)
            outcomes = []
        totals.update(o.status for o in outcomes)
        if outcomes and not writer.paused:
            continue  # more may be claimable now (a channel's next segment)
        if once:
            break
        delay = poll_s
        if writer.paused:  # the endpoint failed: nothing is claimed before the breaker closes
            delay = max(poll_s, writer.paused_until - time.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
    return totals


async def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.integrations.app import open_engine, open_llm
    from speakermem.integrations.cli.errors import CliError
    from speakermem.integrations.cli.render import err_console
    from speakermem.memory.writer.runner import Writer

    if not settings.llm_configured:
        raise CliError(
            "no LLM configured: set SPEAKERMEM_LLM_BASE_URL (an OpenAI-compatible endpoint) "
            "and SPEAKERMEM_LLM_MODEL; a worker writes segments through it"
        )
    lease_s = settings.writer_lease_s if args.lease_s is None else args.lease_s
    if lease_s <= 0:
        raise CliError("--lease-s must be positive")
    if args.poll_s <= 0:
        raise CliError("--poll-s must be positive")
    cfg = settings.memory_config().writer
    if args.concurrency is not None:
        if not 1 <= args.concurrency <= 64:
            raise CliError("--concurrency must be between 1 and 64")
        cfg = cfg.model_copy(update={"concurrency": args.concurrency})
    worker_id = args.id or default_worker_id()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with open_llm(settings) as llm, open_engine(settings) as engine:
        assert llm is not None
        writer = Writer(engine, llm, cfg)
        log.info(
            "worker %s: writing segments of %s with %s (lease %g s, concurrency %d)",
            worker_id,
            engine.admin.location(),
            llm.model,
            lease_s,
            cfg.concurrency,
        )
        totals = await work(
            writer, worker_id, lease_s=lease_s, poll_s=args.poll_s, once=args.once, stop=stop
        )
        await writer.drain()
    summary = ", ".join(f"{n} {status}" for status, n in sorted(totals.items())) or "nothing"
    err_console.print(f"worker {worker_id}: {summary}", markup=False, highlight=False)
    return 0
