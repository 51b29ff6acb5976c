"""Every console route, for every role: operator, workspace admin, member, member of another
workspace, signed out. What each may do, and that what they may not see never comes back
(a member asking for a private channel's record by id gets 404, never its content).

A route added to the console without a row here fails `test_every_route_is_in_the_matrix`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from tests.web_fixtures import (
    GENERAL,
    LEADS,
    RANDOM,
    ROLES,
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
)

ROLE_NAMES = list(ROLES)
DISCORD_APP = {
    "web_discord_client_id": "1234",
    "web_discord_client_secret": SecretStr("discord-app-secret"),
    "discord_api_url": "http://127.0.0.1:9/api/v10",
}


@dataclass
class Case:
    """One request and the status each role gets (operator, admin, member, other, anonymous)."""

    method: str
    route: str
    """The route as registered (its canonical path), for the coverage check."""
    path: str
    expect: tuple[int, int, int, int, int]
    data: dict[str, str] | None = None
    hidden: dict[str, list[str]] = field(default_factory=dict)
    """Role -> texts that must not appear in the answer, whatever its status."""

    def status_for(self, role: str) -> int:
        return self.expect[ROLE_NAMES.index(role)]


def cases(ids: dict[str, Any]) -> list[Case]:
    """The matrix; destructive requests last (each role runs on its own copy of the store)."""
    g, leads, rnd = (f"/c/{s.platform}/{s.workspace}/{s.channel}" for s in (GENERAL, LEADS, RANDOM))
    c = "/c/{platform}/{workspace}/{channel}"
    person = "/people/{platform}/{workspace}/{user_id}"
    leads_texts = ids["leads_texts"]
    secret_leads = {"member": leads_texts, "other": leads_texts, "anonymous": leads_texts}
    gen_msg = {"platform": "shell", "workspace": "local", "channel": "general"}
    return [
        Case("GET", "/static", "/static/console.css", (200, 200, 200, 200, 200)),
        Case("GET", "/login", "/login", (303, 303, 303, 303, 200)),
        Case("POST", "/login", "/login", (403, 403, 403, 403, 403), data={"token": "wrong"}),
        Case("GET", "/auth/{provider}", "/auth/discord", (302, 302, 302, 302, 302)),
        Case(
            "GET",
            "/auth/{provider}/callback",
            "/auth/discord/callback?code=x&state=forged",
            (403, 403, 403, 403, 403),
        ),
        Case(
            "GET",
            "/",
            "/",
            (200, 200, 200, 200, 303),
            hidden={"member": ["#leads"], "other": ["#general", "#leads"]},
        ),
        Case(
            "GET",
            "/api/channels",
            "/api/channels",
            (200, 200, 200, 200, 401),
            hidden={"member": ["leads"], "other": ["general", "leads"], "anonymous": ["general"]},
        ),
        Case("GET", c, g, (200, 200, 200, 404, 303), hidden={"other": ["Atlas"]}),
        Case("GET", c, leads, (200, 200, 404, 404, 303), hidden=secret_leads),
        Case("GET", c, rnd, (200, 404, 404, 200, 303)),
        Case("POST", c + "/search", g + "/search", (200, 200, 200, 404, 401), data={"q": "sync"}),
        Case(
            "POST",
            c + "/search",
            leads + "/search",
            (200, 200, 404, 404, 401),
            data={"q": "budget"},
            hidden=secret_leads,
        ),
        Case("GET", c + "/graph", g + "/graph", (200, 200, 200, 404, 303)),
        Case("GET", c + "/graph", leads + "/graph", (200, 200, 404, 404, 303)),
        Case(
            "GET", "/records/{record_id}", f"/records/{ids['general']}", (200, 200, 200, 404, 303)
        ),
        Case(
            "GET",
            "/records/{record_id}",
            f"/records/{ids['leads']}",
            (200, 200, 404, 404, 303),
            hidden=secret_leads,
        ),
        Case(
            "GET",
            "/api/records/{record_id}",
            f"/api/records/{ids['general']}",
            (200, 200, 200, 404, 401),
        ),
        Case(
            "GET",
            "/api/records/{record_id}",
            f"/api/records/{ids['leads']}",
            (200, 200, 404, 404, 401),
            hidden=secret_leads,
        ),
        Case("GET", "/api/records/{record_id}", "/api/records/999999", (404, 404, 404, 404, 401)),
        Case("GET", "/ask", "/ask", (200, 200, 200, 200, 303), hidden={"member": ["leads"]}),
        Case(
            "POST",
            "/ask",
            "/ask",
            (200, 200, 200, 404, 401),
            data={"channel": "shell/local/general", "question": "What did Bob propose?"},
        ),
        Case(
            "POST",
            "/ask",
            "/ask",
            (200, 200, 404, 404, 401),
            data={"channel": "shell/local/leads", "question": "What is the budget?"},
            hidden=secret_leads,
        ),
        Case("GET", "/people", "/people", (200, 200, 200, 200, 303), hidden={"other": ["Bob"]}),
        Case(
            "GET",
            "/people",
            "/people?w=shell/local",
            (200, 200, 200, 404, 303),
        ),
        Case(
            "POST",
            "/people/find",
            "/people/find",
            (303, 303, 303, 404, 401),
            data={"w": "shell/local", "q": "bo"},
        ),
        Case(
            "GET",
            person,
            "/people/shell/local/bob",
            (200, 200, 200, 404, 303),
            hidden=secret_leads,
        ),
        Case("GET", person, "/people/shell/elsewhere/zed", (200, 404, 404, 200, 303)),
        Case("GET", "/me", "/me", (200, 200, 200, 200, 303), hidden={"member": leads_texts}),
        Case(
            "GET",
            "/me/export.json",
            "/me/export.json?w=shell/local",
            (404, 200, 200, 404, 401),
            hidden={"member": leads_texts},
        ),
        Case("GET", "/audit", "/audit", (200, 200, 403, 403, 303)),
        Case(
            "POST", person + "/forget", "/people/shell/local/bob/forget", (200, 200, 403, 404, 401)
        ),
        Case(
            "POST",
            "/messages/forget",
            "/messages/forget",
            (200, 200, 403, 404, 401),
            data={**gen_msg, "message_id": ids["general_message"]},
        ),
        Case(
            "POST",
            "/messages/forget",
            "/messages/forget",
            (200, 200, 404, 404, 401),
            data={**gen_msg, "channel": "leads", "message_id": ids["leads_message"]},
            hidden=secret_leads,
        ),
        Case(
            "POST", "/me/forget", "/me/forget", (404, 200, 200, 404, 401), data={"w": "shell/local"}
        ),
        # ---- destructive: last
        Case(
            "POST",
            "/messages/forget/confirm",
            "/messages/forget/confirm",
            (200, 200, 403, 404, 401),
            data={**gen_msg, "message_id": ids["general_message"]},
        ),
        Case("POST", c + "/memory", g + "/memory", (303, 303, 403, 404, 401), data={"on": "1"}),
        Case("POST", c + "/memory", rnd + "/memory", (303, 404, 404, 403, 401), data={"on": "1"}),
        Case(
            "POST",
            "/me/opt-out",
            "/me/opt-out",
            (404, 303, 303, 404, 401),
            data={"w": "shell/local", "out": "0"},
        ),
        Case(
            "POST",
            person + "/forget/confirm",
            "/people/shell/local/dan/forget/confirm",
            (200, 200, 403, 404, 401),
        ),
        Case(
            "POST",
            "/me/forget/confirm",
            "/me/forget/confirm",
            (404, 200, 200, 404, 401),
            data={"w": "shell/local"},
        ),
        Case("POST", "/logout", "/logout", (303, 303, 303, 303, 401)),
    ]


async def _ids(rc: RunningConsole) -> dict[str, Any]:
    general = await rc.records_in(GENERAL)
    leads = await rc.records_in(LEADS)
    assert general and leads, "the test store has records in both channels"
    store = rc.engine.store
    leads_pk = (await rc.engine.channel_pks([LEADS]))[0]
    leads_messages = await store.messages.channel_corpus(leads_pk)
    return {
        "general": next(r.id for r in general if r.owner == "bob"),
        "leads": leads[0].id,
        "leads_texts": [r.content[:40] for r in leads] + [leads_messages[0][3][:40]],
        "leads_message": (await store.messages.get_many([leads_messages[0][0]]))[
            leads_messages[0][0]
        ].message_id,
        "general_message": "g031",
    }


async def _request(
    http: aiohttp.ClientSession, rc: RunningConsole, role: str, case: Case
) -> tuple[int, str]:
    session = rc.session(role)
    data = None
    if case.method == "POST":
        data = dict(case.data or {})
        if session is not None:
            data["csrf"] = session.csrf
    async with http.request(
        case.method,
        rc.url + case.path,
        data=data,
        headers=rc.cookie_header(session),
        allow_redirects=False,
    ) as resp:
        return resp.status, await resp.text()


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLE_NAMES)
async def test_every_route_for_the_role(role: str, console_store: Path, tmp_path: Path) -> None:  # noqa: F811
    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db, **DISCORD_APP) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        wrong = []
        for case in cases(await _ids(rc)):
            status, body = await _request(http, rc, role, case)
            if status != case.status_for(role):
                wrong.append(
                    f"{case.method} {case.path}: {status}, expected {case.status_for(role)}"
                )
            for text in case.hidden.get(role, []):
                if text in body:
                    wrong.append(f"{case.method} {case.path} shows {text!r} to {role}")
        assert not wrong, "\n".join(wrong)


async def test_every_route_is_in_the_matrix(console_store: Path, tmp_path: Path) -> None:  # noqa: F811
    db = copy_store(console_store, tmp_path)
    async with running_console(db, **DISCORD_APP) as rc:
        registered = set()
        for route in rc.console.app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = info.get("path") or info.get("formatter") or info.get("prefix", "")
            if route.method == "HEAD":
                continue
            registered.add((route.method, path.rstrip("/") or "/"))
        covered = {(c.method, c.route) for c in cases(await _ids(rc))}
    assert registered - covered == set(), "routes without a role test"


async def test_a_member_never_gets_a_private_record_by_id(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Every record of #leads, by page and by API, for Carol (not in #leads): 404 and no content;
    for Alice (admin): the record and its sources."""
    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        records = await rc.records_in(LEADS)
        assert records
        for rec in records:
            for prefix in ("/records/", "/api/records/"):
                case = Case("GET", "", f"{prefix}{rec.id}", (200, 200, 404, 404, 303))
                status, body = await _request(http, rc, "member", case)
                assert status == 404 and rec.content not in body
        case = Case("GET", "", f"/api/records/{records[0].id}", (200, 200, 404, 404, 401))
        status, body = await _request(http, rc, "admin", case)
        data = json.loads(body)
        assert status == 200 and data["content"] == records[0].content
        assert data["sources"] and all(s["present"] for s in data["sources"])


