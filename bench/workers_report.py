"""The Writer throughput benchmark's reading of a run: the LLM-latency bound it is held to,
which limit it met, and the report."""

from __future__ import annotations

import argparse
import os
from typing import Any


def bound(slots: int, n_segments: int, channels: int, latency: float) -> dict[str, Any]:
    """The LLM-latency bound: at most min(slots, channels) segments are in flight at once (a
    channel's segments are written one after another), so writing takes at least
    max(ceil(segments / in flight), the longest channel's segments) calls' latency."""
    in_flight = min(slots, channels)
    longest = -(-n_segments // channels)
    floor_s = latency * max(-(-n_segments // in_flight), longest)
    return {
        "in_flight": in_flight,
        "floor_s": round(floor_s, 2),
        "segments_per_s": round(n_segments / floor_s, 2),
    }


def verdict(run: dict[str, Any], b: dict[str, Any], cores: int) -> str:
    """Which limit the run met: the LLM (slots in flight / latency) when it reached 80% of
    that bound, else the CPU when the writers and PostgreSQL kept 70% of the cores busy,
    else the work between calls on a shared machine."""
    share = run["segments_per_s"] / b["segments_per_s"]
    db_busy = (run["db_cpu_ms_per_segment"] or 0.0) * run["segments_per_s"] / 1000
    busy = run["cores_busy"] + db_busy
    run["of_bound"] = round(share, 2)
    if share >= 0.8:
        return (
            f"LLM latency x slots ({b['in_flight']} segment(s) in flight; {share:.0%} of the"
            f" {b['segments_per_s']:g}/s bound)"
        )
    if busy >= 0.7 * cores:
        return f"CPU (writers and database {busy:.2f} of {cores} cores busy; {share:.0%} of bound)"
    return (
        f"{share:.0%} of the {b['segments_per_s']:g}/s latency bound, and not this run's CPU"
        f" (writers and database {busy:.2f} of {cores} cores busy): the rest is waiting"
        " between each segment's sequential steps (prompt reads, commit, claim rounds:"
        " database round trips and process wake-ups) on a CPU shared with other work"
        f" (load {run['loadavg_end']})"
    )


def finish(run: dict[str, Any], b: dict[str, Any], args: argparse.Namespace) -> None:
    """Add the bound, what each slot spent per segment beyond the LLM call, and the verdict."""
    run["bound"] = b
    per_slot = b["in_flight"] * run["writing_s"] / run["segments"]
    run["beyond_llm_s_per_segment"] = round(per_slot - args.latency, 3)
    if run["flush_ms_p50"] is not None:  # prompt building and validation around the call
        run["before_commit_beyond_llm_ms_p50"] = round(run["flush_ms_p50"] - 1000 * args.latency)
    run["bounded_by"] = verdict(run, b, os.cpu_count() or 1)


def summary_line(label: str, run: dict[str, Any]) -> str:
    return (
        f"    {label}: {run['segments']} segments in {run['writing_s']} s ->"
        f" {run['segments_per_s']}/s; {run['llm_calls']} LLM calls; exactly once:"
        f" {run['exactly_once']}; start-up {run['startup_s']} s; bounded by {run['bounded_by']}"
    )


def render(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [
        f"Writer throughput: {a['segments']} pending segments ({a['window']} messages each) in"
        f" {a['channels']} channels; LLM test server answering after {a['latency']:g} s;"
        f" concurrency {results['concurrency']} per process; no embedder; PostgreSQL"
        f" {results.get('postgres', '?')}; {results['cores']} cores",
        "",
        "| Writer | Segments/s | Writing s | LLM calls | Each segment written once"
        " | Latency bound (in flight) | Per segment beyond the LLM call, per slot"
        " | CPU ms/segment: writers + PostgreSQL | Process start s | Load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, run in results["runs"].items():
        backend, k = key.split("_")
        label = {
            "postgres": f"PostgreSQL, {k} x `speakermem worker`",
            "sqlite": "SQLite, 1 process (bot's `Writer.flush_due`)",
            "sqliteworker": "SQLite, 1 x `speakermem worker`",
        }[backend]
        lines.append(
            f"| {label} | {run['segments_per_s']} | {run['writing_s']} | {run['llm_calls']} |"
            f" {'yes' if run['exactly_once'] else '**NO**'} | {run['bound']['segments_per_s']}/s"
            f" ({run['bound']['in_flight']}) | {run['beyond_llm_s_per_segment']:.2f} s |"
            f" {run['cpu_ms_per_segment']} + {run['db_cpu_ms_per_segment'] or '-'} |"
            f" {run['startup_s']} | {run['loadavg_start']} |"
        )
    lines.append("")
    for key, run in results["runs"].items():
        prep = run.get("before_commit_beyond_llm_ms_p50")
        split = (
            f"; of the {run['beyond_llm_s_per_segment']:.2f} s per segment beyond the LLM call,"
            f" a median {prep} ms is the Writer's own work before the commit (prompt,"
            " validation), the rest the commit and (workers) the claim rounds"
            if prep is not None
            else ""
        )
        lines.append(f"- {key}: bounded by {run['bounded_by']}{split}")
    return "\n".join(lines)
