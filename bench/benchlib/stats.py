"""Percentiles and latency summaries of timing samples."""

from __future__ import annotations

from collections.abc import Sequence

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


def percentile(values: Sequence[float], q: float, empty: float = 0.0) -> float:
    """The q-th percentile (0-100) of `values`; `empty` for an empty sample."""
    if not len(values):
        return empty
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def latency_summary(ms: Sequence[float]) -> dict[str, float]:
    """n, p50/p95/p99 and max of millisecond timings, rounded to 0.01 ms (NaN when empty)."""
    nan = float("nan")
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50, nan), 2),
        "p95_ms": round(percentile(ms, 95, nan), 2),
        "p99_ms": round(percentile(ms, 99, nan), 2),
        "max_ms": round(max(ms), 2) if ms else nan,
    }
