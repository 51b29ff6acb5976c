"""The console's login limit (issue #40, item 1): kept per client address, read through
trusted proxies only; failed attempts count, successes do not; a short operator token is
refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError

from speakermem.bot.settings import MIN_ADMIN_TOKEN_CHARS, Settings
from speakermem.integrations.cli.main import main
from speakermem.integrations.web.client_address import client_address, parse_networks
from tests.web_fixtures import (
    OPERATOR_TOKEN,
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
)

PROXY = parse_networks(["127.0.0.1", "10.0.0.0/8"])


def test_the_client_is_the_rightmost_untrusted_forwarded_address() -> None:
    # a proxy appends the address it saw; what the client wrote itself is to its left
    assert client_address("127.0.0.1", ["6.6.6.6, 203.0.113.9"], PROXY) == "203.0.113.9"
    assert client_address("127.0.0.1", ["6.6.6.6", "203.0.113.9, 10.1.2.3"], PROXY) == (
        "203.0.113.9"
    )
    assert client_address("127.0.0.1", [], PROXY) == "127.0.0.1"
    # from a peer that is no trusted proxy the header is the client's own word: ignored
    assert client_address("198.51.100.1", ["203.0.113.9"], PROXY) == "198.51.100.1"
    assert client_address("127.0.0.1", ["203.0.113.9"], ()) == "127.0.0.1"


def test_trusted_proxies_setting_parses_and_refuses_garbage() -> None:
    s = Settings(_env_file=None, web_trusted_proxies="127.0.0.1, 10.0.0.0/8 ::1")  # type: ignore[call-arg]
    assert s.web_trusted_proxies == ("127.0.0.1", "10.0.0.0/8", "::1")
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings(_env_file=None, web_trusted_proxies="proxy.example")  # type: ignore[call-arg]


def test_a_short_operator_token_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    monkeypatch.setenv("SPEAKERMEM_WEB_ADMIN_TOKEN", "hunter2")
    assert main(["config"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "SPEAKERMEM_WEB_ADMIN_TOKEN is 7 characters" in err
    assert f"at least {MIN_ADMIN_TOKEN_CHARS}" in err and "hunter2" not in err
    ok = Settings(_env_file=None, web_admin_token="x" * MIN_ADMIN_TOKEN_CHARS)  # type: ignore[call-arg]
    assert ok.web_admin_token is not None
    with pytest.raises(ValidationError):
        Settings(_env_file=None, web_admin_token="x" * (MIN_ADMIN_TOKEN_CHARS - 1))  # type: ignore[call-arg]


async def login(http: aiohttp.ClientSession, rc: RunningConsole, token: str, via: str) -> int:
    async with http.get(
        f"{rc.url}/login?token={token}",
        headers={"X-Forwarded-For": via},
        allow_redirects=False,
    ) as resp:
        return resp.status


@pytest.mark.slow
async def test_behind_a_trusted_proxy_one_bad_client_does_not_lock_out_the_operator(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with running_console(
            db, web_login_attempts=3, web_trusted_proxies=("127.0.0.1",)
        ) as rc:
            bad = [await login(http, rc, f"guess{i}", "203.0.113.9") for i in range(4)]
            assert bad == [403, 403, 403, 429]
            assert await login(http, rc, OPERATOR_TOKEN, "198.51.100.7") == 303
            assert await login(http, rc, OPERATOR_TOKEN, "203.0.113.9") == 429  # still blocked
        # not trusted: X-Forwarded-For is the client's word, so a new one each time is no
        # way around the limit
        async with running_console(db, web_login_attempts=3) as rc:
            spoofed = [await login(http, rc, "guess", f"192.0.2.{i}") for i in range(4)]
            assert spoofed == [403, 403, 403, 429]


@pytest.mark.slow
async def test_successful_sign_ins_do_not_count_against_the_limit(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
        running_console(db, web_login_attempts=2) as rc,
    ):
        assert [await login(http, rc, OPERATOR_TOKEN, "x") for _ in range(5)] == [303] * 5
        assert await login(http, rc, "wrong", "x") == 403
        assert await login(http, rc, OPERATOR_TOKEN, "x") == 303  # one failure of two
