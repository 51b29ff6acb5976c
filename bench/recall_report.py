"""The /recall benchmark's report: the store it ran on, the time each store call took per
question (--breakdown), and the Markdown tables of its runs against the targets."""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from typing import Any

from benchlib.build import Target
from benchlib.host import host_info
from benchlib.pg import pg_version
from benchlib.stats import percentile
from recall_data import PEOPLE

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterMember
from speakermem.memory.query.projection import fallback_projection
from speakermem.memory.search.fts_query import build_match

TARGET_P95_MS = 100.0
TARGET_PACK_TOKENS = 3_000
STAGES = ("access", "project", "system1", "system2", "compose", "answer")


class StoreTimer:
    """Wraps the store's read methods on one engine and sums their wall time per question."""

    METHODS = {
        "messages": (
            "lexical",
            "dense",
            "session_term_counts",
            "session_total",
            "neighbours",
            "get_many",
            "by_ids",
            "latest_ts",
        ),
        "records": ("lexical", "dense", "get_many", "chain"),
        "channels": ("readable_channels", "members", "is_private", "lookup"),
    }

    def __init__(self, engine: MemoryEngine) -> None:
        self.current: dict[str, list[float]] = {}
        self.matches: dict[str, str] = {}
        self.per_question: list[dict[str, list[float]]] = []
        for repo_name, methods in self.METHODS.items():
            repo = getattr(engine.store, repo_name)
            for name in methods:
                setattr(repo, name, self._wrap(f"{repo_name}.{name}", getattr(repo, name)))

    def _wrap(self, label: str, fn: Any) -> Any:
        @functools.wraps(fn)
        async def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                filters = [k for k in ("speakers", "since", "owner", "source") if kw.get(k)]
                if label == "messages.lexical" and a:
                    filters.insert(0, self.matches.get(a[0], "other"))
                key = f"{label}[{','.join(filters)}]" if filters else label
                self.current.setdefault(key, []).append((time.perf_counter() - t0) * 1000)

        return timed

    def start(self, question: str, roster: list[RosterMember]) -> None:
        """Name the lexical queries of this question by what they search for."""
        self.current = {}
        issue = fallback_projection(question, roster).issue
        self.matches = {build_match(question): "question", build_match(issue): "issue"}

    def stop(self) -> None:
        self.per_question.append(self.current)

    def summary(self) -> dict[str, dict[str, float]]:
        labels = sorted({k for q in self.per_question for k in q})
        out = {}
        for label in labels:
            totals = [sum(q.get(label, [])) for q in self.per_question]
            calls = [len(q.get(label, [])) for q in self.per_question]
            out[label] = {
                "calls_per_q": round(statistics.fmean(calls), 1),
                "ms_per_q_mean": round(statistics.fmean(totals), 2),
                "ms_per_q_p95": round(percentile(totals, 95), 2),
                "max_call_ms": round(max(max(q.get(label, [0.0])) for q in self.per_question), 1),
            }
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms_per_q_mean"]))


def breakdown_table(b: dict[str, dict[str, float]]) -> str:
    lines = [
        "Store calls per question (wall ms, summed per question):",
        "",
        "| call | calls/q | mean ms/q | p95 ms/q | slowest call ms |",
        "|---|---|---|---|---|",
    ]
    for label, v in b.items():
        lines.append(
            f"| {label} | {v['calls_per_q']} | {v['ms_per_q_mean']} | {v['ms_per_q_p95']} |"
            f" {v['max_call_ms']} |"
        )
    return "\n".join(lines)


async def store_info(target: Target) -> dict[str, Any]:
    engine = await MemoryEngine.open(target.config(), None)
    try:
        driver = engine.store.driver_name
        versions: dict[str, Any] = {}
        if driver == "postgres":
            versions["postgres"] = await asyncio.to_thread(pg_version, str(target.url))
            versions["database"] = f"PostgreSQL {versions['postgres']} via psycopg"
        else:
            (row,) = await engine.store.db.read("SELECT sqlite_version(), vec_version()")
            versions["sqlite"], versions["sqlite_vec"] = row[0], row[1]
            versions["database"] = f"SQLite {row[0]} via {driver}, sqlite-vec {row[1]}"
        counts = await engine.store.messages.counts()
        rec_counts = await engine.store.records.counts()
        size = await engine.store.db_size_bytes()
    finally:
        await engine.close()
    return {
        **host_info(),
        **versions,
        "driver": driver,
        "messages": counts["messages"],
        "records": rec_counts["records"],
        "active_records": rec_counts["active_records"],
        "db_mb": round(size / 1e6, 1),
    }


