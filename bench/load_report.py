"""The load benchmark's verdicts and report: whether the Writer's backlog stayed bounded,
and the Markdown table of a run against the targets."""

from __future__ import annotations

from typing import Any

import numpy as np
from benchlib import machine

TARGET_RECALL_P95_MS = 200.0
TARGET_LAG_P99_MS = 100.0
TARGET_RSS_SLOPE_MB_MIN = 1.0
BACKLOG_AFTER_S = 60.0
"""The Writer may fall behind while it finds the endpoint's pace; after this it must not."""
TARGET_BACKLOG_SLOPE = 5.0
"""Pending segments per minute the backlog may still grow by after the first minute (at
200 msg/s over 50 channels segments close at 8 a second: a Writer that does not keep pace
grows by hundreds a minute)."""


def writer_backlog(timeline: list[dict[str, Any]], traffic_s: float) -> dict[str, Any]:
    """The Writer queue during the traffic after its first minute: its least-squares slope
    (segments per minute), its peak then against the first minute's, and whether it stopped
    growing: a slope within the target, or (a queue that runs by fits and starts between
    write runs has a noisy slope) no peak above the first minute's."""
    rows = [
        row
        for row in timeline
        if row.get("writer_queue", -1) >= 0 and float(row["t_s"]) <= traffic_s
    ]
    early = [row["writer_queue"] for row in rows if row["t_s"] < BACKLOG_AFTER_S]
    late = [row for row in rows if row["t_s"] >= BACKLOG_AFTER_S]
    if len(late) < 3:
        return {"after_s": BACKLOG_AFTER_S, "samples": len(late), "bounded": None}
    t = np.array([float(row["t_s"]) for row in late])
    q = np.array([float(row["writer_queue"]) for row in late])
    slope = float(np.polyfit(t, q, 1)[0] * 60)
    first_peak = max(early, default=0)
    return {
        "after_s": BACKLOG_AFTER_S,
        "samples": len(late),
        "slope_segments_per_min": round(slope, 2),
        "first_minute_peak_segments": int(first_peak),
        "peak_segments": int(q.max()),
        "last_segments": int(q[-1]),
        "peak_oldest_pending_s": max(float(r.get("writer_oldest_s", 0.0)) for r in late),
        "bounded": bool(slope <= TARGET_BACKLOG_SLOPE or q.max() <= first_peak),
        "target_slope": TARGET_BACKLOG_SLOPE,
        "peak_concurrency": max((int(r.get("writer_concurrency", 0)) for r in timeline), default=0),
    }


def embed_backlog(timeline: list[dict[str, Any]], traffic_s: float) -> dict[str, Any]:
    """The embedding backlog (messages without a vector) during the traffic: its peak in
    the middle and in the last third (bounded: the last third's is no higher), and how fast
    it grew from the first sample to the last (messages/s; the embedder then kept up with
    the rate sent less that)."""
    rows = [
        (float(row["t_s"]), int(row["embed_queue"]), int(row.get("stored", 0)))
        for row in timeline
        if row.get("embed_queue", -1) >= 0 and float(row["t_s"]) <= traffic_s
    ]
    middle = [q for t, q, _ in rows if traffic_s / 3 <= t < 2 * traffic_s / 3]
    last = [q for t, q, _ in rows if t >= 2 * traffic_s / 3]
    if len(rows) < 2 or not middle or not last or rows[-1][0] <= rows[0][0]:
        return {"samples": len(rows), "bounded": None}
    (t0, q0, s0), (t1, q1, s1) = rows[0], rows[-1]
    span = t1 - t0
    if s1 <= s0:  # nothing stored during the traffic (a starved bot): no verdict
        return {"samples": len(rows), "stored_per_s": 0.0, "bounded": None}
    return {
        "samples": len(rows),
        "first": q0,
        "last": q1,
        "span_s": round(span),
        "growth_per_s": round((q1 - q0) / span, 1),
        # what the bot stored and embedded meanwhile (stored less still without a vector)
        "stored_per_s": round((s1 - s0) / span, 1),
        "embedded_per_s": round(((s1 - q1) - (s0 - q0)) / span, 1),
        "middle_third_peak": max(middle),
        "last_third_peak": max(last),
        "bounded": max(last) <= max(middle),
        # messages whose vector is an int8 draft still (a vector, but not the final one)
        "drafts_peak": max(
            (int(row.get("embed_drafts", 0)) for row in timeline if float(row["t_s"]) <= traffic_s),
            default=0,
        ),
    }


