"""Benchmark pages render their results tables from the JSON beside them: a page whose table
differs from its results file fails here (`python bench/benchmark_docs.py render` fixes it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "benchmark_docs", ROOT / "bench/benchmark_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmark_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_every_marked_table_matches_its_results_file() -> None:
    docs = _module()
    pages = docs.pages()
    assert pages, "docs/benchmarks has no page"
    for page in pages:
        text = page.read_text()
        names = [m.group("name") for m in docs.MARKER.finditer(text)]
        for name in names:
            report = json.loads((docs.DOCS / f"{name}.json").read_text())
            assert {"dataset", "systems", "k", "run"} <= set(report), name
        assert docs.render_page(text, docs._load) == text, f"{page.name}: run `render`"


def test_render_fills_a_marked_block_from_a_report() -> None:
    docs = _module()
    report = json.loads((docs.DOCS / "socialmembench.json").read_text())
    page = "# x\n<!-- results:r -->\nold\n<!-- /results:r -->\ntail\n"
    out = docs.render_page(page, lambda name: report)
    assert "old" not in out and out.endswith("<!-- /results:r -->\ntail\n")
    assert "| speakermem |" in out and report["run"]["command"] in out
    # rendering again changes nothing
    assert docs.render_page(out, lambda name: report) == out
