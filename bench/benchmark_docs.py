"""Benchmark results as data: record a `speakermem eval` report under docs/benchmarks/, with
the command that produced it, the commit and the date.

    python bench/benchmark_docs.py record socialmembench /tmp/smb.json \\
        --command "speakermem eval socialmembench ../shared/data/socialmembench --out smb.json"

A page shows it with `<!-- report: socialmembench.json -->`: the docs build renders the tables
`speakermem eval` prints from the file (scripts/bench_tables.py), so page and run agree.

A load run (`bench/bench_load.py --json run.json`) is appended as one row to a block of
docs/benchmarks/load.json, which docs/benchmarks/load.md renders as a table:

    python bench/benchmark_docs.py record-load default_runs /tmp/run.json --label "defaults" \
        --command "python bench/bench_load.py --rate 200 --seconds 300 --channels 50"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib.host import cpu_model
from load_report import embed_backlog

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs" / "benchmarks"


def commit(*, short: bool = False) -> str:
    """The checkout's HEAD (abbreviated with `short`), "unknown" outside a git checkout: the
    commit every recorded result names."""
    cmd = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def record(name: str, report_path: Path, command: str) -> Path:
    report = json.loads(report_path.read_text())
    report["run"] = {
        "command": command,
        "commit": commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    DOCS.mkdir(parents=True, exist_ok=True)
    out = DOCS / f"{name}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out


def _rss_at(timeline: list[dict[str, Any]], t_s: float) -> float:
    """The RSS sample nearest `t_s` seconds into the traffic."""
    return float(min(timeline, key=lambda row: abs(float(row["t_s"]) - t_s))["rss_mb"])


def load_row(
    run: dict[str, Any], label: str, command: str, at_commit: str | None = None
) -> dict[str, Any]:
    """One row of load.json from a `bench_load.py --json` run: the fields load.md's tables
    show, rounded as they are shown, with the run's command, commit (`at_commit`, else the
    checkout's) and date."""
    rec, lag = run["recall_ms"], run["lag_ms"]
    return {
        "label": label,
        "command": command,
        "commit": at_commit or commit(short=True),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, {os.cpu_count()} logical CPUs",
        "embedder": run["embedder"],
        "recall_processes": run["recall_processes"],
        "llm_latency_s": run["llm_latency_s"],
        "sent": run["sent"],
        "found": run["found"],
        "rows": run["rows"],
        "recall_ms": {k: round(rec[k]) for k in ("p50", "p95", "p99")} | {"n": rec["n"]},
        "lag_ms": {k: round(lag[k], 1) for k in ("p50", "p99", "max")},
        "rss_mb": {f"{m}min": round(_rss_at(run["timeline"], m * 60.0), 1) for m in (2, 3, 5)},
        "rss_slope_mb_min_last3": run["rss_slope_mb_min_last3"],
        "bot_stop_s": run["bot_stop_s"],
        "bot_exit": run["bot_exit"],
        "writer_backlog": run["writer_backlog"],
        "segments": run["segments"],
        "rate": run.get("rate"),
        "embed_backlog": embed_backlog(run["timeline"], run["warmup_s"] + run["seconds"])
        if "warmup_s" in run
        else run.get("embed_backlog"),
        "loadavg_1m": run.get("loadavg_1m"),
    }


def record_load(
    block: str, run_path: Path, label: str, command: str, at_commit: str | None = None
) -> Path:
    out = DOCS / "load.json"
    doc = json.loads(out.read_text())
    row = load_row(json.loads(run_path.read_text()), label, command, at_commit)
    doc.setdefault(block, []).append(row)
    out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="copy an eval report into docs/benchmarks/NAME.json")
    r.add_argument("name", help="results file name (docs/benchmarks/NAME.json)")
    r.add_argument("report", type=Path, help="the JSON `speakermem eval --out` wrote")
    r.add_argument("--command", required=True, help="the command that produced the report")
    lr = sub.add_parser(
        "record-load", help="append a bench_load.py run to docs/benchmarks/load.json"
    )
    lr.add_argument("block", help="the list in load.json the row joins (e.g. default_runs)")
    lr.add_argument("run", type=Path, help="the JSON `bench_load.py --json` wrote")
    lr.add_argument("--label", required=True, help="the row's label in the table")
    lr.add_argument("--command", required=True, help="the command that produced the run")
    lr.add_argument(
        "--commit", default=None, help="the commit the run measured (default: this checkout's)"
    )
    args = p.parse_args()
    if args.cmd == "record-load":
        print(record_load(args.block, args.run, args.label, args.command, args.commit))
    else:
        print(record(args.name, args.report, args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
