"""Shutdown and death: acked Slack work survives a stop; a dead Discord client ends the run.

These drive `integrations.runtime.run` itself (the code `speakermem run` calls), with the
stop event standing in for SIGTERM, against the Slack and Discord stand-ins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.runtime import run
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn, sign
from tests.test_run import free_port

pytestmark = pytest.mark.e2e

SECRET = "shutdown-signing-secret"


def slack_settings(tmp_path: Path, api: SlackApiStandIn, port: int) -> Settings:
    return Settings(
        db_path=tmp_path / "run.db",
        slack_bot_token="xoxb-test",  # type: ignore[arg-type]
        slack_signing_secret=SECRET,  # type: ignore[arg-type]
        slack_mode="http",
        slack_http_host="127.0.0.1",
        slack_http_port=port,
        slack_api_url=api.base_url,
        embedder="none",
        llm_base_url=None,
        discord_token=None,
    )


async def post(url: str, body: str, content_type: str) -> int:
    headers = {**sign(SECRET, int(time.time()), body), "Content-Type": content_type}
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        return r.status


async def wait_port(port: int, task: asyncio.Task[int]) -> None:
    for _ in range(300):
        if task.done():
            raise AssertionError(f"run ended early: {task.result()}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError("run did not start listening")


async def test_stop_waits_for_acked_slack_event_and_recall_in_flight(tmp_path: Path) -> None:
    api = await SlackApiStandIn(
        users={"U1": {"name": "alice", "profile": {"display_name": "Alice"}}},
        members={"C1": ["U1"]},
    ).start()
    entered, release = api.hold("conversations.members")
    port = free_port()
    settings = slack_settings(tmp_path, api, port)
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop))
    url = f"http://127.0.0.1:{port}/slack/events"
    try:
        await wait_port(port, task)
        event = {
            "type": "event_callback",
            "team_id": TEAM_ID,
            "event_id": "EvDrain1",
            "event": {
                "type": "message",
                "channel": "C1",
                "user": "U1",
                "text": "the launch moved to friday",
                "ts": "1700000000.000100",
                "channel_type": "channel",
            },
        }
        assert await post(url, json.dumps(event), "application/json") == 200
        await asyncio.wait_for(entered.wait(), 10)  # the listener is blocked mid-roster-sync
        form = {
            "command": "/recall",
            "text": "when is the launch?",
            "user_id": "U1",
            "user_name": "alice",
            "channel_id": "C1",
            "team_id": TEAM_ID,
            "response_url": api.response_url("drain"),
            "trigger_id": "1.2",
        }
        assert await post(url, urlencode(form), "application/x-www-form-urlencoded") == 200
        await asyncio.sleep(0.2)
        assert api.responses == []  # the recall is waiting too (same channel's roster lock)
        stop.set()  # what SIGTERM does
        await asyncio.sleep(0.5)
        assert not task.done()  # run is draining, the store still open
        release.set()
        assert await asyncio.wait_for(task, 30) == 0
    finally:
        release.set()
        stop.set()
        if not task.done():
            task.cancel()
        await api.close()
    answers = [body for key, body in api.responses if key == "drain"]
    assert len(answers) == 1
    assert "went wrong" not in json.dumps(answers[0])
    eng = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=settings.db_path)))
    try:
        stored = await eng.store.messages.get(
            Scope(platform="slack", workspace=TEAM_ID, channel="C1"), "1700000000.000100"
        )
        assert stored is not None and stored.text == "the launch moved to friday"
    finally:
        await eng.close()


async def test_non_ascii_signature_header_gets_401(tmp_path: Path) -> None:
    api = await SlackApiStandIn().start()
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(run(slack_settings(tmp_path, api, port), stop=stop))
    try:
        await wait_port(port, task)
        body = b'{"type":"event_callback"}'
        statuses = []
        for header in (
            b"X-Slack-Signature: v0=\xc3\xa9\xff\xfe" + b"a" * 60,
            b"X-Slack-Signature: v0=\xe2\x82\xac",
        ):
            stamp = str(int(time.time())).encode()
            request = (
                b"POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                b"X-Slack-Request-Timestamp: " + stamp + b"\r\n" + header + b"\r\n"
                b"Content-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
            writer.close()
            statuses.append(int(status_line.split()[1]))
        assert statuses == [401, 401]
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await api.close()


async def test_run_exits_non_zero_when_the_discord_client_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="speakermem.integrations.runtime")
    standin = await DiscordStandIn().start()
    standin.install(monkeypatch)
    settings = Settings(
        db_path=tmp_path / "run.db",
        discord_token="discord-test-token",  # type: ignore[arg-type]
        discord_api_url=standin.api_base,
        discord_gateway_url=standin.gateway_url,
        slack_bot_token=None,
        embedder="none",
        llm_base_url=None,
    )
    stop = asyncio.Event()
    task: asyncio.Task[Any] = asyncio.create_task(run(settings, stop=stop))
    try:
        for _ in range(400):  # until the run is serving (on_ready waits for guilds)
            if "speakermem running" in caplog.text or task.done():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert not task.done()
        await standin.close_gateway(4004)  # authentication failed: discord.py gives up
        code = await asyncio.wait_for(task, 20)
    finally:
        stop.set()
        if not task.done():
            task.cancel()
        await standin.close()
    assert code == 1
    assert "DiscordAdapter died" in caplog.text
