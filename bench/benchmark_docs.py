"""Benchmark results as data: record `speakermem eval` reports under docs/benchmarks/ and
render the pages' results tables from them.

    # copy a report in, with the command that produced it and the commit it ran on
    python bench/benchmark_docs.py record socialmembench /tmp/smb.json \\
        --command "speakermem eval socialmembench ../shared/data/socialmembench --out smb.json"
    # rewrite every table between <!-- results:NAME --> and <!-- /results:NAME --> markers
    python bench/benchmark_docs.py render
    # exit 1 when a page's table differs from its JSON (what the test suite checks)
    python bench/benchmark_docs.py check

A page may hold several tables, one per results file: the marker names the file
(docs/benchmarks/NAME.json). The table is `memory.eval.harness.markdown_table` of the report,
the same text `speakermem eval` prints, so the page and the run always agree.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from memory.eval.harness import markdown_table  # noqa: E402

DOCS = REPO_ROOT / "docs" / "benchmarks"
MARKER = re.compile(
    r"(<!-- results:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S
)


def table(report: dict[str, Any]) -> str:
    """The results table of one report, with the run it came from."""
    run = report.get("run") or {}
    lines = [markdown_table(report)]
    if run:
        lines += ["", f"Run: `{run.get('command', '?')}` at {run.get('commit', '?')[:12]}."]
    return "\n".join(lines) + "\n"


def render_page(text: str, load: Any) -> str:
    """`text` with each marked block replaced by the table of its results file."""

    def replace(m: re.Match[str]) -> str:
        return m.group(1) + table(load(m.group("name"))) + m.group(4)

    return MARKER.sub(replace, text)


def _load(name: str) -> dict[str, Any]:
    path = DOCS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"{path}: no results file; record one first (see --help)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


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


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="copy an eval report into docs/benchmarks/NAME.json")
    r.add_argument("name", help="results file name (docs/benchmarks/NAME.json)")
    r.add_argument("report", type=Path, help="the JSON `speakermem eval --out` wrote")
    r.add_argument("--command", required=True, help="the command that produced the report")
    sub.add_parser("render", help="rewrite the marked tables of docs/benchmarks/*.md")
    sub.add_parser("check", help="exit 1 when a marked table differs from its JSON")
    args = p.parse_args()
    if args.cmd == "record":
        print(record(args.name, args.report, args.command))
        return 0
    stale = []
    for page in pages():
        text = page.read_text()
        fresh = render_page(text, _load)
        if fresh != text:
            stale.append(page)
            if args.cmd == "render":
                page.write_text(fresh)
    verb = "rewrote" if args.cmd == "render" else "stale"
    for page in stale:
        print(f"{verb}: {page.relative_to(REPO_ROOT)}")
    return 1 if stale and args.cmd == "check" else 0


if __name__ == "__main__":
    sys.exit(main())
