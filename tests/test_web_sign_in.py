"""Who gets a console session, how many, and where a generated login link goes
(issue #40, items 5 and 9): only members of a guild or workspace the bot knows sign in,
one identity keeps a bounded number of sessions and nobody evicts the operator's; without a
terminal the login link is written to a 0600 file, never to stdout or the log."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import aiohttp
import pytest

from speakermem.memory.engine import MemoryEngine
from tests.test_web_auth import G1, _guild, discord_console, jar, slack_console
from tests.web_fixtures import (
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    settings_for,
)


async def test_without_a_terminal_the_login_link_goes_to_a_private_file(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """journald and `docker logs` keep stdout: there the link is written to a 0600 file and
    only the file's path is printed and logged (issue #40, item 9)."""
    import os
    import stat

    from speakermem.integrations.web.server import WebConsole
    from speakermem.memory.console import ConsoleReads
    from speakermem.memory.governance.service import Governance

    db = copy_store(console_store, tmp_path)
    settings = settings_for(db, web_admin_token=None)
    engine = await MemoryEngine.open(settings.memory_config(), None)
    out = io.StringIO()  # a pipe, as under systemd or docker
    old_umask = os.umask(0o022)
    console = WebConsole(
        settings, ConsoleReads(engine), Governance(engine), recaller=None, port=0, out=out
    )
    try:
        with caplog.at_level(logging.INFO):
            await console.start()
        token = console.state.admin_token.get_secret_value()
        path = console.login_link_path
        assert token not in out.getvalue() and token not in caplog.text
        assert str(path) in out.getvalue() and str(path) in caplog.text
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        link = path.read_text().strip()
        assert link == f"http://127.0.0.1:{console.port}/login?token={token}"
        async with aiohttp.ClientSession(cookie_jar=jar()) as http, http.get(link) as resp:
            assert resp.status == 200 and "Overview" in await resp.text()
    finally:
        os.umask(old_umask)
        await console.stop()
        await engine.close()
    assert not path.exists()  # the token died with the process; so does its file


# ---- who may sign in, and how many sessions they keep (issue #40, item 5) -------------------


async def _signed_out(http: aiohttp.ClientSession, rc: RunningConsole) -> bool:
    async with http.get(rc.url + "/", allow_redirects=False) as resp:
        return resp.status == 303 and resp.headers["Location"].startswith("/login")


@pytest.mark.e2e
async def test_a_discord_account_in_no_known_guild_gets_no_session(tmp_path: Path) -> None:
    async with discord_console(tmp_path) as (rc, standin):
        standin.add_user("333", "stranger", [_guild("123456789", owner=True)])
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "333"
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 403
                assert "no workspace or server this bot serves" in await resp.text()
            assert await _signed_out(http, rc)
        assert len(rc.console.state.sessions) == 0


@pytest.mark.e2e
async def test_a_slack_account_of_another_workspace_gets_no_session(tmp_path: Path) -> None:
    async with slack_console(tmp_path, {"U1": {"real_name": "Sam", "is_admin": True}}) as (
        rc,
        standin,
    ):
        standin.team_id = "TSOMEONEELSE"
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "U1"
            async with http.get(rc.url + "/auth/slack") as resp:
                assert resp.status == 403
            assert await _signed_out(http, rc)
        assert len(rc.console.state.sessions) == 0


def test_sessions_are_capped_per_identity_and_never_evict_the_operator() -> None:
    from speakermem.integrations.web.access import Membership, Principal
    from speakermem.integrations.web.sessions import MAX_PER_IDENTITY, Sessions, Signer

    sessions = Sessions(Signer(), ttl_s=600, max_sessions=20)
    operator = sessions.create(Principal(name="operator", operator=True), provider=None)
    cookie = sessions.cookie(operator)

    def user(uid: str) -> Principal:
        return Principal(
            name=uid,
            platform="discord",
            user_id=uid,
            memberships=(Membership("discord", G1, uid),),
        )

    for _ in range(3 * MAX_PER_IDENTITY):  # one account signing in over and over
        sessions.create(user("111"), provider="discord")
    assert len(sessions) == 1 + MAX_PER_IDENTITY
    for i in range(10_000):  # many accounts: the least recently used go, never the operator
        sessions.create(user(f"u{i}"), provider="discord")
    assert len(sessions) == 20
    assert sessions.find(cookie) is operator
