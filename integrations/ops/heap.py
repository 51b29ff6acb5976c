"""Hand the heap's free pages back to the system once a minute (glibc's `malloc_trim`).

glibc keeps memory freed by the bot's threads (SQLite readers, ONNX Runtime, executors) in
their malloc arenas, resident. Under steady traffic (bench/bench_load.py) each minute's trim
gave back 7-8 MB of the bot process's RSS that it would otherwise have kept. A no-op off
glibc (musl, macOS). Capping the arenas instead (MALLOC_ARENA_MAX=2) was tried: RSS rose
less, but /recall p50 was 110 ms against 83 under that load, so it is left to operators.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from functools import cache

TRIM_EVERY_S = 60.0


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


def trim() -> bool:
    """Hand free heap pages back to the system (`malloc_trim(0)`). True if any were."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


async def trim_every(seconds: float = TRIM_EVERY_S) -> None:
    """Trim in a thread every `seconds` (it walks the heap) until cancelled."""
    if _glibc() is None:
        return
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim)
