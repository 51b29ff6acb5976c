"""Web console page latency on the large-community store (issue 31): p50/p95 per page and role.

A benchmark script, not a test. It reuses the store `bench/bench_community.py` builds (the
same options pick the same cached file; it is built when absent), catches up the interaction
graph once (as the bot's background worker keeps it), starts the console in this process,
signs in as the operator, a workspace admin and a member of the big channel, and requests
each page `--requests` times per role over HTTP on 127.0.0.1. Target: every page's p95 <= 300
ms on the 1M-message store.

Usage (from the repository root):
    python bench/bench_console.py --messages 1000000 --out bench/console.json   # the target
    python bench/bench_console.py --messages 20000 --members 5000 --speakers 500 \\
        --lurkers 700 --channels 100 --records 2000 --requests 10           # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import bench_community
import community_data as community
from benchlib import machine
from benchlib.cli import write_json
from benchlib.stats import percentile
from benchlib.vectors import FakeQueryEmbedder
from benchmark_docs import commit

from speakermem.bot.settings import Settings
from speakermem.integrations.web.access import Membership, Principal
from speakermem.integrations.web.server import WebConsole
from speakermem.integrations.web.sessions import SESSION_COOKIE
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.console import ConsoleReads
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.query.pipeline import RecallPipeline

TARGET_P95_MS = 300.0
P, W = community.PLATFORM, community.WORKSPACE


def pages(record_id: int, person: str, small: str) -> list[tuple[str, str, dict[str, str] | None]]:
    """(name, path, form) of every page measured; a form means POST."""
    big = f"/c/{P}/{W}/{community.BIG.channel}"
    return [
        ("overview", "/", None),
        ("channels api", "/api/channels", None),
        ("channel (big)", big, None),
        ("channel (big), a person's records", f"{big}?person={person}", None),
        ("channel (small)", f"/c/{P}/{W}/{small}", None),
        ("search (big)", f"{big}/search", {"q": "release plan budget"}),
        ("who talks to whom (big)", f"{big}/graph", None),
        ("record", f"/records/{record_id}", None),
        ("people", f"/people?w={P}/{W}", None),
        ("people, find", f"/people?w={P}/{W}&q=an", None),
        ("person", f"/people/{P}/{W}/{person}", None),
        ("me", "/me", None),
        ("audit", "/audit", None),
        (
            "ask (big)",
            "/ask",
            {
                "channel": f"{P}/{W}/{community.BIG.channel}",
                "question": "What did the team decide about the release?",
            },
        ),
    ]


async def measure(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    engine = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=db)), FakeQueryEmbedder()
    )
    try:
        t0 = time.perf_counter()
        inferred = await engine.infer_interactions()
        print(
            f"    interaction graph: {inferred:,} messages caught up in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        settings = Settings(_env_file=None, db_path=db, embedder="none")  # type: ignore[call-arg]
        console = WebConsole(
            settings,
            ConsoleReads(engine),
            Governance(engine),
            recaller=RecallPipeline(engine),
            port=0,
        )
        await console.start()
        try:
            records = await engine.store.records.heads(await engine.channel_pks([community.BIG]))
            person = records[0].owner if records[0].owner != "GROUP" else records[0].source
            member_channels = await engine.store.channels.readable_channels(P, W, person)
            small = next(s.channel for s in member_channels if s != community.BIG)
            roles = {
                "operator": Principal(name="operator", operator=True),
                "admin": Principal(
                    name="admin",
                    platform=P,
                    user_id="U000000",
                    memberships=(Membership(P, W, "U000000", admin=True),),
                ),
                "member": Principal(
                    name="member",
                    platform=P,
                    user_id=person,
                    memberships=(Membership(P, W, person),),
                ),
            }
            out: dict[str, Any] = {}
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                for role, principal in roles.items():
                    session = console.state.sessions.create(principal, provider=None)
                    headers = {SESSION_COOKIE: console.state.sessions.cookie(session)}
                    cookie = {"Cookie": "; ".join(f"{k}={v}" for k, v in headers.items())}
                    for name, path, form in pages(records[0].id, person, small):
                        if role == "member" and name == "audit":
                            continue  # members have no audit page (403)
                        times = []
                        for i in range(args.warmup + args.requests):
                            data = None if form is None else {**form, "csrf": session.csrf}
                            t0 = time.perf_counter()
                            async with http.request(
                                "GET" if form is None else "POST",
                                console.url + path,
                                data=data,
                                headers=cookie,
                            ) as resp:
                                await resp.read()
                                status = resp.status
                            if i >= args.warmup:
                                times.append((time.perf_counter() - t0) * 1000)
                        out.setdefault(name, {})[role] = {
                            "status": status,
                            "p50_ms": round(statistics.median(times), 1),
                            "p95_ms": round(percentile(times, 95), 1),
                            "max_ms": round(max(times), 1),
                        }
                        print(
                            f"    {role:8s} {name:36s} {status} p50 "
                            f"{out[name][role]['p50_ms']:7.1f} p95 "
                            f"{out[name][role]['p95_ms']:7.1f} ms",
                            flush=True,
                        )
        finally:
            await console.stop()
    finally:
        await engine.close()
    return out


async def main_async(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"machine": machine(), "target_p95_ms": TARGET_P95_MS}
    db, results["build"] = await community.ready_store(args)
    results["store"] = {
        "messages": args.messages,
        "channels": args.channels,
        "members": args.members,
        "records": args.records,
    }
    results["pages"] = await measure(args, db)
    worst = max(v["p95_ms"] for roles in results["pages"].values() for v in roles.values())
    bad = sorted(
        {n for n, roles in results["pages"].items() for v in roles.values() if v["status"] != 200}
    )
    results["worst_p95_ms"] = worst
    results["non_200"] = bad
    results["run"] = {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": commit(short=True),
        "command": args.command,
        "note": args.note,
    }
    print(
        f"\nWorst page p95: {worst:.1f} ms (target {TARGET_P95_MS:.0f} ms); "
        f"load average {os.getloadavg()[0]:.2f}; not 200: {bad or 'none'}"
    )
    if args.out:
        await asyncio.to_thread(write_json, args.out, results)
        print(f"JSON written to {args.out}")
    return 0 if worst <= TARGET_P95_MS and not bad else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """This script's options, then bench_community.py's (which pick and build the store)."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--requests", type=int, default=30, help="timed requests per page and role")
    own.add_argument("--page-warmup", type=int, default=3, help="untimed requests first")
    own.add_argument(
        "--note", default="", help="what the docs should say about this run (conditions)"
    )
    known, rest = own.parse_known_args(argv)
    args = bench_community.parse_args(rest)
    args.requests, args.warmup, args.note = known.requests, known.page_warmup, known.note
    given = list(sys.argv[1:] if argv is None else argv)
    if "--note" in given:  # the note describes the run; it is not part of the command
        i = given.index("--note")
        del given[i : i + 2]
    args.command = shlex.join(["python", "bench/bench_console.py", *given])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
