"""Community-scale benchmark: /recall cost and pack size with thousands of people (issue 12).

A benchmark script, not a test. It builds once (cached under --db-dir, reused afterwards) a
synthetic workspace of 1,000 channels and 50,000 members: one big channel where 5,000
active speakers wrote 100,000 messages (Zipf-weighted speakers, topic sessions, occasional
name mentions) and 7,000 more members only read, 999 small channels of about 100 members
and 20 messages each, and 20,000 derived records in the big channel (about 10% GROUP, 15%
provided by someone about someone else, 10% updates that supersede an earlier record).
Message and record vectors are synthetic random unit vectors (the scans cost the same).

Stages (--stages, default all):
- `recall`: `RecallPipeline` with no LLM (deterministic Project, fused Select, extractive
  answer) on questions that name one person, two people, or nobody, asked by a member of the
  channel. Reports p50/p95 per kind, per-stage p95, pack tokens (mean, max, share within
  s1+s2), people rows and System 2 store queries per question. Target: p95 <= 100 ms.
- `slack`: roster sync of a 10,000-member channel in a 10,000-member workspace against the
  local Slack stand-in (tests/standins/slack_api.py): paged `users.list` (cached) instead of
  one `users.info` per member; API calls, wall time, and a run with 429 + Retry-After.
- `discord`: the Discord permission state for 100,000 members across 1,000 channels (as
  member events would fill it), readable channels of 5,000 askers through the permission
  cache (cold and cached), and the RSS that costs.

Usage (from the repository root):
    python bench/bench_community.py                     # build once (~2-4 min), then measure
    python bench/bench_community.py --stages recall --questions 300
    python bench/bench_community.py --out /tmp/community.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import machine
from benchlib.cli import write_json
from benchlib.host import maxrss_mb, own_rss_mb
from benchlib.stats import percentile
from benchlib.vectors import FakeQueryEmbedder
from community_data import BIG, KINDS, PLATFORM, Community, ready_store

from speakermem.memory.config import MemoryConfig, RecallConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, Scope
from speakermem.memory.query.compose import approx_tokens, render_pack
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest

TARGET_P95_MS = 100.0
STAGES = ("access", "project", "system1", "system2", "compose", "answer")


# ----------------------------------------------------------------------------------------------
# Stage: recall


async def stage_recall(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    com = Community(args.seed, args.members, args.speakers)
    qrng = Community(args.seed + 99, args.members, args.speakers)
    qrng.names = com.names
    questions = [(kind, qrng.question(kind, i)) for i in range(args.questions) for kind in KINDS]
    cfg = (
        RecallConfig()
        if args.interaction_catchup is None
        else RecallConfig(interaction_catchup=args.interaction_catchup)
    )
    cap = cfg.s1_pack_tokens + cfg.s2_pack_tokens
    engine = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=db)), FakeQueryEmbedder()
    )
    try:
        (n_msgs,) = (await engine.store.db.read("SELECT count(*) FROM messages"))[0]
        (n_recs,) = (await engine.store.db.read("SELECT count(*) FROM records"))[0]
        (n_chan,) = (await engine.store.db.read("SELECT count(*) FROM channels"))[0]
        (n_users,) = (await engine.store.db.read("SELECT count(*) FROM users"))[0]
        roster = await engine.members(BIG)
        t0 = time.perf_counter()
        inferred = await engine.infer_interactions()  # what the live worker keeps current
        graph_s = time.perf_counter() - t0
        print(f"    interaction graph: {inferred:,} messages caught up in {graph_s:.1f} s")
        pipe = RecallPipeline(engine, config=cfg)
        askers = [m.user_id for m in roster]
        for _, q in questions[: args.warmup]:
            await pipe.run(RecallRequest(q, BIG, asker=askers[0]))
        per: dict[str, dict[str, list[float]]] = {
            k: {"ms": [], "tokens": [], "people": [], "queries": [], **{s: [] for s in STAGES}}
            for k in KINDS
        }
        over = 0
        slowest: list[tuple[float, str, dict[str, float]]] = []
        for i, (kind, q) in enumerate(questions):
            req = RecallRequest(q, BIG, asker=askers[i % len(askers)])
            t0 = time.perf_counter()
            result = await pipe.run(req)
            ms = (time.perf_counter() - t0) * 1000
            tokens = approx_tokens(render_pack(result.pack))
            over += tokens > cap
            d = per[kind]
            d["ms"].append(ms)
            d["tokens"].append(tokens)
            d["people"].append(len([r for r in result.rows if r.key != GROUP]))
            d["queries"].append(result.trace.s2_people.get("queries", 0))
            for s in STAGES:
                d[s].append(result.trace.latency_ms.get(s, 0.0))
            slowest.append((ms, q, result.trace.latency_ms))
        slowest.sort(key=lambda x: -x[0])
        kinds = {
            k: {
                "questions": len(d["ms"]),
                "p50_ms": round(percentile(d["ms"], 50), 1),
                "p95_ms": round(percentile(d["ms"], 95), 1),
                "max_ms": round(max(d["ms"]), 1),
                "pack_tokens_mean": round(statistics.fmean(d["tokens"]), 1),
                "pack_tokens_max": int(max(d["tokens"])),
                "people_rows_max": int(max(d["people"])),
                "s2_queries_max": int(max(d["queries"])),
                "stages_p95_ms": {s: round(percentile(d[s], 95), 2) for s in STAGES},
            }
            for k, d in per.items()
        }
        return {
            "data": {
                "channels": n_chan,
                "members": n_users,
                "big_channel_roster": len(roster),
                "messages": n_msgs,
                "records": n_recs,
            },
            "budget_tokens": cap,
            "packs_over_budget": over,
            "kinds": kinds,
            "slowest": [{"ms": round(ms, 1), "q": q, "stages": st} for ms, q, st in slowest[:5]],
            "rss_mb": round(own_rss_mb(), 1),
            "maxrss_mb": round(maxrss_mb(), 1),
            "interaction_catchup": cfg.interaction_catchup,
            "graph_caught_up": {"messages": inferred, "seconds": round(graph_s, 1)},
        }
    finally:
        await engine.close()


def report_recall(r: dict[str, Any]) -> str:
    d = r["data"]
    lines = [
        "## /recall at community scale (no LLM, fake query embedder)",
        "",
        f"Data: {d['channels']:,} channels, {d['members']:,} members; big channel: roster"
        f" {d['big_channel_roster']:,}, {d['messages']:,} messages in all, {d['records']:,}"
        " records",
        "",
        "| question kind | n | p50 ms | p95 ms | max ms | pack tokens mean / max | people rows max"
        " | S2 queries max | p95 <= 100 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, v in r["kinds"].items():
        lines.append(
            f"| {k} | {v['questions']} | {v['p50_ms']} | {v['p95_ms']} | {v['max_ms']} |"
            f" {v['pack_tokens_mean']} / {v['pack_tokens_max']} | {v['people_rows_max']} |"
            f" {v['s2_queries_max']} | {'yes' if v['p95_ms'] <= TARGET_P95_MS else '**no**'} |"
        )
    lines += [
        "",
        "Stage p95 ms: "
        + "; ".join(
            f"{k}: " + ", ".join(f"{s} {ms}" for s, ms in v["stages_p95_ms"].items())
            for k, v in r["kinds"].items()
        ),
    ]
    lines.append(
        f"Packs over the {r['budget_tokens']:,}-token budget: {r['packs_over_budget']}."
        f" RSS {r['rss_mb']} MB (peak {r['maxrss_mb']} MB)."
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Stage: slack


async def _sync(
    standin: Any, db: Path, channels: list[str], *, retry_after: int = 0
) -> dict[str, Any]:
    from slack_sdk.web.async_client import AsyncWebClient

    from speakermem.integrations.slack.roster_sync import SlackDirectory, sync_channel_roster

    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)), None)
    directory = SlackDirectory(AsyncWebClient(token="xoxb-bench", base_url=standin.base_url))
    standin.calls.clear()
    if retry_after:
        standin.rate_limit("users.list", retry_after=retry_after)
    rss0 = own_rss_mb()
    t0 = time.perf_counter()
    try:
        members = 0
        for ch in channels:
            scope = Scope(platform=PLATFORM, workspace=standin.team_id, channel=ch)
            members += (await sync_channel_roster(engine, directory, scope)).members
        elapsed = time.perf_counter() - t0
        roster = await engine.members(
            Scope(platform=PLATFORM, workspace=standin.team_id, channel=channels[0])
        )
    finally:
        await engine.close()
    calls: dict[str, int] = {}
    for method, _ in standin.calls:
        calls[method] = calls.get(method, 0) + 1
    return {
        "channels": len(channels),
        "members_synced": members,
        "first_channel_roster": len(roster),
        "seconds": round(elapsed, 2),
        "api_calls": calls,
        "retry_after_waited_s": retry_after,
        "rss_growth_mb": round(own_rss_mb() - rss0, 1),
    }


async def stage_slack(args: argparse.Namespace) -> dict[str, Any]:
    """Roster sync through the local Slack stand-in: a 10,000-member channel of a
    10,000-member workspace, the same with one 429, then 100,000 members over 1,000 channels."""
    import tempfile

    from tests.standins.slack_api import SlackApiStandIn

    out: dict[str, Any] = {}
    n = args.slack_members
    users = {f"U{i:06d}": {"name": f"u{i}", "real_name": f"User {i}"} for i in range(n)}
    standin = SlackApiStandIn(users=users, members={"CALL": list(users)}, page_size=1_000)
    await standin.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out["one_channel"] = await _sync(standin, Path(tmp) / "a.db", ["CALL"])
            out["one_channel_with_429"] = await _sync(
                standin, Path(tmp) / "b.db", ["CALL"], retry_after=1
            )
    finally:
        await standin.close()
    out["previous_design_calls"] = (
        f"users.info once per member ({n:,}) + conversations.members pages of 200"
        f" ({-(-n // 200)}), by reading the replaced code"
    )
    big = args.rss_members
    users = {f"U{i:06d}": {"name": f"u{i}", "real_name": f"User {i}"} for i in range(big)}
    per = big // args.rss_channels
    members = {
        f"C{c:04d}": [f"U{i:06d}" for i in range(c * per, (c + 1) * per)]
        for c in range(args.rss_channels)
    }
    standin = await SlackApiStandIn(users=users, members=members, page_size=1_000).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out["many_channels"] = await _sync(standin, Path(tmp) / "c.db", list(members))
    finally:
        await standin.close()
    out["maxrss_mb"] = round(maxrss_mb(), 1)
    return out


# ----------------------------------------------------------------------------------------------
# Stage: discord


def stage_discord(args: argparse.Namespace) -> dict[str, Any]:
    """The Discord permission state for --rss-members members across --rss-channels channels
    (every 10th channel only for a role half the members hold), and the permission cache for
    5,000 askers: RSS growth, cold and cached readable-channel time."""
    import gc

    from speakermem.integrations.discord import translate as tr
    from speakermem.integrations.discord.adapter import GuildState
    from speakermem.integrations.discord.members import PermissionCache

    gc.collect()
    rss0 = own_rss_mb()
    n, c = args.rss_members, args.rss_channels
    hidden = [
        {"id": "G", "type": 0, "allow": "0", "deny": str(tr.VIEW_CHANNEL)},
        {"id": "R1", "type": 0, "allow": str(tr.VIEW_CHANNEL), "deny": "0"},
    ]
    t0 = time.perf_counter()
    state = GuildState.from_guild_create(
        {
            "id": "G",
            "owner_id": "O",
            "member_count": n,
            "roles": [
                {"id": "G", "permissions": str(tr.READ_CHANNEL)},
                {"id": "R1", "permissions": "0"},
            ],
            "channels": [
                {
                    "id": f"C{i}",
                    "type": 0,
                    "name": f"c{i}",
                    "permission_overwrites": hidden if i % 10 == 0 else [],
                }
                for i in range(c)
            ],
        }
    )
    for i in range(n):  # as member chunks / events would bring them
        state.put_member(
            {"user": {"id": f"M{i:06d}", "username": f"m{i}"}, "roles": ["R1"] if i % 2 else []}
        )
    build_s = time.perf_counter() - t0
    gc.collect()
    rss_state = own_rss_mb()
    cache = PermissionCache()
    cold: list[float] = []
    warm: list[float] = []
    for i in range(5_000):
        roles = ["R1"] if i % 2 else []
        t0 = time.perf_counter()
        cache.readable(state, f"M{i:06d}", roles)
        cold.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        cache.readable(state, f"M{i:06d}", roles)
        warm.append((time.perf_counter() - t0) * 1000)
    gc.collect()
    return {
        "members": n,
        "channels": c,
        "state_build_s": round(build_s, 2),
        "rss_state_mb": round(rss_state - rss0, 1),
        "rss_state_and_cache_mb": round(own_rss_mb() - rss0, 1),
        "cached_answers": len(cache),
        "readable_cold_p50_ms": round(percentile(cold, 50), 3),
        "readable_cached_p50_ms": round(percentile(warm, 50), 4),
    }


# ----------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    stages = args.stages.split(",")
    results: dict[str, Any] = {"machine": machine()}
    ok = True
    if "recall" in stages:
        db, results["build"] = await ready_store(args)
        r = await stage_recall(args, db)
        results["recall"] = r
        print(report_recall(r))
        ok &= all(v["p95_ms"] <= TARGET_P95_MS for v in r["kinds"].values())
        ok &= r["packs_over_budget"] == 0
    if "discord" in stages:
        results["discord"] = stage_discord(args)
        print(json.dumps(results["discord"], indent=2))
    if "slack" in stages:
        results["slack"] = await stage_slack(args)
        print(json.dumps(results["slack"], indent=2))
    print(f"\nMachine: {results['machine']}; load average {os.getloadavg()[0]:.2f}")
    if args.out:
        await asyncio.to_thread(write_json, args.out, results)
        print(f"JSON written to {args.out}")
    return 0 if ok else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db-dir", default="/tmp/speakermem-bench-community")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--stages", default="recall,slack,discord")
    p.add_argument("--channels", type=int, default=1_000)
    p.add_argument("--members", type=int, default=50_000)
    p.add_argument("--speakers", type=int, default=5_000)
    p.add_argument("--lurkers", type=int, default=7_000, help="big-channel members who never talk")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--questions", type=int, default=100, help="per question kind")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--slack-members", type=int, default=10_000)
    p.add_argument("--rss-members", type=int, default=100_000)
    p.add_argument("--rss-channels", type=int, default=1_000)
    p.add_argument(
        "--interaction-catchup",
        type=int,
        default=None,
        help="RecallConfig.interaction_catchup (default: the product's). Before measuring, the"
        " interaction graph is caught up once, as the bot's background worker keeps it",
    )
    p.add_argument("--out")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
