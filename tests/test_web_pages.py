"""What the console's pages show and do beyond access: the who-talks-to-whom picture, the
platform sign-in buttons the settings turn on, a member's own opt-out and forget-me, the
export, and a record's provenance."""

from __future__ import annotations

import json
import math
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from speakermem.integrations.web.graph import MAX_WIDTH, SIZE, layout
from speakermem.memory.console import Edge, Graph
from tests.web_fixtures import (
    GENERAL,
    LEADS,
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
)


def test_the_graph_layout_puts_people_on_a_circle_and_scales_arrows() -> None:
    graph = Graph(
        edges=[Edge("a", "b", 9), Edge("b", "a", 1), Edge("c", "a", 4)],
        names={"a": "Ann", "b": "Ben", "c": "Cy"},
        window=100,
    )
    drawing = layout(graph)
    assert [n.label for n in drawing.nodes] == ["Ann", "Ben", "Cy"]  # busiest first
    centre = SIZE / 2
    radii = {round(math.hypot(n.x - centre, n.y - centre)) for n in drawing.nodes}
    assert len(radii) == 1  # all on one circle
    widths = [a.width for a in drawing.arrows]
    assert widths[0] == MAX_WIDTH and widths[1] < widths[2] < widths[0]
    assert drawing.arrows[0].title == "Ann → Ben: 9 messages"
    # A->B and B->A are drawn apart, not on top of each other
    ab, ba = drawing.arrows[0], drawing.arrows[1]
    assert (ab.x1, ab.y1) != (ba.x2, ba.y2)
    assert layout(Graph(edges=[], names={}, window=1)).arrows == []


async def _get(http: aiohttp.ClientSession, rc: RunningConsole, role: str, path: str) -> str:
    async with http.get(rc.url + path, headers=rc.cookie_header(rc.session(role))) as resp:
        assert resp.status == 200, (path, resp.status)
        return await resp.text()


async def test_the_graph_page_draws_the_channels_addressee_graph(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        graph = await rc.console.state.reads.graph(GENERAL)
        page = await _get(http, rc, "member", "/c/shell/local/general/graph")
        assert graph.edges and page.count("<line ") == len(graph.edges)
        assert "<svg" in page and ">Alice</text>" in page
        assert "style=" not in page.split("<svg", 1)[1].split("</svg>", 1)[0]  # CSP-safe


async def test_sign_in_buttons_appear_only_for_configured_platforms(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with running_console(db) as rc:
            async with http.get(rc.url + "/login") as resp:
                assert "Sign in with" not in await resp.text()
            async with http.get(rc.url + "/auth/discord", allow_redirects=False) as resp:
                assert resp.status == 404
        async with running_console(
            db,
            web_slack_client_id="1.2",
            web_slack_client_secret=SecretStr("s"),
            web_slack_authorize_url="https://slack.example/authorize",
        ) as rc:
            async with http.get(rc.url + "/login") as resp:
                page = await resp.text()
            assert "Sign in with Slack" in page and "Sign in with Discord" not in page
            async with http.get(rc.url + "/auth/slack", allow_redirects=False) as resp:
                assert resp.status == 302
                assert resp.headers["Location"].startswith("https://slack.example/authorize?")


async def test_a_member_opts_out_exports_and_forgets_themselves(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        carol = rc.session("member")
        assert carol is not None
        headers = rc.cookie_header(carol)
        governance = rc.console.state.governance
        async with http.get(rc.url + "/me/export.json?w=shell/local", headers=headers) as resp:
            data = json.loads(await resp.text())
            assert resp.headers["Content-Disposition"].startswith("attachment")
        assert data["user_id"] == "carol" and data["messages"] and data["records"]
        assert {m["channel"] for m in data["messages"]} == {"general"}

        async with http.post(
            rc.url + "/me/opt-out",
            data={"w": "shell/local", "out": "1", "csrf": carol.csrf},
            headers=headers,
        ) as resp:
            assert resp.status == 200 and "you are opted out" in await resp.text()
        assert await governance.is_opted_out("shell", "local", "carol")

        async with http.post(
            rc.url + "/me/forget/confirm",
            data={"w": "shell/local", "csrf": carol.csrf},
            headers=headers,
        ) as resp:
            page = await resp.text()
        assert resp.status == 200 and "Receipt (forget-me of carol)" in page
        me = await _get(http, rc, "member", "/me")
        assert "holds <strong>0</strong> of your messages" in me
        entries = await governance.audit(5)
        assert [e["action"] for e in entries[:2]] == ["forget-me", "opt-out"]
        assert entries[0]["actor"] == "web:shell:carol"


async def test_a_record_page_shows_its_sources_and_chain(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        rec = (await rc.records_in(LEADS))[0]
        view = await rc.console.state.reads.record(rec.id)
        assert view is not None
        page = await _get(http, rc, "admin", f"/records/{rec.id}")
        for source in view.sources:
            assert source.text.replace("'", "&#39;") in page
        assert "Update chain" in page and f'href="/records/{rec.id}"' in page
        assert 'action="/messages/forget"' in page  # the admin may forget a source
        member_view = await _get(
            http, rc, "member", f"/records/{(await rc.records_in(GENERAL))[0].id}"
        )
        assert 'action="/messages/forget"' not in member_view


async def test_a_channel_search_shows_its_hits_on_the_channel_page(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        reads = rc.console.state.reads
        hits = await reads.search(GENERAL, "sync")
        assert hits
        member = rc.session("member")
        assert member is not None
        base = "/c/shell/local/general"
        async with http.post(
            rc.url + base + "/search",
            data={"q": "sync", "csrf": member.csrf},
            headers=rc.cookie_header(member),
        ) as resp:
            page = await resp.text()
        assert resp.status == 200
        for hit in hits[:3]:
            assert hit.message.text.replace("'", "&#39;") in page
        # the rest of the channel page is there too
        assert page.count(base + "?person=") >= 1
