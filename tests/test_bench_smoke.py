"""The benchmark scripts still run, in miniature: bench/bench_store.py (its SQLite stages of
configurable size, in this process) and bench/bench_community.py (its /recall and Slack
stages on a workspace of a few hundred members). Smoke tests of the scripts and of
bench/benchlib, not measurements: the figures are not asserted, only that each stage ran
and reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_community  # noqa: E402
import bench_store  # noqa: E402

pytestmark = pytest.mark.slow


def test_bench_store_runs_its_stages(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    argv = ["--in-process", "--stages", "ingest,vecinsert,1m,writers", "--quick"]
    argv += ["--ingest-n", "600", "--vec-n", "300", "--big-n", "600", "--channels", "4"]
    argv += ["--queries", "3", "--recall-queries", "3", "--writers", "1", "--writers-n", "200"]
    assert bench_store.main([*argv, "--db-dir", str(tmp_path), "--out", str(out)]) == 0
    stages = json.loads(out.read_text())["stages"]
    assert stages["ingest"]["messages"] == 600 and stages["vecinsert"]["messages"] == 300
    assert stages["1m"]["search"]["hybrid"]["n"] == stages["1m"]["search"]["queries"]
    assert {r["messages"] for r in stages["writers"]["runs"].values()} == {200}


def test_bench_community_runs_its_stages(tmp_path: Path) -> None:
    out = tmp_path / "community.json"
    argv = ["--stages", "recall,slack", "--channels", "6", "--members", "300", "--speakers", "60"]
    argv += ["--lurkers", "20"]
    argv += ["--messages", "400", "--records", "40", "--questions", "1", "--warmup", "1"]
    argv += ["--slack-members", "200", "--rss-members", "300", "--rss-channels", "6"]
    rc = bench_community.main([*argv, "--db-dir", str(tmp_path), "--out", str(out)])
    assert rc in (0, 1)  # 1: a latency target missed on a busy machine
    result = json.loads(out.read_text())
    assert result["recall"]["data"]["members"] == 300
    assert {k: v["questions"] for k, v in result["recall"]["kinds"].items()} == {
        "one person": 1,
        "two people": 1,
        "nobody": 1,
    }
    assert result["slack"]["one_channel"]["members_synced"] == 200


def test_bench_slack_import_writes_an_export_the_importer_reads(tmp_path: Path) -> None:
    import bench_slack_import

    from speakermem.integrations.slack.export import read_slack_export

    held = bench_slack_import.write_export(tmp_path / "x.zip", 30, 2, 200, seed=1)
    export = read_slack_export(tmp_path / "x.zip")
    events = list(export)
    assert export.errors == [] and len(events) == held["records"] == 200
    assert [len(r.members) for r in export.rosters()] == [30, 30]
    assert sum(e.speaker_is_bot for e in events) == 4  # one integration post in 50


def test_the_synthetic_vocabulary_of_a_seed_does_not_change() -> None:
    """Recorded benchmark results were measured on these words: a faster generator must draw
    the same ones (these are what `rng.choice` drew, word by word, before it was replaced)."""
    import numpy as np
    from benchlib.words import chat_words

    assert chat_words(np.random.default_rng(1), 8) == [
        "veetha",
        "thimoorist",
        "reawa",
        "floowoomund",
        "mes",
        "goroujain",
        "flan",
        "tetreeck",
    ]
    assert chat_words(np.random.default_rng(2), 27_000)[-3:] == [
        "goplovun",
        "fadosaist",
        "mizoostoor",
    ]
