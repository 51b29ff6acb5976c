"""The store benchmark's report: the machine it ran on and the Markdown table of its results
against the targets."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from benchlib.host import host_info
from benchmark_docs import commit

TARGETS = {
    "ingest_msgs_per_s": 20_000,
    "embed_msgs_per_s": 250,
    "hybrid_p95_ms": 100,
    "recall_at_40": 0.95,
    "rss_mb_1m": 500,
}


def machine_info() -> dict[str, Any]:
    """The machine, and the SQLite, driver, sqlite-vec and numpy versions the store ran on."""
    from speakermem.memory.store.driver import pick_driver

    drv = pick_driver("auto")
    conn = drv.module.connect(":memory:")
    conn.enable_load_extension(True)
    import sqlite_vec

    sqlite_vec.load(conn)
    vec_version = conn.execute("SELECT vec_version()").fetchone()[0]
    conn.close()
    host = host_info()
    return {
        **{k: host[k] for k in ("cpu", "cores", "ram_gb", "python")},
        "sqlite": drv.module.sqlite_version,
        "driver": drv.name,
        "sqlite_vec": vec_version,
        "numpy": np.__version__,
        "platform": host["platform"],
    }


def _mb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.0f} MB"


def _ok(value: float | None, target: float, higher_is_better: bool) -> str:
    if value is None:
        return "skipped"
    good = value >= target if higher_is_better else value <= target
    return "PASS" if good else "**FAIL**"


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']},"
        f" SQLite {m['sqlite']} (driver {m['driver']}), sqlite-vec {m['sqlite_vec']}",
        "",
        "| Measurement | Scale | Result | Target | Status |",
        "|---|---|---|---|---|",
    ]
    S = results["stages"]
    backend = results["args"].get("backend", "sqlite")
    if backend == "postgres":
        lines[0] = f"Backend: PostgreSQL {results.get('postgres', '?')}. " + lines[0]

    def row(what: str, scale: str, result: str, target: str = "", status: str = "") -> None:
        lines.append(f"| {what} | {scale} | {result} | {target} | {status} |")

    if "ingest" in S and "error" not in S["ingest"]:
        r = S["ingest"]
        row(
            "Ingest, no embeddings (`ingest_many`, batches of 2,000)",
            f"{r['messages']:,} msgs, interleaved over {r['channels']} channels",
            f"{r['msgs_per_s']:,.0f} msg/s",
            "≥ 20,000 msg/s",
            _ok(r["msgs_per_s"], TARGETS["ingest_msgs_per_s"], True),
        )
    if "embed" in S and "error" not in S["embed"]:
        r = S["embed"]
        if "skipped" in r:
            row("Ingest + MiniLM embeddings", "-", r["skipped"], "≥ 250 msg/s", "skipped")
        else:
            row(
                "Ingest + MiniLM embeddings (`ingest_many` + `embed_pending`), end to end",
                f"{r['messages']:,} msgs over {r['channels']} channels",
                f"{r['msgs_per_s']:,.0f} msg/s ({r['embedder']}, {r['threads']} thread(s);"
                f" embed only {r['embed_only_per_s']:,.0f}/s; {r.get('tokens_per_text')}"
                " tokens per text)",
                "≥ 250 msg/s",
                _ok(r["msgs_per_s"], TARGETS["embed_msgs_per_s"], True),
            )
            qe = r["query_embed"]
            row(
                "MiniLM query embedding (not included in search latencies below)",
                "1 query",
                f"p50 {qe['p50_ms']} ms, p95 {qe['p95_ms']} ms",
            )
    if "vecinsert" in S and "error" not in S["vecinsert"]:
        r = S["vecinsert"]
        row(
            f"`store_vectors` interleaved across channels (batches of 256, vec0 chunk_size"
            f" {r['vec_chunk_size']})",
            f"{r['messages']:,} vectors, {r['channels']} channels",
            f"{r['interleaved']['vectors_per_s']:,.0f} vectors/s",
        )
        row(
            "`store_vectors` grouped by channel (same data)",
            f"{r['messages']:,} vectors, {r['channels']} channels",
            f"{r['grouped']['vectors_per_s']:,.0f} vectors/s",
            "interleaved not ≪ grouped",
            f"ratio {r['interleaved_vs_grouped']:.2f} "
            + ("PASS" if r["interleaved_vs_grouped"] >= 0.5 else "**FAIL**"),
        )
    for key, label in (
        ("10k", "10k msgs, 1 channel"),
        ("100k", "100k msgs, 1 channel"),
        ("1m", "1M msgs, 100 channels"),
    ):
        if key not in S:
            continue
        r = S[key]
        if "error" in r:
            row(f"Scale {key}", label, r["error"])
            continue
        label = f"{r['messages']:,} msgs, {r['channels']} channel(s)"
        vk = r.get("vectors", {})
        if "reused" in r:
            row("Build", label, r["reused"])
        else:
            row("Build: ingest (no embeddings)", label, f"{r['ingest']['msgs_per_s']:,.0f} msg/s")
        if not vk:
            pass
        elif "vectors_per_s" in vk:
            row(
                "Build: `store_vectors` (interleaved, batches of 2,000)",
                label,
                f"{vk['vectors_per_s']:,.0f} vectors/s — {vk['kind']}",
            )
        else:
            row(
                "Build: vectors",
                label,
                f"{vk['kind']}: embed {vk['embed_per_s']:,.0f}/s, store {vk['store_per_s']:,.0f}/s",
            )
        s = r["search"]
        for mode in ("lexical", "dense", "hybrid"):
            x = s[mode]
            tgt, st = "", ""
            if mode == "hybrid" and key in ("100k", "1m"):
                tgt = "p95 ≤ 100 ms"
                st = _ok(x["p95_ms"], TARGETS["hybrid_p95_ms"], False)
            row(
                f"Search `{mode}` (engine.search, 1 channel, limit 10, pool 40)",
                f"{label}; {x['n']} queries",
                f"p50 {x['p50_ms']} ms, p95 {x['p95_ms']} ms, max {x['max_ms']} ms"
                f" (CPU p50 {x['cpu_p50_ms']} ms, p95 {x['cpu_p95_ms']} ms)",
                tgt,
                st,
            )
        lm = s["lexical_matches"]
        row(
            "Lexical matches per query in the channel",
            label,
            f"median {lm['matches_per_query_p50']:,}, max {lm['matches_per_query_max']:,}",
        )
        if "recall_at_40" in r:
            rc = r["recall_at_40"]
            conf = str(rc["configured_oversample"])
            parts = []
            for os_, v in rc["by_oversample"].items():
                mark = "**" if os_ == conf else ""
                parts.append(f"{mark}{os_}: {v['recall']:.3f} ({v['p95_ms']} ms p95){mark}")
            x = rc["by_oversample"].get(conf, {}).get("recall")
            row(
                f"Dense recall@40 vs exact cosine, by oversample ({rc['kind']})",
                f"{label}; {rc['queries']} queries",
                "; ".join(parts),
                "≥ 0.95",
                _ok(x, TARGETS["recall_at_40"], True),
            )
        rss = (
            f"sampled VmRSS peak {r['rss_peak_sampled_mb']:,.0f} MB;"
            f" ru_maxrss {r['ru_maxrss_mb']:,.0f} MB"
        )
        if key == "1m":
            row(
                "Peak RSS during the run",
                label,
                rss,
                "≤ 500 MB",
                _ok(max(r["rss_peak_sampled_mb"], r["ru_maxrss_mb"]), TARGETS["rss_mb_1m"], False),
            )
        else:
            row("Peak RSS during the run", label, rss)
        size_label = (
            "Database size (pg_database_size)"
            if backend == "postgres"
            else "Database size (db + wal, after checkpoint)"
        )
        row(size_label, label, _mb(r["db_bytes"]))
    if "writers" in S and "error" not in S["writers"]:
        r = S["writers"]
        for k, run in r["runs"].items():
            row(
                f"Ingest with {k} writer process(es) (`ingest_many`, batches of 2,000)",
                f"{run['messages']:,} msgs over {r['channels']} channels",
                f"{run['msgs_per_s']:,.0f} msg/s ({run['wall_s']} s)"
                + (
                    f"; CPU per message: writers {run['client_cpu_ms_per_msg']} ms"
                    + (
                        ""
                        if run.get("server_cpu_ms_per_msg") is None
                        else f", server {run['server_cpu_ms_per_msg']} ms"
                    )
                    + f"; {run['cores_busy']} of {run['cores']} cores busy"
                    if "cores_busy" in run
                    else ""
                ),
            )
    if "workers" in S and "error" not in S["workers"]:
        r = S["workers"]
        if "skipped" in r:
            row("Writer throughput (bench/bench_workers.py)", "-", r["skipped"], "", "skipped")
        for key, run in r.get("runs", {}).items():
            who = {
                "postgres": f"{key.split('_')[1]} `speakermem worker` process(es), PostgreSQL",
                "sqlite": "1 process, SQLite (`Writer.flush_due`)",
                "sqliteworker": "1 `speakermem worker` process, SQLite",
            }[key.split("_")[0]]
            a = r["args"]
            row(
                f"Writer throughput, {who}",
                f"{a['segments']} segments, {a['channels']} channels, LLM {a['latency']:g} s"
                f"/call, concurrency {r['concurrency']}",
                f"{run['segments_per_s']} segments/s ({run['llm_calls']} LLM calls; latency"
                f" bound {run['bound']['segments_per_s']}/s; each segment written once:"
                f" {'yes' if run['exactly_once'] else 'NO'})",
            )
    lines.append("")
    lines.append(
        "Stage wall / CPU time (this process, all threads) / 1-min load average at"
        " start and end: "
        + "; ".join(
            f"{k} {v.get('stage_s', '?')} s / {v.get('cpu_s', '?')} s / {v.get('loadavg_1m', '?')}"
            for k, v in S.items()
        )
    )
    lines.append(
        "CPU ms per query is process CPU time (all threads); when the machine is"
        " shared, wall-clock latency exceeds it by the time spent waiting for a core."
    )
    return "\n".join(lines)


COLD_MODES = ("lexical", "dense", "hybrid")


def update_cold_doc(path: Path, results: dict[str, Any], command: str) -> str | None:
    """Write this run's cold-start search (the first stage timed with --cold) as its
    backend's side of `path` (docs/benchmarks/postgresql-cold.json: one row per mode with
    a `postgres` and a `sqlite` side, and each side's run); the other side stays. The
    stage's name, or None when no stage was timed cold."""
    stage, cold = next(
        (
            (name, res["search_cold"])
            for name, res in results["stages"].items()
            if "lexical" in res.get("search_cold", {})
        ),
        (None, None),
    )
    if stage is None or cold is None:
        return None
    backend = results["backend"]
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    m = results["machine"]
    res = results["stages"][stage]
    database = (
        f"PostgreSQL {results.get('postgres', '?')}, server restarted before each mode"
        if backend == "postgres"
        else f"SQLite {m['sqlite']} ({m['driver']}), sqlite-vec {m['sqlite_vec']}"
    )
    doc[backend] = {
        "command": command,
        "stage": stage,
        "messages": res["messages"],
        "channels": res["channels"],
        "queries": cold["queries"],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(short=True),
        "machine": f"{m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM",
        "database": database,
    }
    rows = {r["mode"]: r for r in doc.get("rows", [])}
    for mode in COLD_MODES:
        row = rows.setdefault(mode, {"mode": mode})
        c = cold[mode]
        row[backend] = {
            "p50": round(c["p50_ms"], 1),
            "p95": round(c["p95_ms"], 1),
            "max": round(c["max_ms"], 1),
            "first_p95": round(c["first_in_channel"]["p95_ms"], 1),
        }
    doc["rows"] = [rows[mode] for mode in COLD_MODES]
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return stage
