"""Shared bits of the benchmark scripts: percentiles and a one-line machine description."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path

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
