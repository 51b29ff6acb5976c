"""integrations.ops.heap: the heap trim, measured in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from speakermem.integrations.ops import heap

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(heap._glibc() is None, reason="needs glibc")

# Threads allocate and free 18 MB of small blocks each; what stays resident afterwards is
# what glibc's arenas keep.
PROBE = textwrap.dedent(
    """
    import sys, threading
    from speakermem.integrations.ops import heap
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    pins = []
    def churn():
        keep = [bytes(600) for _ in range(30_000)]
        # a live block above the freed ones: glibc cannot give them back by shrinking
        # the heap's top on its own, only a trim can
        pins.append(bytes(600))
        del keep
    before = rss()
    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    kept = rss() - before
    heap.trim()
    print(kept, rss() - before)
    """
)


def fresh_process(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter whose glibc has no malloc settings from us."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_")
    }
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def run_probe() -> tuple[int, int]:
    out = fresh_process(PROBE).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.e2e
def test_trim_hands_back_what_threads_freed() -> None:
    kept, after_trim = run_probe()
    assert kept >= 20, kept  # glibc kept the freed blocks resident...
    assert after_trim < kept / 2, (kept, after_trim)  # ...until the trim


# Eight threads hold blocks at once, then glibc lists its arenas (malloc_stats, on stderr).
ARENAS_PROBE = textwrap.dedent(
    """
    import sys, threading
    from speakermem.integrations.ops import heap
    if sys.argv[1] == "cap":
        assert heap.limit_arenas(2)
    together = threading.Barrier(8)
    def hold():
        keep = [bytes(600) for _ in range(1_000)]
        together.wait()
        del keep
    threads = [threading.Thread(target=hold) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    heap._glibc().malloc_stats()
    """
)


def count_arenas(mode: str) -> int:
    err = fresh_process(ARENAS_PROBE, mode).stderr
    return sum(line.startswith("Arena ") for line in err.splitlines())


@pytest.mark.e2e
def test_limit_arenas_caps_the_arenas_of_threads_started_after_it() -> None:
    assert count_arenas("free") >= 5  # each thread got its own
    assert 1 <= count_arenas("cap") <= 2


def test_an_operators_malloc_arena_max_wins_over_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert heap.limit_arenas(2) is False


# A large block is freed (glibc then raises its mmap threshold to that size); then 16 blocks
# of 512 KiB are allocated, and glibc counts how many of them it mapped on their own.
MMAP_PROBE = textwrap.dedent(
    """
    import sys
    from speakermem.integrations.ops import heap
    if sys.argv[1] == "fixed":
        assert heap.fix_mmap_threshold()
    big = bytearray(4 << 20)
    del big
    before = heap.mallinfo()["hblks"]
    keep = [bytearray(512 << 10) for _ in range(16)]
    print(heap.mallinfo()["hblks"] - before)
    """
)


def mapped_blocks(mode: str) -> int:
    return int(fresh_process(MMAP_PROBE, mode).stdout)


@pytest.mark.e2e
@pytest.mark.skipif(heap.mallinfo() is None, reason="needs glibc 2.33+ (mallinfo2)")
def test_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap() -> None:
    assert mapped_blocks("free") == 0  # the freed 4 MiB block raised glibc's threshold
    assert mapped_blocks("fixed") == 16


def test_an_operators_mmap_threshold_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert heap.fix_mmap_threshold() is False
