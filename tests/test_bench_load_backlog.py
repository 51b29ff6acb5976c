"""bench/bench_load.py's Writer backlog verdict: bounded after the first minute or not."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_load  # noqa: E402


def timeline(queue: list[int], step: int = 5) -> list[dict[str, float]]:
    return [
        {"t_s": i * step, "writer_queue": q, "writer_oldest_s": q / 8, "writer_concurrency": 8}
        for i, q in enumerate(queue)
    ]


def test_a_backlog_that_keeps_growing_is_not_bounded() -> None:
    growing = timeline([40 * i for i in range(30)])  # 8 segments/s in, 0 out
    verdict = bench_load.writer_backlog(growing, traffic_s=150)
    assert verdict["bounded"] is False and verdict["slope_segments_per_min"] > 400


def test_a_sawtooth_under_the_first_minutes_peak_is_bounded() -> None:
    ramp = [0, 40, 80, 114, 88, 14, 36, 21, 27, 50, 50, 0]  # the first minute
    after = [0, 23, 44, 50, 0, 31, 48, 2, 40, 49]  # write runs empty it by fits and starts
    verdict = bench_load.writer_backlog(timeline(ramp + after), traffic_s=110)
    assert verdict["bounded"] is True
    assert verdict["first_minute_peak_segments"] == 114 and verdict["peak_segments"] == 50


def test_too_short_a_run_has_no_verdict() -> None:
    assert bench_load.writer_backlog(timeline([0, 10, 20]), traffic_s=15)["bounded"] is None
