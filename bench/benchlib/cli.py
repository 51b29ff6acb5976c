"""Command-line pieces the benchmark scripts share: options, FIELD=JSON overrides, JSON
results and progress lines."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_backend_options(p: argparse.ArgumentParser, *, backend_help: str, url_help: str) -> None:
    """--backend sqlite|postgres and --db-url (a postgresql:// admin URL)."""
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite", help=backend_help)
    p.add_argument("--db-url", default=None, help=url_help)


def add_overrides_option(p: argparse.ArgumentParser, flag: str, model: str, example: str) -> None:
    """A repeatable FIELD=JSON option that overrides a field of a config model."""
    p.add_argument(
        flag,
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help=f"{model} override, e.g. {flag} {example}",
    )


def overrides(items: Sequence[str]) -> dict[str, Any]:
    """FIELD=JSON strings as a dict ('rerank_depth=0' -> {'rerank_depth': 0})."""
    return {k: json.loads(v) for k, v in (s.split("=", 1) for s in items)}


def write_json(path: str | Path, data: Any) -> None:
    """The results as indented JSON (values JSON does not know written as strings)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=str))


def log(message: str) -> None:
    print(message, flush=True)


class Progress:
    """Prints a progress line at most every `every_s` seconds (none without a label)."""

    def __init__(self, label: str, every_s: float = 15.0) -> None:
        self.label = label
        self.every_s = every_s
        self._last = time.perf_counter()

    def __call__(self, text: str) -> None:
        if self.label and time.perf_counter() - self._last > self.every_s:
            self._last = time.perf_counter()
            log(f"    {self.label}: {text}")


def add_json_option(p: argparse.ArgumentParser, flag: str = "--json") -> None:
    """Where to write the raw results as JSON, beside the report printed."""
    p.add_argument(flag, type=Path, help="also write the raw results here")


def int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (an argparse type; '' is an empty list)."""
    return [int(x) for x in text.split(",") if x.strip()]
