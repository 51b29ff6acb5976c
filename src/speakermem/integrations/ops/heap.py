"""Keep glibc's heap small: hand free pages back once a minute (`malloc_trim`), keep large
blocks out of the heap (`mallopt(M_MMAP_THRESHOLD)`), and few arenas in the recall
processes (`mallopt(M_ARENA_MAX)`).

glibc keeps memory freed by the bot's threads (SQLite readers, ONNX Runtime, executors) in
their malloc arenas, resident. Under steady traffic (bench/bench_load.py) each minute's trim
gave back 7-8 MB of the bot process's RSS that it would otherwise have kept.

glibc also gives each new thread its own arena (up to 8 per core), and a recall process's
SQLite reader threads each grow one as the channels they read grow. A recall process runs
one recall at a time, so its threads hardly contend for two arenas: capped at
`RECALL_ARENAS`, each recall process kept ~6 MB less and stopped rising sooner (bench_load,
MiniLM, two recall processes, 5 minutes). The bot process is not capped: its ingestion,
embedding and recall threads do contend, and capping it raised /recall p50 from 83 to 110
ms when recalls ran there. An operator's own MALLOC_ARENA_MAX wins over the cap.

glibc serves a block of 128 KiB or more with its own mmap, returned to the system when
freed, but each such free raises that threshold to the freed size (up to 32 MiB). After the
embedder's and numpy's first large temporaries, they come from the heap instead, where
they leave holes that later small blocks pin: under steady traffic (bench_load, MiniLM)
the bot's heap grew 129 -> 135 MB over minutes 2-5 while what it held rose 0.7 MB (glibc's
mallinfo2). With the threshold fixed at its initial value: 49.1 -> 49.5 MB. An operator's
MALLOC_MMAP_THRESHOLD_ wins.
All of it is a no-op off glibc (musl, macOS).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from functools import cache

TRIM_EVERY_S = 60.0
RECALL_ARENAS = 2
MMAP_THRESHOLD = 128 * 1024
"""glibc's initial threshold, kept (see the module's docstring)."""
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
"""mallopt's parameter numbers (glibc's malloc.h)."""


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc has it, musl does not
    except (OSError, AttributeError):
        return None
    return libc


def _mallopt(param: int, value: int, *, unless: str) -> bool:
    """Set a glibc malloc parameter, unless the operator's environment variable `unless`
    (glibc's own name for it) already chose. False off glibc or when not set."""
    libc = _glibc()
    if libc is None or os.environ.get(unless):
        return False
    return bool(libc.mallopt(param, value))


MALLINFO2_FIELDS = (
    *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
    *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
)
"""glibc's `struct mallinfo2` (2.33+), in order: ten size_t counters."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def mallinfo() -> dict[str, int] | None:
    """glibc's heap counters (`mallinfo2`) in bytes, by glibc's field names; None off glibc
    or before 2.33. For measuring the heap (bench_load --heap-log, tests)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {name: getattr(info, name) for name in MALLINFO2_FIELDS}


def trim() -> bool:
    """Hand free heap pages back to the system (`malloc_trim(0)`). True if any were."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def limit_arenas(arenas: int) -> bool:
    """Let threads started from now on share at most `arenas` malloc arenas; call it
    before the process starts its threads. False off glibc, or when the environment's
    MALLOC_ARENA_MAX already chose."""
    return _mallopt(M_ARENA_MAX, arenas, unless="MALLOC_ARENA_MAX")


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve blocks of `nbytes` or more by mmap from now on, whatever is freed later. False
    off glibc, or when the environment's MALLOC_MMAP_THRESHOLD_ already chose."""
    return _mallopt(M_MMAP_THRESHOLD, nbytes, unless="MALLOC_MMAP_THRESHOLD_")


async def trim_every(seconds: float = TRIM_EVERY_S) -> None:
    """Trim in a thread every `seconds` (it walks the heap) until cancelled."""
    if _glibc() is None:
        return
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim)