async def test_a_member_who_leaves_a_channel_stops_seeing_it_at_once(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Access is decided per request: leaving #general hides it on the next page."""
    from speakermem.bot.events import RosterAction, RosterEvent

    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        session = rc.session("member")
        headers = rc.cookie_header(session)
        async with http.get(rc.url + "/c/shell/local/general", headers=headers) as resp:
            assert resp.status == 200
        await rc.engine.roster(
            RosterEvent(scope=GENERAL, action=RosterAction.LEAVE, user_id="carol")
        )
        async with http.get(rc.url + "/c/shell/local/general", headers=headers) as resp:
            assert resp.status == 404
        async with http.get(rc.url + "/", headers=headers) as resp:
            assert "#general" not in await resp.text()


async def test_memory_off_hides_a_channel_from_members_but_not_admins(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        admin = rc.session("admin")
        assert admin is not None
        async with http.post(
            rc.url + "/c/shell/local/general/memory",
            data={"csrf": admin.csrf, "on": "0"},
            headers=rc.cookie_header(admin),
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303
        member = rc.session("member")
        async with http.get(
            rc.url + "/c/shell/local/general", headers=rc.cookie_header(member)
        ) as r:
            assert r.status == 404
        async with http.get(
            rc.url + "/c/shell/local/general", headers=rc.cookie_header(admin)
        ) as r:
            assert r.status == 200 and "Turn memory on" in await r.text()
        entries = await rc.console.state.governance.audit(5)
        assert entries[0]["action"] == "channel-off" and entries[0]["actor"] == "web:shell:alice"


async def test_a_forgotten_message_leaves_the_counts_at_once(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with (
        running_console(db) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        admin = rc.session("admin")
        assert admin is not None
        headers = rc.cookie_header(admin)
        async with http.get(rc.url + "/api/channels", headers=headers) as resp:
            before = {c["channel"]: c["messages"] for c in await resp.json()}
        form = {"platform": "shell", "workspace": "local", "channel": "general"}
        async with http.post(
            rc.url + "/messages/forget/confirm",
            data={**form, "message_id": "g031", "csrf": admin.csrf},
            headers=headers,
        ) as resp:
            assert resp.status == 200 and "messages 1" in await resp.text()
        async with http.get(rc.url + "/api/channels", headers=headers) as resp:
            after = {c["channel"]: c["messages"] for c in await resp.json()}
        assert after[str(GENERAL)] == before[str(GENERAL)] - 1
