"""`speakermem run` as a real process: serves Slack over HTTP; SIGTERM with an acked event
still in flight waits for it, then exits cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.standins.slack_api import SlackApiStandIn, signed_headers

pytestmark = pytest.mark.e2e

SECRET = "test-signing-secret"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_for_port(port: int, proc: asyncio.subprocess.Process, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise AssertionError("speakermem run exited early")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError("speakermem run did not start listening")


LAUNCH_EVENT = json.dumps(
    {
        "type": "event_callback",
        "team_id": "T0STANDIN",
        "event_id": "Ev1",
        "event": {
            "type": "message",
            "channel": "C1",
            "user": "U1",
            "text": "the launch moved to friday",
            "ts": "1700000000.000100",
            "channel_type": "channel",
        },
    }
)
"""U1's message in C1, as Slack's Events API posts it."""


async def start_bot(
    db: Path, api: SlackApiStandIn, port: int, **settings: str
) -> asyncio.subprocess.Process:
    """`speakermem run` as a subprocess: Slack over HTTP on `port` against the stand-in, no
    embedder, no LLM; `settings` adds SPEAKERMEM_<NAME> variables."""
    env = {
        **os.environ,
        "SPEAKERMEM_DB_PATH": str(db),
        "SPEAKERMEM_SLACK_BOT_TOKEN": "xoxb-test-token-do-not-log",
        "SPEAKERMEM_SLACK_SIGNING_SECRET": SECRET,
        "SPEAKERMEM_SLACK_MODE": "http",
        "SPEAKERMEM_SLACK_HTTP_HOST": "127.0.0.1",
        "SPEAKERMEM_SLACK_HTTP_PORT": str(port),
        "SPEAKERMEM_SLACK_API_URL": api.base_url,
        "SPEAKERMEM_EMBEDDER": "none",
        "SPEAKERMEM_LLM_BASE_URL": "",
        **{f"SPEAKERMEM_{name.upper()}": value for name, value in settings.items()},
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "speakermem.integrations.cli.main",
        "run",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(ROOT),
    )


async def test_run_serves_slack_and_drains_on_sigterm(tmp_path: Path) -> None:
    api = await SlackApiStandIn(
        users={"U1": {"id": "U1", "name": "alice", "real_name": "Alice"}},
        members={"C1": ["U1"]},
    ).start()
    # the event's roster sync blocks at the stand-in, so SIGTERM lands while it is in flight
    entered, release = api.hold("conversations.members")
    port = free_port()
    db = tmp_path / "run.db"
    proc = await start_bot(db, api, port)
    try:
        await wait_for_port(
            port, proc, limit_s=90
        )  # how long to wait before giving up, not a bound on speed
        body = LAUNCH_EVENT
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                f"http://127.0.0.1:{port}/slack/events",
                data=body,
                headers=signed_headers(SECRET, body, content_type="application/json"),
            )
            assert resp.status == 200
        await asyncio.wait_for(entered.wait(), timeout=10)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert proc.returncode is None  # still draining: the acked event is not done yet
        release.set()
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        release.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await api.close()
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log
    assert "stopped cleanly" in log
    assert "xoxb-test-token-do-not-log" not in log
    eng = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        stored = await eng.store.messages.get(
            Scope(platform="slack", workspace="T0STANDIN", channel="C1"), "1700000000.000100"
        )
        assert stored is not None and stored.text == "the launch moved to friday"
    finally:
        await eng.close()
    # the WAL was checkpointed and the file closed cleanly: no hot journal left behind
    wal = Path(str(db) + "-wal")
    assert wal_is_empty(wal)


def wal_is_empty(wal: Path) -> bool:
    return not wal.exists() or wal.stat().st_size == 0
