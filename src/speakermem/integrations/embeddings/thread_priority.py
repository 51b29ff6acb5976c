"""The background embedding threads' CPU priority: Linux's idle scheduling class, so a
/recall, ingestion and the event loop never wait for them."""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)

BACKGROUND_NICE = 10
"""How much nicer than the process the background embedding threads run where the idle
scheduling class is refused (`lower_thread_priority`): about a tenth of a normal thread's
share of a full core."""


def lower_thread_priority(increment: int = BACKGROUND_NICE) -> None:
    """Put the calling thread in Linux's idle scheduling class (SCHED_IDLE): it runs only
    on a core that no other thread wants, so a /recall, ingestion and the event loop never
    wait for it, and it still uses every idle moment. Where that is refused, raise its nice
    value by `increment` (at most to 19). On Linux a thread id names one thread, so only
    this thread yields; elsewhere the same calls would change the whole process: left
    alone. An `increment` of 0 leaves the thread as it is (an import's embedding)."""
    if sys.platform != "linux" or increment <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    except OSError as exc:
        logger.debug("no idle scheduling class for the embedding thread: %s", exc)
    try:
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment)
        )
    except OSError as exc:  # a sandbox may forbid it; the work still runs, at normal priority
        logger.debug("cannot lower the embedding thread's priority: %s", exc)
