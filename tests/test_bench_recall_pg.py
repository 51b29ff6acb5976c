"""bench/bench_recall.py on PostgreSQL, in miniature: it builds its database on the server
it is given, reports that server, and a second run reuses the build instead of ingesting again.

A smoke test of the benchmark script (a few hundred messages), not a latency measurement:
the exit status (1 when a latency target is missed on a busy machine) is not asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_recall  # noqa: E402

MESSAGES, RECORDS = 300, 20


def _run(db_dir: Path, url: str, out: Path, *extra: str) -> dict:
    rc = bench_recall.main(
        [
            "--backend",
            "postgres",
            "--db-url",
            url,
            "--db-dir",
            str(db_dir),
            "--messages",
            str(MESSAGES),
            "--records",
            str(RECORDS),
            "--questions",
            "3",
            "--warmup",
            "1",
            "--query-embedder",
            "fake",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert rc in (0, 1)
    return json.loads(out.read_text())


def _database_comment(url: str, dbname: str) -> str | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (dbname,),
        ).fetchone()
    return None if row is None else (row[0] or "")


def test_builds_on_postgres_then_reuses_and_cleans_up(
    pg_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbname = f"recall_v{bench_recall.BUILD_VERSION}_{MESSAGES}m_{RECORDS}r_s7_synthetic"
    first = _run(tmp_path, pg_server, tmp_path / "first.json")
    assert "Building PostgreSQL database " + dbname in capsys.readouterr().out
    m = first["machine"]
    assert m["driver"] == "postgres"
    assert m["database"].startswith("PostgreSQL ") and "pgvector" in m["postgres"]
    assert "sqlite" not in m
    assert m["messages"] == MESSAGES
    assert m["records"] == RECORDS
    assert m["active_records"] == RECORDS - RECORDS // 10  # each update supersedes one
    assert first["build"]["backend"] == "postgres"
    assert first["build"]["args"]["messages"] == MESSAGES
    # the build's statistics live on the database itself, and nothing was built as a file
    comment = _database_comment(pg_server, dbname)
    assert comment and json.loads(comment)["ingest_s"] == first["build"]["ingest_s"]
    assert not list(tmp_path.glob("*.db*"))
    # the JSON says what state it measured: a fresh build, warm; the store's statistics
    state = first["runs"][0]["state"]
    assert state["build"] == "fresh" and state["cache"].startswith("warm")
    assert "tables" in state and state["graph_inferred_now"] == MESSAGES
    # and the server's own CPU time per question (a local server)
    assert set(first["runs"][0]["server_cpu_ms_per_q"]) >= {"backends", "autovacuum"}

    second = _run(tmp_path, pg_server, tmp_path / "second.json", "--cleanup")
    assert "Reusing PostgreSQL database " + dbname in capsys.readouterr().out
    assert second["build"] == first["build"]
    assert second["machine"]["messages"] == MESSAGES  # not ingested a second time
    assert len(second["runs"]) == 1 and second["runs"][0]["questions"] == 3
    assert second["runs"][0]["state"]["build"] == "reused"
    assert second["runs"][0]["state"]["graph_inferred_now"] == 0
    assert _database_comment(pg_server, dbname) is None  # --cleanup dropped it
