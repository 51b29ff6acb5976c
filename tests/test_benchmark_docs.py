"""Benchmark pages show `speakermem eval` reports from the JSON beside them: the docs build
renders a `<!-- report: NAME.json -->` marker into the tables the command prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import bench_tables
from speakermem.memory.eval.harness import markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def test_a_report_marker_renders_the_reports_tables_and_run() -> None:
    report = json.loads((DOCS / "socialmembench.json").read_text())
    page = "# x\n\n<!-- report: socialmembench.json -->\n\ntail\n"
    out = bench_tables.expand(page, lambda name: report, "x.md")
    assert "<!-- report:" not in out and out.endswith("\n\ntail\n")
    assert markdown_table(report) in out
    assert report["run"]["command"] in out and report["run"]["commit"][:12] in out


def test_a_report_marker_on_a_file_that_is_no_report_fails_the_build() -> None:
    with pytest.raises(bench_tables.BenchDataError, match="not a `speakermem eval` report"):
        bench_tables.expand("<!-- report: x.json -->\n", lambda name: {"runs": []}, "x.md")


def test_every_report_a_page_names_is_a_recorded_eval_report() -> None:
    named = [
        m["file"]
        for page in DOCS.glob("*.md")
        for m in bench_tables.REPORT.finditer(page.read_text())
    ]
    assert "socialmembench.json" in named and "locomo.json" in named
    for name in named:
        report = json.loads((DOCS / name).read_text())
        assert {"dataset", "systems", "k", "run"} <= set(report), name
        assert {"command", "commit", "date"} <= set(report["run"]), name
