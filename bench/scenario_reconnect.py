"""Scenario: platform reconnects while messages are being posted (issue 9): 0 lost, 0 doubled.

The bot is the real runtime (`integrations.runtime.run`, what `speakermem run` runs) with an
unmodified discord.py client or slack-bolt Socket Mode client, against the local stand-ins
(tests/standins). For each case a poster sends `--messages` messages, one every
`--interval` s, and the connection is closed halfway through, with `--burst` of them posted
at once right after the close; then stored is compared with sent, from the database.

Discord gateway close codes (the stand-in behaves like Discord's gateway: what is posted
while no session is live goes to channel history and is replayed only on a RESUME):
- 1000, 1001 (normal closure, going away) and 4000 (unknown error): discord.py RESUMEs and
  the gateway replays what was missed;
- 4009 (session timed out): the RESUME is refused, the client identifies anew (a new
  session, nothing replayed) and the adapter catches up from REST history;
- 4014 (disallowed intents): fatal; the process must exit non-zero (a supervisor restarts
  it), and the restarted bot catches up on what was posted meanwhile.
Slack Socket Mode: the stand-in drops the socket while events are queued; the client
reconnects (apps.connections.open). Envelopes sent but never acked are redelivered, as
Slack retries unacknowledged envelopes.

Usage (from the repository root):
    python bench/scenario_reconnect.py
    python bench/scenario_reconnect.py --cases 4000 4009 slack --messages 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchlib import machine
from benchlib.cli import add_json_option, write_json

from speakermem.bot.settings import Settings
from speakermem.integrations.runtime import run
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import GENERAL, GUILD_ID
from tests.standins.slack_api import BOT_USER_ID, TEAM_ID, SlackApiStandIn

log = logging.getLogger("scenario_reconnect")
DISCORD_CODES = {
    1000: "normal closure",
    1001: "going away",
    4000: "unknown error",
    4009: "session timed out",
    4014: "disallowed intents",
}


async def stored_ids(db: Path, scope: Scope, ids: list[str]) -> tuple[int, int]:
    """(distinct sent ids found, rows in the channel) read from the database."""
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        found = len(await engine.store.messages.by_ids(scope, ids))
        rows = await engine.store.db.read(
            "SELECT count(*) FROM messages WHERE platform = ? AND workspace = ? AND channel = ?",
            scope.key(),
        )
        return found, int(rows[0][0])
    finally:
        await engine.close()


async def until(check: Callable[[], Awaitable[bool]], seconds: float) -> bool:
    for _ in range(int(seconds / 0.2)):
        if await check():
            return True
        await asyncio.sleep(0.2)
    return await check()


async def stop_bot(stop: asyncio.Event, bot: asyncio.Task[int]) -> int | None:
    stop.set()
    try:
        return await asyncio.wait_for(bot, 60)
    except TimeoutError:
        bot.cancel()
        return None


def discord_settings(standin: DiscordStandIn, db: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=db,
        embedder="none",
        discord_token="standin-token",  # type: ignore[arg-type]
        discord_api_url=standin.api_base,
        discord_gateway_url=standin.gateway_url,
    )


async def discord_case(code: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    db = tmp / f"discord-{code}.db"
    standin = await DiscordStandIn().start()
    scope = Scope(platform="discord", workspace=GUILD_ID, channel=GENERAL)
    stop = asyncio.Event()
    bot = asyncio.create_task(run(discord_settings(standin, db), stop=stop))
    sent: list[str] = []
    missed = 0
    exit_code: int | None = None
    restarted_exit: int | None = None
    closed_at = None
    try:
        await asyncio.wait_for(standin.identified.wait(), 30)
        authors = [m for m in standin.guild["members"] if not m["user"].get("bot")]
        # the bot is up once a first message is stored (start-up catch-up and command sync)
        first = standin.message_create("reconnect warm-up", author=authors[0]["user"])
        await standin.post(first)
        sent.append(first["id"])

        async def warm() -> bool:
            return (await stored_ids(db, scope, sent))[0] == 1

        await until(warm, 30)
        await asyncio.sleep(1.0)
        for i in range(args.messages):
            if i == args.messages // 2:
                standin.resumable = code != 4009  # Discord refuses to resume a timed-out one
                closed_at = time.monotonic()
                await standin.close_gateway(code)
            author = authors[i % len(authors)]
            payload = standin.message_create(f"reconnect {code} message {i}", author=author["user"])
            payload["member"] = {k: v for k, v in author.items() if k != "user"}
            if await standin.post(payload) == "missed":
                missed += 1
            sent.append(payload["id"])
            # a burst right after the close lands while no session is live
            if not args.messages // 2 <= i < args.messages // 2 + args.burst:
                await asyncio.sleep(args.interval)
        if code == 4014:
            # fatal: the process must end on its own, non-zero
            try:
                exit_code = await asyncio.wait_for(asyncio.shield(bot), 30)
            except TimeoutError:
                pass
            except Exception as exc:  # raised out of run(): the CLI exits non-zero
                log.error("run() raised %r", exc)
                exit_code = 1
            before_restart = (await stored_ids(db, scope, sent))[0]
            if exit_code is not None:  # the supervisor's restart: catch-up on start
                standin.identified.clear()
                stop = asyncio.Event()
                bot = asyncio.create_task(run(discord_settings(standin, db), stop=stop))
                await asyncio.wait_for(standin.identified.wait(), 30)
        else:
            before_restart = None

        async def all_stored() -> bool:
            return (await stored_ids(db, scope, sent))[0] >= len(sent)

        complete = await until(all_stored, args.settle)
        settled_s = None if closed_at is None else round(time.monotonic() - closed_at, 1)
        found, rows = await stored_ids(db, scope, sent)
        if code == 4014:
            restarted_exit = await stop_bot(stop, bot)
        else:
            exit_code = await stop_bot(stop, bot)
    finally:
        if not bot.done():
            await stop_bot(stop, bot)
        await standin.close()
    history_gets = sum(1 for r in standin.requests if r[0] == "GET" and r[1].endswith("/messages"))
    return {
        "case": f"Discord close {code} ({DISCORD_CODES[code]})",
        "sent": len(sent),
        "posted_while_down": missed,
        "stored": found,
        "rows": rows,
        "lost": len(sent) - found,
        "duplicated": rows - found,
        "resumes": standin.resumes,
        "sessions": standin.identifies,
        "replayed": standin.replayed,
        "history_gets": history_gets,
        "exit_code": exit_code,
        "stored_before_restart": before_restart,
        "restarted_exit": restarted_exit,
        "complete": complete,
        "seconds_to_complete": settled_s,
    }


async def slack_case(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    db = tmp / "slack-socket.db"
    channel = "C0RECON01"
    users = {"U0ALICE": {"name": "alice"}, "U0BOB": {"name": "bob"}}
    api = await SlackApiStandIn(
        users=users, members={channel: ["U0ALICE", "U0BOB", BOT_USER_ID]}
    ).start()
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=db,
        embedder="none",
        slack_bot_token="xoxb-reconnect",  # type: ignore[arg-type]
        slack_app_token="xapp-reconnect",  # type: ignore[arg-type]
        slack_mode="socket",
        slack_api_url=api.base_url,
    )
    scope = Scope(platform="slack", workspace=TEAM_ID, channel=channel)
    stop = asyncio.Event()
    bot = asyncio.create_task(run(settings, stop=stop))
    sent: list[str] = []
    envelopes: dict[str, dict[str, Any]] = {}
    dropped = 0
    redelivered = 0
    try:

        async def connected() -> bool:
            return api.socket_connections >= 1

        if not await until(connected, 30):
            raise RuntimeError("Socket Mode never connected")
        await asyncio.sleep(0.5)
        for i in range(args.messages):
            if i == args.messages // 2:
                dropped = await api.drop_sockets()
            user = ("U0ALICE", "U0BOB")[i % 2]
            msg = api.add_message(channel, f"socket message {i}", user=user)
            payload = {
                "type": "event_callback",
                "team_id": TEAM_ID,
                "api_app_id": "A0STANDIN",
                "event_id": f"EvRecon{i:05d}",
                "event_time": int(time.time()),
                "event": {**msg, "channel": channel, "channel_type": "channel"},
            }
            envelopes[api.queue_envelope("events_api", payload)] = payload
            sent.append(msg["ts"])
            if not args.messages // 2 <= i < args.messages // 2 + args.burst:
                await asyncio.sleep(args.interval)

        async def all_stored() -> bool:
            return (await stored_ids(db, scope, sent))[0] >= len(sent)

        complete_first = await until(all_stored, args.settle / 2)
        found_first = (await stored_ids(db, scope, sent))[0]
        acked = {a.get("envelope_id") for a in api.acks}
        unacked = [eid for eid in envelopes if eid not in acked]
        for eid in unacked:  # Slack redelivers what was never acknowledged
            api.queue_envelope("events_api", envelopes[eid])
            redelivered += 1
        complete = complete_first or await until(all_stored, args.settle / 2)
        found, rows = await stored_ids(db, scope, sent)
        exit_code = await stop_bot(stop, bot)
    finally:
        if not bot.done():
            await stop_bot(stop, bot)
        await api.close()
    return {
        "case": "Slack Socket Mode socket dropped",
        "sent": len(sent),
        "sockets_dropped": dropped,
        "connections": api.socket_connections,
        "stored_before_redelivery": found_first,
        "unacked_redelivered": redelivered,
        "history_calls": len(api.method_calls("conversations.history")),
        "stored": found,
        "rows": rows,
        "lost": len(sent) - found,
        "duplicated": rows - found,
        "exit_code": exit_code,
        "complete": complete,
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"### Reconnects: {args.messages} messages per case, one every {args.interval * 1000:.0f}"
        " ms, connection closed halfway",
        "",
        "| case | sent | stored | lost | duplicated | what happened | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["case"].startswith("Discord"):
            what = (
                f"{r['posted_while_down']} posted while down; RESUMEs {r['resumes']}, "
                f"sessions {r['sessions']}, replayed {r['replayed']}, history GETs "
                f"{r['history_gets']}"
            )
            if r["stored_before_restart"] is not None:
                what += (
                    f"; process exit {r['exit_code']} (must be non-zero), "
                    f"{r['stored_before_restart']} stored before the restart"
                )
            ok = r["lost"] == 0 and r["duplicated"] == 0
            if r["stored_before_restart"] is not None:
                ok = ok and r["exit_code"] not in (None, 0)
        else:
            what = (
                f"sockets dropped {r['sockets_dropped']}, connections {r['connections']}, "
                f"stored before redelivery {r['stored_before_redelivery']}, unacked "
                f"redelivered {r['unacked_redelivered']}, conversations.history calls "
                f"{r['history_calls']}"
            )
            ok = r["lost"] == 0 and r["duplicated"] == 0
        lines.append(
            f"| {r['case']} | {r['sent']} | {r['stored']} | {r['lost']} | {r['duplicated']} "
            f"| {what} | {'✅' if ok else '❌'} |"
        )
    lines += ["", f"Machine: {machine()}"]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    results = []
    for case in args.cases:
        if case == "slack":
            results.append(await slack_case(args, tmp))
        else:
            results.append(await discord_case(int(case), args, tmp))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--cases",
        nargs="+",
        default=["1000", "1001", "4000", "4009", "4014", "slack"],
        choices=[*(str(c) for c in DISCORD_CODES), "slack"],
    )
    p.add_argument("--messages", type=int, default=200)
    p.add_argument("--interval", type=float, default=0.01, help="seconds between posts")
    p.add_argument(
        "--burst", type=int, default=20, help="messages posted at once right after the close"
    )
    p.add_argument("--settle", type=float, default=30.0, help="wait for all stored (s)")
    add_json_option(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="scenario-reconnect-") as tmp:
        results = asyncio.run(main_async(args, Path(tmp)))
    print(report(results, args))
    if args.json:
        write_json(args.json, results)
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
