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


def test_a_load_run_becomes_the_row_load_md_renders() -> None:
    import benchmark_docs

    rss = {0: 100.0, 60: 500.0, 121: 510.0, 181: 515.5, 241: 517.0, 301: 520.04}
    run = {
        "embedder": "minilm",
        "recall_processes": "auto",
        "llm_latency_s": 1.0,
        "sent": 100,
        "found": 99,
        "rows": 100,
        "recall_ms": {"p50": 60.6, "p95": 144.5, "p99": 241.27, "n": 7},
        "lag_ms": {"p50": 0.87, "p99": 10.96, "max": 156.94},
        "timeline": [{"t_s": t, "rss_mb": mb} for t, mb in rss.items()],
        "rss_slope_mb_min_last3": 0.84,
        "bot_stop_s": 1.2,
        "bot_exit": 0,
        "writer_backlog": {"bounded": True},
        "segments": {"segments_pending": 3},
    }
    row = benchmark_docs.load_row(run, "defaults", "python bench/bench_load.py")
    assert row["recall_ms"] == {"p50": 61, "p95": 144, "p99": 241, "n": 7}
    assert row["lag_ms"] == {"p50": 0.9, "p99": 11.0, "max": 156.9}
    # the samples nearest 2, 3 and 5 minutes, not the first ones
    assert row["rss_mb"] == {"2min": 510.0, "3min": 515.5, "5min": 520.0}
    assert (row["sent"] - row["found"], row["rows"] - row["found"]) == (1, 1)
    assert row["writer_backlog"] == {"bounded": True} and row["label"] == "defaults"
    # a run made at another commit (beside a change, for comparison) is recorded with it
    other = benchmark_docs.load_row(run, "before", "python bench/bench_load.py", "5a578f9")
    assert other["commit"] == "5a578f9" and row["commit"] != "5a578f9"


def test_metric_names_with_digits_are_read() -> None:
    text = (
        "# TYPE speakermem_writer_tokens_per_1k_messages gauge\n"
        "speakermem_writer_tokens_per_1k_messages 91940.0\n"
        'speakermem_events_handled_total{outcome="message_stored"} 1.5e+04\n'
    )
    assert bench_load.parse_metrics(text) == {
        "speakermem_writer_tokens_per_1k_messages": 91940.0,
        'speakermem_events_handled_total{outcome="message_stored"}': 15000.0,
    }


def embed_timeline(queue: list[int], step: int = 15, rate: int = 100) -> list[dict[str, float]]:
    return [
        {"t_s": i * step, "embed_queue": q, "stored": rate * i * step} for i, q in enumerate(queue)
    ]


def test_an_embedding_backlog_that_keeps_growing_is_not_bounded() -> None:
    growing = embed_timeline([0, 2514, 4600, 7000, 9400, 11800, 14200, 16600, 17198])
    verdict = bench_load.embed_backlog(growing, traffic_s=120)
    assert verdict["bounded"] is False
    assert verdict["growth_per_s"] == round(17198 / 120, 1)
    assert verdict["middle_third_peak"] == 11800 and verdict["last_third_peak"] == 17198


def test_an_embedding_backlog_that_drains_in_the_last_third_is_bounded() -> None:
    # samples after the traffic (t > 120 s) are not counted
    sawtooth = embed_timeline([0, 900, 1500, 1200, 1600, 800, 1100, 600, 1000, 99_999])
    verdict = bench_load.embed_backlog(sawtooth, traffic_s=120)
    assert verdict["bounded"] is True
    assert (verdict["middle_third_peak"], verdict["last_third_peak"]) == (1600, 1100)
    # stored 100 a second; embedded that less the backlog's growth (0 -> 1000 in 120 s)
    assert verdict["stored_per_s"] == 100.0
    assert verdict["embedded_per_s"] == round(100 - 1000 / 120, 1)


def test_a_bot_that_stored_nothing_during_the_traffic_has_no_embedding_verdict() -> None:
    idle = embed_timeline([0, 0, 0, 0, 0, 0, 0, 0, 0], rate=0)
    assert bench_load.embed_backlog(idle, traffic_s=120)["bounded"] is None
