"""The machine a benchmark runs on, and what its processes use (CPU, memory), from /proc."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import threading
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPU, cores, OS, Python and the load averages now."""
    try:
        load = "load avg " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "load avg n/a"
    return (
        f"{cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, {load}"
    )


def host_info() -> dict[str, Any]:
    """The machine as JSON fields: cpu, cores, ram_gb, python, platform."""
    cpu = "unknown"
    ram_gb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def loadavg() -> float | None:
    """The 1-minute load average (None where /proc has none)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def loadavg_text() -> str:
    """'1.02 0.80 0.75': the 1-, 5- and 15-minute load averages."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ---- memory


def rss_mb(pid: int | str = "self") -> float | None:
    """A process's resident memory (VmRSS) in MB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def own_rss_mb() -> float:
    """This process's resident memory in MB (NaN where /proc has none)."""
    mb = rss_mb()
    return float("nan") if mb is None else mb


def maxrss_mb() -> float:
    """This process's peak resident memory so far (getrusage), in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class RssSampler:
    """Samples VmRSS every `interval` seconds on a thread; `.peak` is the highest seen."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, own_rss_mb())
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, own_rss_mb())


# ---- CPU


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a live process has used (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent not idle (from /proc/stat)."""
    parts = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in parts]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / CLK_TCK


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (a bot and its recall processes), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree.extend(frontier)
    return tree


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and its live children (a child's own, while it runs)."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(cpu_seconds(c) or 0.0 for c in process_tree(pid)[1:])


def tree_rss_mb(pid: int) -> float | None:
    """RSS of a process plus its children's (a bot's recall processes are its memory too)."""
    own = rss_mb(pid)
    if own is None:
        return None
    return own + sum(rss_mb(c) or 0.0 for c in process_tree(pid)[1:])


def drop_page_cache() -> bool:
    """Write dirty pages out and drop the kernel's page cache (root only), so the next
    reads of every file come from the disk. False where not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True
