"""Benchmark results as data: record a `speakermem eval` report under docs/benchmarks/, with
the command that produced it, the commit and the date.

    python bench/benchmark_docs.py record socialmembench /tmp/smb.json \\
        --command "speakermem eval socialmembench ../shared/data/socialmembench --out smb.json"

A page shows it with `<!-- report: socialmembench.json -->`: the docs build renders the tables
`speakermem eval` prints from the file (scripts/bench_tables.py), so page and run agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs" / "benchmarks"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def record(name: str, report_path: Path, command: str) -> Path:
    report = json.loads(report_path.read_text())
    report["run"] = {
        "command": command,
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    DOCS.mkdir(parents=True, exist_ok=True)
    out = DOCS / f"{name}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="copy an eval report into docs/benchmarks/NAME.json")
    r.add_argument("name", help="results file name (docs/benchmarks/NAME.json)")
    r.add_argument("report", type=Path, help="the JSON `speakermem eval --out` wrote")
    r.add_argument("--command", required=True, help="the command that produced the report")
    args = p.parse_args()
    print(record(args.name, args.report, args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
