"""Console errors keep their headers (issue #40, item 6): an id or page number past 64 bits
names nothing (404), a body that does not parse is a 400, and every error answer, a fault
of ours included, carries the Content-Security-Policy and Cache-Control: no-store, with no
traceback in the log for what a visitor can send."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from speakermem.integrations.web.server import CSP
from tests.web_fixtures import (
    RunningConsole,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
)

HUGE = "9" * 25  # past 64 bits; int() takes it, the drivers refuse to bind it
PAGE_OVERFLOW = str(2**63 // 25 + 1)  # fits 64 bits, but times a page overflows the offset
OVER_INT_LIMIT = "7" * 4301  # int() itself refuses this many digits


def assert_secured(resp: aiohttp.ClientResponse) -> None:
    assert resp.headers.get("Content-Security-Policy") == CSP
    assert resp.headers.get("Cache-Control") == "no-store"


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text


async def get(http: aiohttp.ClientSession, rc: RunningConsole, path: str) -> int:
    headers = rc.cookie_header(rc.session("operator"))
    async with http.get(rc.url + path, headers=headers, allow_redirects=False) as resp:
        assert_secured(resp)
        return resp.status


@pytest.mark.slow
async def test_numbers_past_64_bits_are_404_with_headers(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with running_console(db) as rc, aiohttp.ClientSession() as http:
        paths = [
            f"/records/{HUGE}",
            f"/api/records/{HUGE}",
            f"/records/{OVER_INT_LIMIT}",
            f"/c/shell/local/general?page={HUGE}",
            f"/c/shell/local/general?page={PAGE_OVERFLOW}",
            f"/people?page={HUGE}",
            f"/people/shell/local/alice?page={PAGE_OVERFLOW}",
        ]
        with caplog.at_level(logging.INFO):
            for path in paths:
                assert await get(http, rc, path) == 404, path
            # the largest page that still names rows' offsets is an empty page, not an error
            assert await get(http, rc, f"/c/shell/local/general?page={2**63 // 25}") == 200
        no_tracebacks(caplog)


@pytest.mark.slow
async def test_malformed_form_bodies_are_400_with_headers(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = copy_store(console_store, tmp_path)
    bodies = [
        ("multipart/form-data", b"--x\r\nnot a part"),  # no boundary parameter
        ("multipart/form-data; boundary=zz", b"--zz\r\nContent-Disposition: broken\r\n\r\nx"),
        ("application/x-www-form-urlencoded; charset=no-such-charset", b"a=b"),
        ("application/x-www-form-urlencoded", b"next=%FF%FE&csrf=\xff\xfe"),
    ]
    async with running_console(db) as rc, aiohttp.ClientSession() as http:
        cookie = rc.cookie_header(rc.session("member"))
        with caplog.at_level(logging.INFO):
            for path, headers in (("/login", {}), ("/ask", cookie), ("/people/find", cookie)):
                for content_type, body in bodies:
                    async with http.post(
                        rc.url + path,
                        data=body,
                        headers={**headers, "Content-Type": content_type},
                        allow_redirects=False,
                    ) as resp:
                        assert resp.status == 400, (path, content_type, resp.status)
                        assert_secured(resp)
        no_tracebacks(caplog)


@pytest.mark.slow
async def test_a_fault_of_ours_is_a_500_page_with_headers(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = copy_store(console_store, tmp_path)
    async with running_console(db) as rc, aiohttp.ClientSession() as http:

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the store went away")

        monkeypatch.setattr(rc.console.state.reads, "channels", broken)
        headers = rc.cookie_header(rc.session("operator"))
        for path in ("/", "/api/channels"):
            async with http.get(rc.url + path, headers=headers) as resp:
                assert resp.status == 500, path
                assert_secured(resp)
                assert "the store went away" not in await resp.text()