def report(r: dict[str, Any]) -> str:
    ok, bad = "✅", "❌"
    rec, lag = r["recall_ms"], r["lag_ms"]
    lost = r["sent"] - r["found"]
    dup = r["rows"] - r["found"]
    slope = r["rss_slope_mb_min_last3"]
    rows = [
        (
            "sent (Slack HTTP + Discord gateway)",
            f"{r['sent']} ({r['sent_slack']} + {r['sent_discord']}); "
            f"Slack HTTP {r['slack_statuses']}",
            "",
        ),
        (
            "stored / lost / duplicated",
            f"{r['found']} / {lost} / {dup} (rows {r['rows']}; redeliveries dropped "
            f"{r['duplicates_dropped']})",
            ok if lost == 0 and dup == 0 else bad,
        ),
        (
            f"/recall p50 / p95 / p99 / max ({rec['n']} answers, {r['recallers']} members)",
            " / ".join(f"{rec[k]:.0f}" for k in ("p50", "p95", "p99", "max"))
            + f" ms (target p95 ≤ {TARGET_RECALL_P95_MS:.0f}); errors {r['recall_errors'] or 0}",
            ok if rec["n"] and rec["p95"] <= TARGET_RECALL_P95_MS else bad,
        ),
        (
            "bot event-loop lag p50 / p99 / max (10 ms ticker)",
            " / ".join(f"{lag[k]:.1f}" for k in ("p50", "p99", "max"))
            + f" ms (target p99 ≤ {TARGET_LAG_P99_MS:.0f}; {lag['n']} ticks)",
            ok if lag["p99"] <= TARGET_LAG_P99_MS else bad,
        ),
        (
            f"RSS slope over the last {r['rss_window_s']:.0f} s",
            "n/a (too few samples)"
            if slope is None
            else f"{slope:+.2f} MB/min (target |slope| ≤ {TARGET_RSS_SLOPE_MB_MIN:.0f})",
            "" if slope is None else (ok if abs(slope) <= TARGET_RSS_SLOPE_MB_MIN else bad),
        ),
        *(
            [
                (
                    f"RSS slope from a cold start (the last {min(180.0, r['seconds']):.0f} s "
                    f"of the first {r['seconds']:.0f} s)",
                    f"{r['rss_slope_mb_min_cold']:+.2f} MB/min (not a target: the caches and "
                    "heaps still filling as the database grows from empty)",
                    "",
                )
            ]
            if r.get("rss_slope_mb_min_cold") is not None
            else []
        ),
        *(
            [
                (
                    "embedding backlog (messages without a vector)",
                    f"{eb['first']} -> {eb['last']} in {eb['span_s']} s"
                    f" ({eb['growth_per_s']:+.1f}/s); peak in the middle / last third"
                    f" {eb['middle_third_peak']} / {eb['last_third_peak']};"
                    f" int8 drafts at most {eb.get('drafts_peak', 0)}",
                    ok if eb["bounded"] else bad,
                )
            ]
            if (eb := r.get("embed_backlog") or {}).get("bounded") is not None
            else []
        ),
        (
            "stored everything after the traffic stopped",
            f"{r['backlog_drained_s']} s later (checked from one sample interval on)",
            "",
        ),
        (
            f"Writer backlog after the first {BACKLOG_AFTER_S:.0f} s (LLM {r['llm_latency_s']} s)",
            _backlog_cell(r.get("writer_backlog") or {}),
            ""
            if (r.get("writer_backlog") or {}).get("bounded") is None
            else (ok if r["writer_backlog"]["bounded"] else bad),
        ),
        ("segments at the end", str(r["segments"]), ""),
        (
            "bot exit status (SIGTERM → exit)",
            f"{r['bot_exit']} ({r['bot_stop_s']} s)",
            ok if r["bot_exit"] == 0 else bad,
        ),
    ]
    lines = [
        f"### Load: {r['rate']:.0f} msg/s for {r['seconds']:.0f} s"
        + (f" after {r['warmup_s']:.0f} s of the same warm-up" if r.get("warmup_s") else "")
        + f" over {r['channels']} channels, {r['recallers']} members recalling, Writer LLM latency "
        f"{r['llm_latency_s']} s, embedder {r['embedder']}, "
        + (
            "recall processes auto (in the bot until busy; RSS and cores: the bot and them)"
            if r.get("recall_processes") == "auto"
            else f"recall in {r['recall_processes']} processes (RSS and cores: the bot and them)"
            if r.get("recall_processes")
            else "recall in the bot process"
        ),
        "",
        "| measure | value | |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        "/recall inside the pipeline (ms, p50 / p95; the rest of the latency above is Slack "
        "transport and waiting for the bot's event loop):",
        "",
        "| stage | p50 | p95 | n |",
        "|---|---|---|---|",
        *(
            f"| {name} | {v['p50']:.1f} | {v['p95']:.1f} | {v['n']} |"
            for name, v in r.get("recall_stages_ms", {}).items()
            if v["n"]
        ),
        "",
        "| t (s) | RSS (MB) | Writer queue (deferred) | oldest pending (s) | Writer calls "
        "at once | embed queue (drafts) | stored | cores busy: bot / machine |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {row['t_s']} | {row.get('rss_mb', '-')} | {row.get('writer_queue', '-')} "
            f"({row.get('writer_deferred', '-')}) | {row.get('writer_oldest_s', '-')} | "
            f"{row.get('writer_concurrency', '-')} | {row.get('embed_queue', '-')} "
            f"({row.get('embed_drafts', '-')}) | "
            f"{row.get('stored', '-')} | {row.get('bot_cores', '-')} / "
            f"{row.get('machine_cores', '-')} |"
            for row in r["timeline"]
        ),
        "",
        f"Machine: {machine()}",
    ]
    return "\n".join(lines)


def _backlog_cell(b: dict[str, Any]) -> str:
    if b.get("bounded") is None:
        return f"n/a ({b.get('samples', 0)} samples after the first minute: run longer)"
    return (
        f"{b['slope_segments_per_min']:+.1f} segments/min (target ≤ {b['target_slope']:.0f}, "
        f"or no peak above the first minute's {b['first_minute_peak_segments']}); peak "
        f"{b['peak_segments']}, last {b['last_segments']}, oldest pending at most "
        f"{b['peak_oldest_pending_s']:.0f} s; Writer calls at once up to {b['peak_concurrency']}"
    )
