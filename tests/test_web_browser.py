"""The console in a real headless Chromium (Debian's, driven by Playwright): sign in with the
printed link, search a channel, open a record's sources, forget a person from the UI, and see
that `/recall` (Ask) no longer cites them. Also: a member signs in with Discord.

Marked `browser`; skipped where /usr/bin/chromium or Playwright is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import browser
from tests.web_fixtures import (
    OPERATOR_TOKEN,
    console_store,  # noqa: F401 - fixture
    copy_store,
    running_console,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing())),
    pytest.mark.e2e,
]

QUESTION = "What did Bobby propose for offline sync?"


async def _ask(page: object, question: str) -> list[str]:
    """Ask in #general from the Ask page; the speakers the answer cites."""
    p = page  # a playwright Page
    await p.click("nav >> text=Ask")  # type: ignore[attr-defined]
    await p.select_option("#channel", "shell/local/general")  # type: ignore[attr-defined]
    await p.fill("#question", question)  # type: ignore[attr-defined]
    await p.click("form.ask button[type=submit]")  # type: ignore[attr-defined]
    await p.wait_for_selector("section.answer")  # type: ignore[attr-defined]
    return [s.strip() for s in await p.locator("li.citation .who").all_inner_texts()]  # type: ignore[attr-defined]


async def test_an_admin_finds_a_persons_records_sees_sources_and_forgets_them(
    console_store: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with (
        running_console(copy_store(console_store, tmp_path)) as rc,
        browser.chromium_page() as page,
    ):
        # sign in with the operator's link: the overview, with the demo's channels
        await page.goto(f"{rc.url}/login?token={OPERATOR_TOKEN}")
        assert page.url == rc.url + "/"
        assert await page.locator("table.channels").inner_text() != ""
        assert await page.locator("text=#general").count() >= 1
        assert await page.locator("text=#leads").count() >= 1

        # before: /recall cites Bob
        assert "Bob" in await _ask(page, QUESTION)

        # a channel: search its messages
        await page.click("nav >> text=Overview")
        await page.click("table.channels >> text=#general")
        await page.wait_for_selector("input[name=q]")
        await page.fill("input[name=q]", "offline sync")
        await page.click("form[action$='/search'] button[type=submit]")
        await page.wait_for_selector("ol.hits")
        hits = await page.locator("li.hit").all_inner_texts()
        assert hits and any("sync" in h.lower() for h in hits)

        # records by person: Bob, then one record and its source messages
        await page.click("ul.people >> text=Bob")
        await page.wait_for_url("**person=bob**")
        await page.wait_for_selector("ul.records li.record")
        record_text = (await page.locator("ul.records li.record a").first.inner_text()).strip()
        await page.locator("ul.records li.record a").first.click()
        await page.wait_for_selector("ol.sources li.source")
        assert (await page.locator("h1.record-content").inner_text()).strip() == record_text
        sources = await page.locator("ol.sources li.source").all_inner_texts()
        assert any("Bob" in s for s in sources)
        assert await page.locator("ol.chain li").count() >= 1

        # forget Bob from his page: a confirmation, then the receipt
        await page.click("nav >> text=People")
        await page.click("p.tabs >> text=shell/local")
        await page.wait_for_selector("table.people-table")
        await page.click("table.people-table >> text=Bob")
        await page.wait_for_selector("text=Forget this person…")
        await page.click("text=Forget this person…")
        await page.wait_for_selector("section.confirm")
        assert "cannot be undone" in await page.locator("section.confirm").inner_text()
        await page.click("section.confirm button[type=submit]")
        await page.wait_for_selector("section.receipt")
        receipt = await page.locator("section.receipt").inner_text()
        assert "Forgot Bob" in receipt and "messages" in receipt

        # after: /recall no longer cites him, and his page holds nothing
        assert "Bob" not in await _ask(page, QUESTION)
        await page.click("nav >> text=Audit")
        await page.wait_for_selector("table.audit")
        assert "forget-user" in await page.locator("table.audit").inner_text()


async def test_a_member_signs_in_with_discord_and_sees_only_their_channels(
    tmp_path: Path,
) -> None:
    from tests.test_web_auth import G1, _guild, discord_console

    async with discord_console(tmp_path) as (rc, standin), browser.chromium_page() as page:
        standin.add_user("111", "ann", [_guild(G1)])
        standin.next_user = "111"
        await page.goto(rc.url + "/")
        assert "/login" in page.url
        await page.click("text=Sign in with Discord")
        await page.wait_for_selector("table.channels")
        assert page.url == rc.url + "/"
        channels = await page.locator("table.channels").inner_text()
        assert "#c1" in channels and "#c2" not in channels
        await page.goto(rc.url + f"/c/discord/{G1}/c2")
        assert "Not found" in await page.locator("h1").inner_text()
