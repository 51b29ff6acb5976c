"""Record `bench_store.py --stages writers` runs as docs/benchmarks/postgresql-ingest.json.

    python bench/bench_store.py --backend postgres --stages writers --out /tmp/pg.json
    python bench/bench_store.py --backend sqlite --stages writers --out /tmp/sqlite.json
    python bench/pg_ingest_docs.py /tmp/pg.json /tmp/sqlite.json [--before /tmp/old.json]

The writers stage of each file is copied as it was written (no figure is retyped), with the
machine, the commit and the date; `--before` adds a PostgreSQL run of an earlier commit made
on the same machine (its commit given with `--before-commit`). The page
docs/benchmarks/postgresql-ingest.md renders it.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmark_docs import DOCS, commit

COMMAND = "python bench/bench_store.py --backend {backend} --stages writers"


def _writers(path: Path, backend: str) -> dict[str, Any]:
    result = json.loads(path.read_text())
    if result.get("backend") != backend:
        raise SystemExit(f"{path}: a {result.get('backend')} run, expected {backend}")
    stage = result["stages"]["writers"]
    stage["command"] = COMMAND.format(backend=backend)
    stage["machine"] = result["machine"]
    stage["started"] = result["started"]
    if backend == "postgres":
        stage["server"] = result["postgres"]
    return stage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("postgres", type=Path, help="bench_store.py --backend postgres --out file")
    p.add_argument("sqlite", type=Path, help="bench_store.py --backend sqlite --out file")
    p.add_argument("--before", type=Path, help="a postgres run of an earlier commit")
    p.add_argument("--before-commit", default=None, help="the commit --before was run at")
    args = p.parse_args(argv)
    pg = _writers(args.postgres, "postgres")
    m = pg["machine"]
    out: dict[str, Any] = {
        "run": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "machine": f"{m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, shared with "
            f"the PostgreSQL server (PostgreSQL {pg['server']} from pgserver, its defaults)",
            "commit": commit(),
            "source": "bench/pg_ingest_docs.py over the --out files of the two commands",
        },
        "postgres": pg,
        "sqlite": _writers(args.sqlite, "sqlite"),
    }
    if args.before is not None:
        before = _writers(args.before, "postgres")
        before["commit"] = args.before_commit or "not recorded"
        out["before"] = before
    target = DOCS / "postgresql-ingest.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