def report(machine: dict[str, Any], build_stats: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    m = machine
    lines = [
        f"## /recall latency on {'PostgreSQL' if m['driver'] == 'postgres' else 'SQLite'}"
        " (RecallPipeline, no LLM, extractive answer)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']},"
        f" {m['database']} ({m['platform']})",
        f"Data: one channel, {m['messages']:,} messages ({build_stats.get('vectors', '?')}"
        f" message vectors), {m['records']:,} records ({m['active_records']:,} active),"
        f" {len(PEOPLE)} roster members, DB {m['db_mb']} MB",
    ]
    if "ingest_s" in build_stats:
        b = build_stats
        lines.append(
            f"Build (once, reused by later runs): ingest {b['ingest_s']} s, message vectors"
            f" {b.get('vectors_s', '?')} s, records {b.get('records_s', '?')} s,"
            f" {'the store settling' if m['driver'] == 'postgres' else 'WAL checkpoint'}"
            f" {b.get('settle_s', '?')} s; total {b.get('build_s', '?')} s"
        )
    lines += [
        "",
        "| query embedder | questions | p50 ms | p95 ms | p99 ms | max ms | CPU p50/p95 ms"
        " | pack tokens mean / max | p95 ≤ 100 ms | pack ≤ 3,000 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['embedder']} | {r['questions']} | {r['p50_ms']} | {r['p95_ms']} |"
            f" {r.get('p99_ms', '?')} | {r['max_ms']} | {r['cpu_p50_ms']} / {r['cpu_p95_ms']} |"
            f" {r['pack_tokens_mean']} / {r['pack_tokens_max']} |"
            f" {'yes' if r['p95_ms'] <= TARGET_P95_MS else '**no**'} |"
            f" {'yes' if r['pack_tokens_max'] <= TARGET_PACK_TOKENS else '**no**'} |"
        )
    lines += ["", "Per stage (`trace.latency_ms`), p50 / p95 ms:", ""]
    lines.append("| query embedder | " + " | ".join(STAGES) + " |")
    lines.append("|---|" + "---|" * len(STAGES))
    for r in runs:
        cells = [f"{r['stages'][s]['p50_ms']} / {r['stages'][s]['p95_ms']}" for s in STAGES]
        lines.append(f"| {r['embedder']} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in runs:
        if "query_embed_p50_ms" in r:
            lines.append(
                f"- {r['embedder']}: one query embedding p50 {r['query_embed_p50_ms']} ms,"
                f" p95 {r['query_embed_p95_ms']} ms (System 1 embeds the question; System 2"
                " embeds the issue only when a row lacks lexical matches)"
            )
        lines.append(
            f"- {r['embedder']}: mean {r['rows_mean']} rows and {r['excerpts_mean']} excerpts"
            f" per pack; 1-min load average at the start {r.get('loadavg_1m_start', '?')},"
            f" at the end {r['loadavg_1m']}"
        )
        if r.get("server_cpu_ms_per_q"):
            lines.append(
                f"- {r['embedder']}: server CPU per question (ms): "
                + ", ".join(f"{k} {v}" for k, v in r["server_cpu_ms_per_q"].items())
            )
        st = r.get("state")
        if st:
            tables = st.get("tables", {})
            lagging = [k for k, t in tables.items() if t["analyzed"] == "never"]
            lines.append(
                f"- state measured: {st['build']} build, cache {st['cache']}"
                + (
                    f"; tables analysed: {'all' if not lagging else 'not ' + ', '.join(lagging)}"
                    if tables
                    else ""
                )
            )
    return "\n".join(lines)
