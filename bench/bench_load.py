"""Load benchmark (issue 9): the running bot under steady traffic on both platforms.

The bot runs as its own process (`speakermem run`'s code path, `integrations.runtime.run`)
against local stand-ins, so what it measures is the bot alone:
- Slack: signed `message` events through the HTTP path (Events API), sent at half of `--rate`
  by a *sender subprocess* (its work never loads the bot's loop or the measuring process);
- Discord: MESSAGE_CREATE dispatches through the gateway stand-in (tests/standins), the other
  half of `--rate`, to an unmodified discord.py client in the bot;
- `--recallers` members each issue Slack `/recall` in a loop (signed slash commands; the
  answer comes back on `response_url`, which points at this process: latency = command sent
  to answer received);
- the Writer uses the local OpenAI-compatible test server with `--llm-latency` s per call;
  /recall runs without the LLM (the bot process gives its recall pipeline none; answers are
  extractive), so recall latency is the pipeline's own. `--recall-llm` lets it call the
  server too (an empty reply at once: the cost of the round trips, no model time).

Measured: recall p50/p95/p99; event-loop lag in the bot (a 10 ms ticker inside it); Writer
queue depth, the age of its oldest pending segment, its calls at once (adaptive) and RSS
every `--sample` s (from the bot's /metrics and /proc) and the RSS slope over the last 3
minutes; stored versus sent (from the database after the bot stopped).
Targets: recall p95 <= 200 ms, loop lag p99 <= 100 ms, no RSS growth trend over the last
3 minutes (|slope| <= 1 MB/min), 0 lost, 0 duplicated, and a bounded Writer backlog: after
the first minute pending segments grow by at most 5 a minute, or never rise above the first
minute's peak (`writer_backlog` in the JSON).

Usage (from the repository root):
    python bench/bench_load.py --rate 200 --seconds 300 --channels 50   # the defaults: auto
    python bench/bench_load.py --rate 200 --seconds 300 --channels 50 --recall-processes 2
    python bench/bench_load.py --warmup 120 --recall-processes 2   # measured after 2 minutes
    python bench/bench_load.py --seconds 30 --embedder none               # quick
    python bench/bench_load.py --recall-processes 0 --heap-log heap.jsonl  # where RSS goes
`--recall-processes N` runs /recall in N worker processes (SPEAKERMEM_RECALL_PROCESSES;
`auto`, the default, moves it to worker processes once the bot is busy);
RSS and cores then count the bot and them. `--warmup S` runs the same traffic for S seconds
first: the RSS slope then describes a bot that has been running, while its caches and heaps
no longer fill from an empty database (the cold figure is reported beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
from benchlib import REPO_ROOT, pct
from benchlib.cli import add_json_option, write_json
from benchlib.host import machine_busy_seconds, tree_cpu_seconds, tree_rss_mb
from load_report import embed_backlog, report, writer_backlog
from load_roles import SECRET, bot_main, sender_main

SCRIPT = str(Path(__file__).resolve())
QUESTIONS = (
    "What about the deploy?",
    "When is the budget review?",
    "Who talked about the launch?",
    "What did people say about the database backup?",
    "Any news on the holiday plans?",
)
log = logging.getLogger("bench_load")


def bot_settings() -> Any:
    """What the bot would use (its environment, else bot/settings.py's defaults), so the
    benchmark's defaults are the bot's and defined there once."""
    from speakermem.bot.settings import Settings

    return Settings(_env_file=None)  # type: ignore[call-arg]


def guild_with_channels(n: int) -> tuple[dict[str, Any], list[str]]:
    from tests.standins.discord_guild import CATEGORY, GUILD_ID, default_guild

    guild = default_guild()
    ids = [f"7000000000000{i + 100:05d}" for i in range(n)]
    for pos, cid in enumerate(ids):
        guild["channels"].append(
            {
                "guild_id": GUILD_ID,
                "nsfw": False,
                "rate_limit_per_user": 0,
                "id": cid,
                "type": 0,
                "name": f"load-{pos:02d}",
                "position": 10 + pos,
                "parent_id": CATEGORY,
                "permission_overwrites": [],
            }
        )
    return guild, ids


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|[+-]Inf|NaN)$")


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def slope_mb_per_min(
    samples: list[tuple[float, float]], window_s: float, end: float | None = None
) -> float | None:
    """Least-squares slope of RSS over the `window_s` seconds up to `end` (default: the
    last sample), in MB per minute."""
    if not samples:
        return None
    if end is None:
        end = samples[-1][0]
    tail = [(t, mb) for t, mb in samples if end - window_s <= t <= end]
    if len(tail) < 3:
        return None
    t = np.array([x for x, _ in tail])
    y = np.array([mb for _, mb in tail])
    return float(np.polyfit(t, y, 1)[0] * 60)


async def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import aiohttp
    from aiohttp import web

    from speakermem.memory.config import MemoryConfig, StoreConfig
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.models import Scope
    from tests.llm_server import Delay, Handler, LLMServer, Reply
    from tests.standins.discord_gateway import DiscordStandIn
    from tests.standins.discord_guild import GUILD_ID
    from tests.standins.slack_api import BOT_USER_ID, TEAM_ID, SlackApiStandIn, sign
    from tests.test_run import free_port

    slack_channels = max(1, args.channels // 2)
    discord_channels = max(1, args.channels - slack_channels)
    recallers = [f"U9{i:03d}" for i in range(args.recallers)]
    users = {f"U{i:04d}": {"name": f"user{i}"} for i in range(slack_channels * 5)}
    users.update({u: {"name": f"asker{u}"} for u in recallers})
    members = {
        f"C{c:04d}": [f"U{u:04d}" for u in range(slack_channels * 5) if u % slack_channels == c]
        + recallers
        + [BOT_USER_ID]
        for c in range(slack_channels)
    }
    slack = await SlackApiStandIn(users=users, members=members, page_size=200).start()
    guild, dchannels = guild_with_channels(discord_channels)
    discord = await DiscordStandIn(guild=guild).start()
    writer_noop = Reply(content=json.dumps({"actions": []}))

    def route(body: dict[str, Any]) -> Any:
        system = str((body.get("messages") or [{}])[0].get("content", ""))
        if system.startswith("You are the Writer"):  # whatever structured mode was chosen
            return Delay(args.llm_latency, then=writer_noop)
        return Reply(content="")  # recall-side calls: no model time

    llm = await LLMServer(default=Handler(route)).start()

    answers: dict[str, asyncio.Future[float]] = {}

    async def on_response(request: web.Request) -> web.Response:
        fut = answers.pop(request.match_info["key"], None)
        await request.read()
        if fut is not None and not fut.done():
            fut.set_result(time.monotonic())
        return web.json_response({"ok": True})

    collector = web.Application()
    collector.router.add_post("/r/{key}", on_response)
    collector_runner = web.AppRunner(collector, access_log=None)
    await collector_runner.setup()
    collector_port = free_port()
    await web.TCPSite(collector_runner, "127.0.0.1", collector_port).start()

    slack_port, ops_port = free_port(), free_port()
    settings: dict[str, Any] = {
        "db_path": str(tmp / "load.db"),
        "embedder": args.embedder,
        "llm_base_url": llm.base_url,
        "llm_model": "test-model",
        "llm_max_retries": 0,
        "slack_bot_token": "xoxb-bench",
        "slack_signing_secret": SECRET,
        "slack_mode": "http",
        "slack_http_host": "127.0.0.1",
        "slack_http_port": slack_port,
        "slack_api_url": slack.base_url,
        "discord_token": "standin-token",
        "discord_api_url": discord.api_base,
        "discord_gateway_url": discord.gateway_url,
        "ops_host": "127.0.0.1",
        "ops_port": ops_port,
        "recall_processes": args.recall_processes,
    }
    config = tmp / "bot.json"
    config.write_text(
        json.dumps(
            {
                "settings": settings,
                "lag_out": str(tmp / "lag.jsonl"),
                "stages_out": str(tmp / "stages.jsonl"),
                "recall_llm": args.recall_llm,
                "profile": str(args.profile.resolve()) if args.profile else None,
                "tracemalloc": str(args.tracemalloc.resolve()) if args.tracemalloc else None,
                "heap_log": str(args.heap_log.resolve()) if args.heap_log else None,
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    bot = await asyncio.create_subprocess_exec(
        sys.executable, SCRIPT, "--role", "bot", "--bot-config", str(config), cwd=REPO_ROOT, env=env
    )
    ops = f"http://127.0.0.1:{ops_port}"
    slack_url = f"http://127.0.0.1:{slack_port}/slack/events"
    http = aiohttp.ClientSession()
    sender: asyncio.subprocess.Process | None = None
    try:
        # ---- wait for the bot: both platforms connected
        up_by = time.monotonic() + args.start_timeout
        while True:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                async with http.get(f"{ops}/healthz") as resp:
                    facts = (await resp.json())["facts"]
                    if all(facts["platforms"].get(p) for p in ("slack", "discord")):
                        break
            if bot.returncode is not None or time.monotonic() > up_by:
                raise RuntimeError("the bot did not come up (both platforms connected)")
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # start-up catch-up and command sync settle

        # ---- the Slack sender subprocess
        sender = await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--role",
            "sender",
            "--sender-url",
            slack_url,
            "--rate",
            str(args.rate / 2),
            "--seconds",
            str(args.warmup + args.seconds),
            "--channels",
            str(slack_channels),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
            env=env,
        )
        assert sender.stdin is not None and sender.stdout is not None
        if (await sender.stdout.readline()).strip() != b"READY":
            raise RuntimeError("sender did not start")

        stop = asyncio.Event()
        discord_sent: dict[str, list[str]] = {}
        recall_ms: list[float] = []
        recall_errors: dict[str, int] = {}
        timeline: list[dict[str, Any]] = []
        rss: list[tuple[float, float]] = []
        authors = [m for m in guild["members"] if not m["user"].get("bot")]

        async def discord_traffic() -> None:
            rate = args.rate / 2
            t0, i = time.monotonic(), 0
            while not stop.is_set():
                cid = dchannels[i % len(dchannels)]
                author = authors[i % len(authors)]
                words = " ".join(QUESTIONS[(i + k) % len(QUESTIONS)].split()[1] for k in range(3))
                payload = discord.message_create(
                    f"discord {i}: {words} update", author=author["user"], channel_id=cid
                )
                payload["member"] = {k: v for k, v in author.items() if k != "user"}
                await discord.dispatch("MESSAGE_CREATE", payload)
                discord_sent.setdefault(cid, []).append(payload["id"])
                i += 1
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

        async def recaller(k: int) -> None:
            n = 0
            while not stop.is_set():
                key = f"{k}-{n}"
                channel = f"C{(k + n) % slack_channels:04d}"
                form = urlencode(
                    {
                        "command": "/recall",
                        "text": QUESTIONS[(k + n) % len(QUESTIONS)],
                        "user_id": recallers[k],
                        "user_name": f"asker{k}",
                        "channel_id": channel,
                        "team_id": TEAM_ID,
                        "response_url": f"http://127.0.0.1:{collector_port}/r/{key}",
                        "trigger_id": f"1.{k}.{n}",
                    }
                )
                headers = {
                    **sign(SECRET, int(time.time()), form),
                    "Content-Type": "application/x-www-form-urlencoded",
                }
                fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                answers[key] = fut
                started = time.monotonic()
                try:
                    async with http.post(slack_url, data=form, headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"http {resp.status}")
                    done = await asyncio.wait_for(fut, 30)
                    recall_ms.append((done - started) * 1000)
                except Exception as exc:
                    answers.pop(key, None)
                    name = type(exc).__name__
                    recall_errors[name] = recall_errors.get(name, 0) + 1
                n += 1
                await asyncio.sleep(args.recall_pause)

        async def sampler() -> None:
            t0 = time.monotonic()
            last = (t0, tree_cpu_seconds(bot.pid), machine_busy_seconds())
            while True:
                now = time.monotonic()
                row: dict[str, Any] = {"t_s": round(now - t0)}
                bot_cpu, busy = tree_cpu_seconds(bot.pid), machine_busy_seconds()
                if now > last[0] and bot_cpu is not None and last[1] is not None:
                    # cores in use since the last sample: the bot's, and the whole machine's
                    row["bot_cores"] = round((bot_cpu - last[1]) / (now - last[0]), 2)
                    row["machine_cores"] = round((busy - last[2]) / (now - last[0]), 2)
                last = (now, bot_cpu, busy)
                mb = tree_rss_mb(bot.pid)
                if mb is not None:
                    rss.append((time.monotonic() - t0, mb))
                    row["rss_mb"] = round(mb, 1)
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{ops}/metrics") as resp:
                        m = parse_metrics(await resp.text())
                    row["writer_queue"] = int(m.get("speakermem_writer_queue_segments", -1))
                    row["writer_deferred"] = int(m.get("speakermem_writer_deferred_segments", 0))
                    row["writer_oldest_s"] = round(
                        m.get("speakermem_writer_oldest_pending_seconds", 0.0), 1
                    )
                    row["writer_concurrency"] = int(m.get("speakermem_writer_concurrency", 0))
                    row["writer_tokens_per_1k"] = round(
                        m.get("speakermem_writer_tokens_per_1k_messages", 0.0)
                    )
                    row["embed_queue"] = int(m.get("speakermem_embed_queue_messages", -1))
                    row["embed_drafts"] = int(m.get("speakermem_embed_draft_messages", 0))
                    row["stored"] = int(
                        m.get('speakermem_events_handled_total{outcome="message_stored"}', 0)
                    )
                timeline.append(row)
                await asyncio.sleep(args.sample)

        t_start = time.monotonic()
        load_start = os.getloadavg()[0]
        sender.stdin.write(b"go\n")
        await sender.stdin.drain()
        sampling = asyncio.create_task(sampler())
        workers = [asyncio.create_task(discord_traffic())] + [
            asyncio.create_task(recaller(k)) for k in range(args.recallers)
        ]
        await asyncio.sleep(args.warmup + args.seconds)
        t_end = time.monotonic()
        load_end = os.getloadavg()[0]
        stop.set()
        out, _ = await sender.communicate()
        slack_summary = json.loads(out.decode().strip().splitlines()[-1])
        await asyncio.gather(*workers, return_exceptions=True)
        await asyncio.sleep(args.sample)  # one more sample after the traffic
        sampling.cancel()

        # ---- everything sent must be stored: wait for the count, then stop the bot
        slack_sent = slack_summary["sent"]
        total_sent = sum(map(len, slack_sent.values())) + sum(map(len, discord_sent.values()))
        # the bot may be behind: wait while it makes progress (up to --settle s), so what is
        # measured is loss, not a backlog cut off by the SIGTERM below
        traffic_end = time.monotonic()
        settle_by = traffic_end + args.settle
        stored_metric = duplicates = last = 0
        last_progress = traffic_end
        while time.monotonic() < settle_by and time.monotonic() - last_progress < 30:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{ops}/metrics") as resp:
                    m = parse_metrics(await resp.text())
                stored_metric = int(
                    m.get('speakermem_events_handled_total{outcome="message_stored"}', 0)
                )
                duplicates = int(
                    m.get('speakermem_events_handled_total{outcome="message_duplicate"}', 0)
                )
                if stored_metric >= total_sent:
                    break
                if stored_metric > last:
                    last, last_progress = stored_metric, time.monotonic()
            await asyncio.sleep(0.5)
        backlog_s = time.monotonic() - t_end
    finally:
        stop_started = time.monotonic()
        if bot.returncode is None:
            bot.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(bot.wait(), 120)
        except TimeoutError:
            bot.kill()
            await bot.wait()
        stop_s = time.monotonic() - stop_started
        if sender is not None and sender.returncode is None:
            sender.kill()
            await sender.wait()
        await http.close()
        await collector_runner.cleanup()
        await llm.stop()
        await discord.close()
        await slack.close()

    # ---- stored versus sent, from the database
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=tmp / "load.db")))
    try:
        found = 0
        for channel, ids in slack_sent.items():
            scope = Scope(platform="slack", workspace=TEAM_ID, channel=channel)
            found += len(await engine.store.messages.by_ids(scope, ids))
        for channel, ids in discord_sent.items():
            scope = Scope(platform="discord", workspace=GUILD_ID, channel=channel)
            found += len(await engine.store.messages.by_ids(scope, ids))
        rows = (await engine.store.messages.counts())["messages"]
        segments = await engine.store.segments.counts()
    finally:
        await engine.close()
    lag_file = tmp / "lag.jsonl"
    lines = lag_file.read_text().splitlines() if lag_file.exists() else []
    lag = [ms for line in lines for t, ms in json.loads(line) if t_start <= t <= t_end]
    stages_file = tmp / "stages.jsonl"
    stage_rows = (
        [json.loads(line) for line in stages_file.read_text().splitlines()]
        if stages_file.exists()
        else []
    )
    stage_names = sorted({k for row in stage_rows for k in row})
    return {
        "recall_stages_ms": {
            k: pct([row[k] for row in stage_rows if k in row]) for k in stage_names
        },
        "rate": args.rate,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "channels": args.channels,
        "recallers": args.recallers,
        "embedder": args.embedder,
        "recall_processes": args.recall_processes,
        "llm_latency_s": args.llm_latency,
        "bot_exit": bot.returncode,
        "bot_stop_s": round(stop_s, 1),
        "backlog_drained_s": round(backlog_s, 1),
        "sent": total_sent,
        "sent_slack": sum(map(len, slack_sent.values())),
        "sent_discord": sum(map(len, discord_sent.values())),
        "slack_statuses": slack_summary["statuses"],
        "slack_send_s": round(slack_summary["send_s"], 1),
        "found": found,
        "rows": rows,
        "duplicates_dropped": duplicates,
        "segments": segments,
        "recall_ms": pct(recall_ms),
        "recall_errors": recall_errors,
        "lag_ms": pct(lag),
        "timeline": timeline,
        "writer_backlog": writer_backlog(timeline, args.warmup + args.seconds),
        "embed_backlog": embed_backlog(timeline, args.warmup + args.seconds),
        "loadavg_1m": [round(load_start, 2), round(load_end, 2)],
        "rss_slope_mb_min_last3": slope_mb_per_min(rss, 180.0),
        "rss_window_s": min(180.0, rss[-1][0] - rss[0][0]) if len(rss) > 1 else 0.0,
        # the same window counted from a cold start: the last 3 of the first --seconds
        "rss_slope_mb_min_cold": slope_mb_per_min(rss, 180.0, end=args.seconds)
        if args.warmup
        else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Load benchmark of the running bot (issue 9).")
    bot = bot_settings()
    p.add_argument("--rate", type=float, default=200.0, help="messages per second, in all")
    p.add_argument("--seconds", type=float, default=300.0, help="the measured traffic (s)")
    p.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="seconds of the same traffic before the measured --seconds: a bot that has been "
        "running a while, not one whose database and caches start empty. The RSS slope is "
        "then the measured window's; sent/stored, /recall latency and loop lag count the "
        "warm-up too",
    )
    p.add_argument("--channels", type=int, default=50, help="half Slack, half Discord")
    p.add_argument("--recallers", type=int, default=10, help="members issuing /recall")
    p.add_argument("--recall-pause", type=float, default=0.2, help="between a member's recalls")
    p.add_argument(
        "--llm-latency",
        type=float,
        default=1.0,
        help="seconds the fake Writer LLM takes per call (it answers any number at once, as a "
        "batching server does); the JSON's writer_backlog says whether the Writer kept pace",
    )
    p.add_argument(
        "--embedder",
        choices=["minilm", "none"],
        default=bot.embedder,
        help="as the bot (default: the bot's own, SPEAKERMEM_EMBEDDER or its default)",
    )
    p.add_argument(
        "--recall-llm",
        action="store_true",
        help="let /recall call the LLM too (default: recall without it, answers extractive)",
    )
    p.add_argument(
        "--recall-processes",
        type=lambda v: v if v == "auto" else int(v),
        default=bot.recall_processes,
        help="SPEAKERMEM_RECALL_PROCESSES of the bot: auto, 0 or N (default: the bot's own, "
        "that variable or its default, auto); RSS and cores then count the bot and its recall "
        "processes",
    )
    p.add_argument("--sample", type=float, default=15.0, help="RSS/queue sample interval (s)")
    p.add_argument(
        "--settle",
        type=float,
        default=1800.0,
        help="after the traffic, wait up to this long for stored == sent while the bot makes "
        "progress (s)",
    )
    p.add_argument("--start-timeout", type=float, default=120.0)
    add_json_option(p)
    p.add_argument(
        "--profile", type=Path, help="run the bot under cProfile; top functions to this file"
    )
    p.add_argument(
        "--tracemalloc",
        type=Path,
        help="trace the bot's Python allocations; what grew after the first minute, by call"
        " site, to this file (slows the bot: for finding growth, not for the figures)",
    )
    p.add_argument(
        "--heap-log",
        type=Path,
        help="every 5 s append where the bot's anonymous memory is (glibc's counters, SQLite's,"
        " Python's blocks, each anonymous mapping) to this file, as JSON lines",
    )
    p.add_argument("--role", choices=["measure", "bot", "sender"], default="measure")
    p.add_argument("--bot-config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--sender-url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "bot":
        logging.basicConfig(level=logging.WARNING, format="bot %(levelname)s %(name)s: %(message)s")
        cfg = json.loads(args.bot_config.read_text())
        if not cfg.get("profile"):
            return asyncio.run(bot_main(cfg))
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            return asyncio.run(bot_main(cfg))
        finally:
            profiler.disable()
            with open(cfg["profile"], "w") as fh:
                pstats.Stats(profiler, stream=fh).sort_stats("tottime").print_stats(40)
    if args.role == "sender":
        asyncio.run(sender_main(args))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    print(report(result))
    if args.json:
        write_json(args.json, result)
    ok = result["sent"] == result["found"] == result["rows"] and result["bot_exit"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
