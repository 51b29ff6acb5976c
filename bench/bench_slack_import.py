"""`speakermem import slack-export` on a large synthetic workspace, embeddings included.

A benchmark script, not a test. It writes a Slack export (a ZIP, as Slack hands it out)
with `--members` people, every one of them listed in each of `--channels` channels, and
`--messages` messages spread over those channels (threads, bot posts with blocks, /giphy
posts and file shares among them), then runs the real CLI in a fresh process with the
MiniLM embedder on a fresh SQLite store, twice: the import, and a re-run that must store
and embed nothing. It reads the store afterwards for what was kept.

    python bench/bench_slack_import.py --out docs/benchmarks/slack-import.json

The machine is shared: the 1-minute load average before and after each run is recorded
beside the wall-clock time, and the CPU time of the import process (all threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import benchlib  # puts the repository root on the path
import numpy as np
from benchlib.cli import write_json
from benchlib.host import host_info
from benchlib.words import FUNCTION, TOPICS, chat_words

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope

TEAM = "TBENCH001"
START = 1_700_000_000
BOT = "UBOTDEPL1"


def _text(rng: np.random.Generator, vocab: list[str]) -> str:
    n = max(3, int(rng.lognormal(2.3, 0.6)))
    return " ".join(str(rng.choice(vocab)) for _ in range(min(n, 40)))


def _record(rng: np.random.Generator, i: int, people: list[str], vocab: list[str]) -> dict:
    ts = f"{START + i * 37}.{i % 1_000_000:06d}"
    kind = i % 50
    if kind == 0:  # an integration's post: words only in blocks
        return {
            "type": "message",
            "subtype": "bot_message",
            "bot_id": "BDEPLOY01",
            "text": "",
            "ts": ts,
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": _text(rng, vocab)}}],
        }
    user = str(rng.choice(people))
    msg: dict[str, Any] = {"type": "message", "user": user, "ts": ts, "team": TEAM}
    if kind == 1:  # /giphy: a person posting through an app
        msg |= {"bot_id": "BGIPHY001", "text": "", "attachments": [{"title": _text(rng, vocab)}]}
    elif kind == 2:
        msg |= {"subtype": "file_share", "text": "", "files": [{"title": _text(rng, vocab)}]}
    else:
        msg["text"] = _text(rng, vocab)
    return msg


def write_export(dest: Path, members: int, channels: int, messages: int, seed: int) -> dict:
    """The export ZIP; returns what it holds."""
    rng = np.random.default_rng(seed)
    vocab = FUNCTION * 3 + TOPICS + chat_words(rng, 3_000)
    people = [f"U{n:08d}" for n in range(members)]
    users = [
        {"id": u, "team_id": TEAM, "name": f"member{n}", "profile": {"display_name": f"M {n}"}}
        for n, u in enumerate(people)
    ]
    users.append(
        {
            "id": BOT,
            "team_id": TEAM,
            "name": "deploy",
            "is_bot": True,
            "profile": {"bot_id": "BDEPLOY01"},
        }
    )
    chans = [
        {
            "id": f"C{n:08d}",
            "name": f"channel-{n}",
            "created": str(START - 86_400),
            "members": people,
        }
        for n in range(channels)
    ]
    per_day: dict[tuple[str, str], list[dict]] = {}
    threads: dict[str, list[str]] = {c["name"]: [] for c in chans}
    for i in range(messages):
        chan = chans[i % channels]["name"]
        msg = _record(rng, i, people, vocab)
        roots = threads[chan]
        if "user" in msg and "subtype" not in msg and roots and rng.random() < 0.25:
            msg["thread_ts"] = str(rng.choice(roots[-20:]))
        elif "user" in msg:
            roots.append(msg["ts"])
        day = datetime.fromtimestamp(float(msg["ts"]), tz=UTC).strftime("%Y-%m-%d")
        per_day.setdefault((chan, day), []).append(msg)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("users.json", json.dumps(users))
        zf.writestr("channels.json", json.dumps(chans))
        for (chan, day), records in sorted(per_day.items()):
            zf.writestr(f"{chan}/{day}.json", json.dumps(records))
    return {
        "members": members,
        "channels": channels,
        "listed_memberships": members * channels,
        "records": messages,
        "day_files": len(per_day),
        "zip_mb": round(dest.stat().st_size / 1e6, 2),
    }


def _run(db: Path, export: Path) -> dict[str, Any]:
    env = {**os.environ, "SPEAKERMEM_EMBEDDER": "minilm", "PYTHONPATH": str(benchlib.REPO_ROOT)}
    argv = [sys.executable, "-m", "speakermem.integrations.cli.main", "--db", str(db)]
    argv += ["import", "slack-export", str(export)]
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=benchlib.REPO_ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = " ".join(
        line for line in done.stderr.splitlines() if line.startswith(("imported", "skipped", "  "))
    )
    if done.returncode != 0:
        raise SystemExit(f"import failed ({done.returncode}):\n{done.stderr[-3000:]}")
    numbers = re.search(
        r"imported (\d+) messages .*?; (\d+) roster snapshot\(s\) of (\d+) member\(s\); "
        r"(\d+) join/leave events; embedded (\d+)",
        " ".join(done.stderr.split()),
    )
    if numbers is None:
        raise SystemExit(f"no summary line in the import's output:\n{done.stderr[-3000:]}")
    stored, snapshots, snap_members, roster_events, embedded = map(int, numbers.groups())
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "load_1m_before": round(load_before, 2),
        "load_1m_after": round(os.getloadavg()[0], 2),
        "stored": stored,
        "roster_snapshots": snapshots,
        "snapshot_members": snap_members,
        "join_leave_events": roster_events,
        "embedded": embedded,
        "summary": summary[:400],
    }


async def _store_counts(db: Path, channels: int) -> dict[str, int]:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        rows = [r for r in await engine.store.channels.all() if r["scope"].workspace == TEAM]
        first = Scope(platform="slack", workspace=TEAM, channel="C00000000")
        return {
            "channels": len(rows),
            "messages": sum(r["messages"] for r in rows),
            "members_per_channel_min": min(r["members"] for r in rows),
            "members_first_channel": len(await engine.members(first)),
            "unembedded": await engine.count_unembedded(),
        }
    finally:
        await engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=2_000)
    p.add_argument("--channels", type=int, default=5)
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--target-s", type=float, default=120.0, help="the goal for the first import")
    p.add_argument("--out", type=Path, help="write the results here as JSON")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="slack-import-") as tmp:
        export, db = Path(tmp) / "export.zip", Path(tmp) / "bench.db"
        data = write_export(export, args.members, args.channels, args.messages, args.seed)
        print(f"export: {data}", flush=True)
        first = _run(db, export)
        print(f"import: {first}", flush=True)
        rerun = _run(db, export)
        print(f"re-run: {rerun}", flush=True)
        store = asyncio.run(_store_counts(db, args.channels))
        print(f"store: {store}", flush=True)

    command = "python bench/bench_slack_import.py" + (f" --out {args.out}" if args.out else "")
    result = {
        "machine": host_info(),
        "export": data,
        "target_s": args.target_s,
        "first_import": first,
        "rerun": rerun,
        "store": store,
        "within_target": first["wall_s"] <= args.target_s,
        "run": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "command": command,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=benchlib.REPO_ROOT,
            ).stdout.strip(),
            "note": "Shared 2-core machine with other engineers' jobs running; see the load "
            "averages beside each run.",
        },
    }
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
