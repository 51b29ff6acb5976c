"""What the benchmark scripts share: argument parsing and JSON output (`cli`), percentiles
(`stats`), the machine and its processes (`host`), a local PostgreSQL (`pg`), building and
reusing a benchmark database (`build`) and the state it was measured in (`dbstate`),
vectors and embedders (`vectors`), synthetic chat words (`words`), event-loop lag
(`ticker`) and Slack message events (`slack_events`).

The scripts run as `python bench/<script>.py`, so `bench/` is on the path and this package
is imported as `benchlib`; importing it puts the repository root on the path too, so a
script imports `benchlib` first and then the project. The names below are the ones most
scripts use.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchlib.host import cpu_model, machine  # noqa: E402
from benchlib.pg import pg_version, start_pgserver, with_database  # noqa: E402
from benchlib.slack_events import BASE_TS, event_bodies  # noqa: E402
from benchlib.stats import pct  # noqa: E402
from benchlib.ticker import TICK_S, Ticker  # noqa: E402

__all__ = [
    "BASE_TS",
    "REPO_ROOT",
    "TICK_S",
    "Ticker",
    "cpu_model",
    "event_bodies",
    "machine",
    "pct",
    "pg_version",
    "start_pgserver",
    "with_database",
]
