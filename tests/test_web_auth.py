"""Signing in to the console and keeping it safe: the operator's token (printed link or form),
Discord OAuth2 and Sign in with Slack against local stand-ins, the periodic re-check,
cookies, CSRF on every form, the login limit, the CSP header, and no token or secret in any
page or log."""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import pytest
from pydantic import SecretStr

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, RosterAction, RosterEvent, Scope
from tests.standins.oauth import DiscordOAuthStandIn, SlackSignInStandIn
from tests.test_web_routes import cases
from tests.web_fixtures import (
    OPERATOR_TOKEN,
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
    settings_for,
)

MANAGE_GUILD = 1 << 5
DISCORD_SECRET = "discord-client-secret-XYZ"
SLACK_SECRET = "slack-client-secret-XYZ"
SLACK_BOT_TOKEN = "xoxb-bot-token-XYZ"
G1, G2, TEAM = "900000000000000001", "900000000000000002", "T0STANDIN"
T0 = datetime(2025, 5, 1, 9, 0, tzinfo=UTC)


def jar() -> aiohttp.CookieJar:
    return aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1


async def csrf_of(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as resp:
        match = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
    assert match, f"no CSRF field on {url}"
    return match.group(1)


# ---- the operator's token ------------------------------------------------------------------


@pytest.mark.slow
async def test_the_login_link_signs_the_operator_in_with_a_safe_cookie(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=jar()) as http,
    ):
        async with http.get(rc.url + "/", allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"].startswith("/login")
        async with http.get(
            f"{rc.url}/login?token={OPERATOR_TOKEN}", allow_redirects=False
        ) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"
            cookie = resp.headers.getall("Set-Cookie")[0]
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
        assert OPERATOR_TOKEN not in cookie
        async with http.get(rc.url + "/") as resp:
            assert resp.status == 200 and "#general" in await resp.text()
        async with http.get(f"{rc.url}/login?token=wrong", allow_redirects=False) as resp:
            assert resp.status == 403


async def test_the_operator_can_paste_the_token_in_the_form(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=jar()) as http,
    ):
        csrf = await csrf_of(http, rc.url + "/login")
        async with http.post(
            rc.url + "/login", data={"token": "wrong", "csrf": csrf, "next": "/"}
        ) as resp:
            assert resp.status == 403 and "not valid" in await resp.text()
        csrf = await csrf_of(http, rc.url + "/login")
        async with http.post(
            rc.url + "/login", data={"token": OPERATOR_TOKEN, "next": "/audit"}
        ) as resp:
            assert resp.status == 403  # no CSRF token: refused, even with the right token
        async with http.post(
            rc.url + "/login",
            data={"token": OPERATOR_TOKEN, "csrf": csrf, "next": "https://evil.example/"},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"  # never off-site


class Terminal(io.StringIO):
    """Output that says it is a terminal, as an operator's shell is."""

    def isatty(self) -> bool:
        return True


async def test_a_generated_token_is_printed_as_a_link_and_a_set_one_never_is(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    from speakermem.integrations.web.server import WebConsole
    from speakermem.memory.console import ConsoleReads
    from speakermem.memory.governance.service import Governance

    db = copy_store(console_store, tmp_path)
    for token in (None, SecretStr(OPERATOR_TOKEN)):
        settings = settings_for(db, web_admin_token=token)
        engine = await MemoryEngine.open(settings.memory_config(), None)
        out = Terminal()
        console = WebConsole(
            settings, ConsoleReads(engine), Governance(engine), recaller=None, port=0, out=out
        )
        await console.start()
        try:
            text = out.getvalue()
            assert f"SpeakerMem web console: http://127.0.0.1:{console.port}" in text
            link = re.search(r"(http://\S+/login\?token=\S+)", text)
            if token is None:
                assert link is not None
                async with (
                    aiohttp.ClientSession(cookie_jar=jar()) as http,
                    http.get(link.group(1)) as resp,
                ):
                    assert resp.status == 200 and "Overview" in await resp.text()
            else:
                assert link is None and OPERATOR_TOKEN not in text
        finally:
            await console.stop()
            await engine.close()


async def test_login_attempts_are_limited_per_address(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with aiohttp.ClientSession(cookie_jar=jar()) as http:
        for attempts, expect in ((3, [403, 403, 403, 429]), (10, [403, 403, 403, 303])):
            async with running_console(db, web_login_attempts=attempts) as rc:
                seen = []
                for token in ("a", "b", "c", OPERATOR_TOKEN):
                    async with http.get(
                        f"{rc.url}/login?token={token}", allow_redirects=False
                    ) as resp:
                        seen.append(resp.status)
                        if resp.status == 429:
                            assert resp.headers["Retry-After"] == "60"
                assert seen == expect


async def test_a_session_lasts_web_session_hours(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path), web_session_hours=2.0) as rc,
        aiohttp.ClientSession(cookie_jar=jar()) as http,
    ):
        async with http.get(
            f"{rc.url}/login?token={OPERATOR_TOKEN}", allow_redirects=False
        ) as resp:
            assert "Max-Age=7200" in resp.headers["Set-Cookie"]
        sessions = rc.console.state.sessions
        session = rc.session("member")
        assert session is not None
        cookie = sessions.cookie(session)
        assert sessions.find(cookie, now=session.created + 7199) is session
        assert sessions.find(cookie, now=session.created + 7201) is None
        assert sessions.find(cookie) is None  # expired sessions are dropped


async def test_a_public_https_url_makes_cookies_secure_and_is_the_redirect_uri(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(
            copy_store(console_store, tmp_path),
            web_public_url="https://console.example.org/",
            web_discord_client_id="42",
            web_discord_client_secret=SecretStr(DISCORD_SECRET),
        ) as rc,
        aiohttp.ClientSession(cookie_jar=jar()) as http,
    ):
        local = f"http://127.0.0.1:{rc.console.port}"
        assert rc.url == "https://console.example.org"
        async with http.get(f"{local}/login?token={OPERATOR_TOKEN}", allow_redirects=False) as resp:
            assert "Secure" in resp.headers["Set-Cookie"]
        async with http.get(f"{local}/auth/discord", allow_redirects=False) as resp:
            location = resp.headers["Location"]
        assert "redirect_uri=https://console.example.org/auth/discord/callback" in unquote(location)
        assert DISCORD_SECRET not in location


async def test_every_form_post_needs_its_csrf_token(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Each POST route, signed in (as the operator and as a member) but with no or a forged
    token: 403, and nothing changed (no audit entry, the messages all there)."""
    from tests.test_web_routes import _ids

    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        before = await rc.engine.store.messages.counts()
        posts = [c for c in cases(await _ids(rc)) if c.method == "POST" and c.route != "/login"]
        assert len(posts) >= 10
        for role in ("operator", "admin", "member"):
            session = rc.session(role)
            for case in posts:
                for forged in (None, "forged-token"):
                    data = dict(case.data or {})
                    if forged is not None:
                        data["csrf"] = forged
                    async with http.post(
                        rc.url + case.path,
                        data=data,
                        headers=rc.cookie_header(session),
                        allow_redirects=False,
                    ) as resp:
                        assert resp.status in (403, 404), (role, case.path, resp.status)
        assert await rc.console.state.governance.audit(10) == []
        assert await rc.engine.store.messages.counts() == before


async def test_every_answer_carries_the_security_headers(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=jar()) as http,
    ):
        answers = []
        for path in ("/", "/login", "/static/console.css", "/api/channels", "/nope"):
            async with http.get(rc.url + path, allow_redirects=False) as resp:
                answers.append((path, resp.status, resp.headers))
        async with http.get(f"{rc.url}/login?token={OPERATOR_TOKEN}") as resp:
            answers.append(("/ (signed in)", resp.status, resp.headers))
        async with http.get(rc.url + "/records/999999") as resp:
            answers.append(("/records/999999", resp.status, resp.headers))
        for path, _status, headers in answers:
            csp = headers.get("Content-Security-Policy", "")
            assert "default-src 'none'" in csp and "script-src 'self'" in csp, path
            assert "frame-ancestors 'none'" in csp and "form-action 'self'" in csp, path
            assert headers.get("X-Content-Type-Options") == "nosniff", path
            assert headers.get("X-Frame-Options") == "DENY", path
        statuses = {p: s for p, s, _ in answers}
        assert statuses["/nope"] == 404 and statuses["/records/999999"] == 404


# ---- the platforms ---------------------------------------------------------------------------


async def _platform_store(db: Path) -> None:
    """Discord guild G1 (#c1 public: Ann and Ben; #c2 private: Ben), G2 (Ann is not in it
    with the bot), and a Slack team (C1 public: Sam and Uma; C2 private: Uma)."""
    settings = settings_for(db)
    engine = await MemoryEngine.open(settings.memory_config(), None)
    try:
        layout = [
            (
                Scope(platform="discord", workspace=G1, channel="c1"),
                False,
                [("111", "Ann"), ("222", "Ben")],
            ),
            (Scope(platform="discord", workspace=G1, channel="c2"), True, [("222", "Ben")]),
            (Scope(platform="discord", workspace=G2, channel="c9"), False, [("333", "Cy")]),
            (
                Scope(platform="slack", workspace=TEAM, channel="C1"),
                False,
                [("U1", "Sam"), ("U2", "Uma")],
            ),
            (Scope(platform="slack", workspace=TEAM, channel="C2"), True, [("U2", "Uma")]),
        ]
        for i, (scope, private, people) in enumerate(layout):
            for uid, name in people:
                await engine.roster(
                    RosterEvent(
                        scope=scope, action=RosterAction.JOIN, user_id=uid, name=name, at=T0
                    )
                )
                await engine.ingest(
                    MessageEvent(
                        scope=scope,
                        message_id=f"m{i}{uid}",
                        speaker_id=uid,
                        speaker_name=name,
                        text=f"{name} writes in channel {scope.channel} about plan {i}",
                        ts=T0 + timedelta(minutes=i),
                    )
                )
            await engine.store.channels.set_meta(scope, name=scope.channel, is_private=private)
    finally:
        await engine.close()


@asynccontextmanager
async def discord_console(
    tmp_path: Path,
) -> AsyncIterator[tuple[RunningConsole, DiscordOAuthStandIn]]:
    db = tmp_path / "platforms.db"
    await _platform_store(db)
    standin = await DiscordOAuthStandIn(client_id="42", client_secret=DISCORD_SECRET).start()
    try:
        async with running_console(
            db,
            web_discord_client_id="42",
            web_discord_client_secret=SecretStr(DISCORD_SECRET),
            web_discord_authorize_url=standin.authorize_url,
            discord_api_url=standin.api_url,
        ) as rc:
            yield rc, standin
    finally:
        await standin.close()


def _guild(gid: str, perms: int = 0, owner: bool = False) -> dict[str, Any]:
    return {"id": gid, "name": f"guild {gid}", "owner": owner, "permissions": str(perms)}


async def _overview(http: aiohttp.ClientSession, rc: RunningConsole) -> str:
    async with http.get(rc.url + "/") as resp:
        assert resp.status == 200
        return await resp.text()


@pytest.mark.e2e
async def test_discord_sign_in_gives_a_member_their_channels_and_an_admin_the_guild(
    tmp_path: Path,
) -> None:
    async with discord_console(tmp_path) as (rc, standin):
        standin.add_user("111", "ann", [_guild(G1), _guild("123456789")])
        standin.add_user("222", "ben", [_guild(G1, perms=MANAGE_GUILD)])
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "111"
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 200 and str(resp.url) == rc.url + "/"
            query = standin.authorize_calls[-1]
            assert query["scope"] == "identify guilds"
            assert query["redirect_uri"] == rc.url + "/auth/discord/callback"
            page = await _overview(http, rc)
            assert "#c1" in page and "#c2" not in page and "#c9" not in page
            assert "ann · member" in page
            async with http.get(rc.url + "/audit") as resp:
                assert resp.status == 403
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "222"
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 200
            page = await _overview(http, rc)
            assert "#c1" in page and "#c2" in page and "#c9" not in page
            assert "ben · admin" in page
            async with http.get(rc.url + "/audit") as resp:
                assert resp.status == 200


@pytest.mark.e2e
async def test_discord_rights_are_rechecked_and_a_revoked_token_signs_out(
    tmp_path: Path,
) -> None:
    async with discord_console(tmp_path) as (rc, standin):
        standin.add_user("222", "ben", [_guild(G1, perms=MANAGE_GUILD)])
        standin.next_user = "222"
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 200
            async with http.get(rc.url + "/audit") as resp:
                assert resp.status == 200
            standin.guilds["222"] = [_guild(G1, perms=0)]  # Manage Server taken away
            async with http.get(rc.url + "/audit") as resp:
                assert resp.status == 200  # not re-checked yet (every RECHECK_S)
            rc.console.state.recheck_s = 0.0
            calls = len(standin.calls)
            async with http.get(rc.url + "/audit") as resp:
                assert resp.status == 403
            assert standin.calls[calls:] == ["users/@me/guilds"]
            page = await _overview(http, rc)
            assert "ben · member" in page and "#c2" in page  # his roster: still a member there
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "222"
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 200
            standin.revoke("222")
            async with http.get(rc.url + "/", allow_redirects=False) as resp:
                assert resp.status == 303 and resp.headers["Location"].startswith("/login")


@pytest.mark.e2e
async def test_a_discord_sign_in_that_is_cancelled_or_forged_is_refused(tmp_path: Path) -> None:
    async with discord_console(tmp_path) as (rc, standin):
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = None
            async with http.get(rc.url + "/auth/discord") as resp:
                assert resp.status == 403 and "cancelled" in await resp.text()
            standin.add_user("111", "ann", [_guild(G1)])
            standin.next_user = "111"
            async with http.get(rc.url + "/auth/discord", allow_redirects=False) as resp:
                consent = resp.headers["Location"]
            async with http.get(consent, allow_redirects=False) as resp:
                back = resp.headers["Location"]
            forged = re.sub(r"state=[^&]+", "state=forged", back)
            async with http.get(forged) as resp:
                assert resp.status == 403
        async with (
            aiohttp.ClientSession(cookie_jar=jar()) as other_browser,
            other_browser.get(back) as resp,  # a code replayed in another browser
        ):
            assert resp.status == 403


@asynccontextmanager
async def slack_console(
    tmp_path: Path, users: dict[str, dict[str, Any]], *, bot_token: str | None = SLACK_BOT_TOKEN
) -> AsyncIterator[tuple[RunningConsole, SlackSignInStandIn]]:
    db = tmp_path / "platforms.db"
    await _platform_store(db)
    standin = await SlackSignInStandIn(
        client_id="777.888", client_secret=SLACK_SECRET, users=users
    ).start()
    try:
        async with running_console(
            db,
            web_slack_client_id="777.888",
            web_slack_client_secret=SecretStr(SLACK_SECRET),
            web_slack_authorize_url=standin.authorize_url,
            slack_api_url=standin.base_url,
            slack_bot_token=SecretStr(bot_token) if bot_token else None,
        ) as rc:
            yield rc, standin
    finally:
        await standin.close()


@pytest.mark.e2e
async def test_sign_in_with_slack_reads_admin_rights_with_the_bot_token(tmp_path: Path) -> None:
    users = {"U1": {"real_name": "Sam"}, "U2": {"real_name": "Uma", "is_admin": True}}
    async with slack_console(tmp_path, users) as (rc, standin):
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "U1"
            async with http.get(rc.url + "/auth/slack") as resp:
                assert resp.status == 200
            page = await _overview(http, rc)
            assert "#C1" in page and "#C2" not in page and "Sam · member" in page
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            standin.next_user = "U2"
            async with http.get(rc.url + "/auth/slack") as resp:
                assert resp.status == 200
            page = await _overview(http, rc)
            assert "#C2" in page and "Uma · admin" in page
        query = standin.authorize_calls[-1]
        assert set(query["scope"].split()) == {"openid", "profile"} and query["nonce"]
        info = standin.method_calls("users.info")
        assert info and all(c["_authorization"] == f"Bearer {SLACK_BOT_TOKEN}" for c in info)


@pytest.mark.e2e
async def test_a_slack_id_token_for_another_sign_in_is_refused(tmp_path: Path) -> None:
    async with slack_console(tmp_path, {"U1": {"real_name": "Sam"}}) as (rc, standin):
        standin.next_user = "U1"
        standin.id_token_nonce = "someone-elses-nonce"
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            async with http.get(rc.url + "/auth/slack") as resp:
                assert resp.status == 403 and "not issued for this sign-in" in await resp.text()
            async with http.get(rc.url + "/", allow_redirects=False) as resp:
                assert resp.status == 303


@pytest.mark.e2e
async def test_without_a_bot_token_only_the_admin_list_makes_slack_admins(tmp_path: Path) -> None:
    users = {"U2": {"real_name": "Uma", "is_admin": True}}
    async with slack_console(tmp_path, users, bot_token=None) as (rc, standin):
        standin.next_user = "U2"
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            async with http.get(rc.url + "/auth/slack") as resp:
                assert resp.status == 200
            page = await _overview(http, rc)
            assert "Uma · member" in page and "#C2" in page  # on C2's roster: a member there
        assert standin.method_calls("users.info") == []


@pytest.mark.e2e
async def test_no_token_or_secret_in_any_page_or_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sign in every way, open every page as each person, and look for every secret in the
    pages, their headers and the log (at DEBUG)."""
    caplog.set_level(logging.DEBUG)
    users = {"U2": {"real_name": "Uma", "is_admin": True}}
    seen: list[str] = []
    async with (
        discord_console(tmp_path / "d") as (drc, discord),
        slack_console(tmp_path / "s", users) as (src, slack),
    ):
        discord.add_user("222", "ben", [_guild(G1, perms=MANAGE_GUILD)])
        discord.next_user = "222"
        slack.next_user = "U2"
        for rc, start in ((drc, None), (drc, "/auth/discord"), (src, "/auth/slack")):
            async with aiohttp.ClientSession(cookie_jar=jar()) as http:
                first = f"/login?token={OPERATOR_TOKEN}" if start is None else start
                async with http.get(rc.url + first) as resp:
                    seen.append(await resp.text())
                rc.console.state.recheck_s = 0.0  # re-check on every page, tokens in use
                for path in ("/", "/ask", "/people", "/me", "/audit", "/api/channels"):
                    async with http.get(rc.url + path) as resp:
                        seen.append(await resp.text())
                        seen.append(str(dict(resp.headers)))
                links = set(re.findall(r'href="(/(?:c|people|records)/[^"]+)"', "".join(seen)))
                for link in sorted(links)[:20]:
                    async with http.get(rc.url + link.replace("&amp;", "&")) as resp:
                        seen.append(await resp.text())
        user_tokens = list(discord._tokens) + list(slack._user_tokens)
    secrets = [OPERATOR_TOKEN, DISCORD_SECRET, SLACK_SECRET, SLACK_BOT_TOKEN, *user_tokens]
    assert len(user_tokens) >= 2
    text = "\n".join(seen)
    logged = caplog.text
    assert "ben" in text and "Uma" in text  # the pages were really read
    for secret in secrets:
        assert secret not in text, "a secret in a page"
        assert secret not in logged, "a secret in the log"


def test_sessions_are_signed_and_unknown_ones_refused() -> None:
    from speakermem.integrations.web.access import Principal
    from speakermem.integrations.web.sessions import Sessions, Signer

    sessions = Sessions(Signer(), ttl_s=60)
    session = sessions.create(Principal(name="x", operator=True), provider=None)
    cookie = sessions.cookie(session)
    assert sessions.find(cookie) is session
    sid, _, mac = cookie.rpartition(".")
    assert sessions.find(f"{sid}.{mac[:-2]}xx") is None  # a forged signature
    other = Sessions(Signer(), ttl_s=60)
    assert other.find(cookie) is None  # another process's key
    assert sessions.find(None) is None and sessions.find("garbage") is None
    assert time.time() - session.created < 5
