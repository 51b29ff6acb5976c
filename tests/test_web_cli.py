"""`speakermem web` from a fresh folder after `speakermem demo --no-input`, its address and
login link, and the console inside `speakermem run` when SPEAKERMEM_WEB_PORT is set."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.runtime import run
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn, sign
from tests.test_run import free_port
from tests.web_fixtures import OPERATOR_TOKEN, console_store, copy_store, running_console  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    env.update({"SPEAKERMEM_EMBEDDER": "none", "PYTHONPATH": str(ROOT), **extra})
    return env


def _speakermem(*args: str, cwd: Path, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "speakermem.integrations.cli.main", *args],
        cwd=cwd,
        env=_env(),
        text=True,
        stdin=subprocess.DEVNULL,
        **popen,  # type: ignore[call-overload]
    )


def _read_until(proc: subprocess.Popen[str], pattern: str, limit_s: float = 60.0) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"never printed {pattern!r}: {lines}")


@pytest.mark.e2e
@pytest.mark.slow
async def test_demo_then_web_serves_the_demo_behind_the_printed_login_link(
    tmp_path: Path,
) -> None:
    demo = _speakermem("demo", "--no-input", cwd=tmp_path, stdout=subprocess.DEVNULL)
    assert await asyncio.to_thread(demo.wait, 180) == 0
    web = _speakermem("web", "--port", "0", cwd=tmp_path, stdout=subprocess.PIPE)
    try:
        # stdout is a pipe, not a terminal: the link is in a private file, stdout names it
        lines = await asyncio.to_thread(_read_until, web, r"with the link in \S+")
        text = "\n".join(lines)
        assert "serving the demo's speakermem-demo.db" in text and "token=" not in text
        address = re.search(r"SpeakerMem web console: (http://127\.0\.0\.1:\d+)", text)
        assert address, text  # 127.0.0.1 unless told otherwise
        where = re.search(r"with the link in (\S+\.txt)", text)
        assert where, text
        link = re.search(
            r"(http://127\.0\.0\.1:\d+/login\?token=\S+)", (tmp_path / where.group(1)).read_text()
        )
        assert link
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(link.group(1)) as resp:
                page = await resp.text()
                assert resp.status == 200 and str(resp.url) == address.group(1) + "/"
            assert "#general" in page and "#leads" in page and ">198<" in page
            records = re.search(r"· (\d+) records", page)
            assert records and int(records.group(1)) > 0  # the demo's records, without an LLM
            async with http.get(address.group(1) + "/people/shell/local/bob") as resp:
                person = await resp.text()
            assert "Bob" in person and "Bobby" in person and "Forget this person" in person
            assert "sync" in person  # his messages
            assert "Bob revised his sync plan" in person  # and what was derived about him
    finally:
        web.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(web.wait, 30)
    assert code == 0


@pytest.mark.e2e
def test_web_without_a_store_says_what_to_do(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "speakermem.integrations.cli.main", "web", "--port", "0"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert "no store at speakermem.db" in proc.stderr and "speakermem demo" in proc.stderr
    assert not (tmp_path / "speakermem.db").exists()


async def test_web_host_is_the_address_the_console_binds(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with running_console(copy_store(console_store, tmp_path), web_host="127.0.0.2") as rc:
        assert rc.url.startswith("http://127.0.0.2:")
        async with aiohttp.ClientSession() as http:
            async with http.get(rc.url + "/login") as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"http://127.0.0.1:{rc.console.port}/login")


async def _slack_bot(tmp_path: Path, **extra: object) -> tuple[Settings, SlackApiStandIn, int]:
    api = await SlackApiStandIn(
        users={"U1": {"name": "alice", "profile": {"display_name": "Alice"}}},
        members={"C1": ["U1"]},
    ).start()
    port = free_port()
    settings = Settings(
        db_path=tmp_path / "bot.db",
        slack_bot_token="xoxb-test",  # type: ignore[arg-type]
        slack_signing_secret="web-signing-secret",  # type: ignore[arg-type]
        slack_mode="http",
        slack_http_host="127.0.0.1",
        slack_http_port=port,
        slack_api_url=api.base_url,
        embedder="none",
        llm_base_url=None,
        discord_token=None,
        web_admin_token=OPERATOR_TOKEN,  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )
    return settings, api, port


@pytest.mark.e2e
async def test_run_serves_the_console_when_web_port_is_set(tmp_path: Path) -> None:
    web_port = free_port()
    for with_port in (True, False):
        extra = {"web_port": web_port} if with_port else {}
        settings, api, port = await _slack_bot(tmp_path / str(with_port), **extra)
        stop = asyncio.Event()
        task = asyncio.create_task(run(settings, stop=stop))
        try:
            body = json.dumps(
                {
                    "type": "event_callback",
                    "team_id": TEAM_ID,
                    "event_id": "Ev1",
                    "event": {
                        "type": "message",
                        "channel": "C1",
                        "user": "U1",
                        "text": "the console shows this channel",
                        "ts": "1700000000.000100",
                        "channel_type": "channel",
                    },
                }
            )
            headers = {
                **sign("web-signing-secret", int(time.time()), body),
                "Content-Type": "application/json",
            }
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                for _ in range(200):
                    try:
                        async with http.post(
                            f"http://127.0.0.1:{port}/slack/events", data=body, headers=headers
                        ) as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.05)
                login = f"http://127.0.0.1:{web_port}/login?token={OPERATOR_TOKEN}"
                if not with_port:
                    with pytest.raises(aiohttp.ClientConnectionError):
                        await http.get(login)
                    continue
                async with http.get(login) as resp:
                    page = await resp.text()
                channel = f"/c/slack/{TEAM_ID}/C1"  # the channel's page, whatever its name
                for _ in range(100):
                    if channel in page:
                        break
                    await asyncio.sleep(0.05)
                    async with http.get(f"http://127.0.0.1:{web_port}/") as resp:
                        page = await resp.text()
                assert resp.status == 200 and channel in page
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 30) == 0
            await api.close()
