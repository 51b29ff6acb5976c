"""Screenshots of the console's main pages for docs/web-console.md, from the browser tests'
store (tests/web_fixtures.py) in Debian's headless Chromium.

    python -m tests.web_screenshots            # writes docs/img/console-*.png

Needs /usr/bin/chromium and Playwright, like the browser tests. Deterministic data, so the
pictures change only when the pages do.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests import browser
from tests.web_fixtures import OPERATOR_TOKEN, build_store, running_console

ROOT = Path(__file__).resolve().parents[1]


async def shoot(out: Path) -> list[Path]:
    """Build the store, sign in, and save each page to `out` (an existing folder)."""
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "console.db"
        await build_store(db)
        async with running_console(db) as rc, browser.chromium_page(width=1200, height=820) as page:

            async def snap(name: str, *, full: bool = False) -> None:
                path = out / f"console-{name}.png"
                await page.screenshot(path=str(path), full_page=full)
                written.append(path)

            await page.goto(f"{rc.url}/login")
            await snap("login")
            await page.goto(f"{rc.url}/login?token={OPERATOR_TOKEN}")
            await snap("overview")
            await page.goto(f"{rc.url}/c/shell/local/general?person=bob")
            await page.fill("input[name=q]", "offline sync")
            await page.click("form[action$='/search'] button[type=submit]")
            await page.wait_for_selector("ol.hits")
            await snap("channel", full=True)
            await page.goto(f"{rc.url}/c/shell/local/general?person=bob")
            await page.locator("ul.records li.record a").first.click()
            await page.wait_for_selector("ol.sources")
            await snap("record")
            await page.goto(f"{rc.url}/c/shell/local/general/graph")
            await snap("graph")
            await page.goto(f"{rc.url}/ask")
            await page.select_option("#channel", "shell/local/general")
            await page.fill("#question", "What did Bobby propose for offline sync?")
            await page.click("form.ask button[type=submit]")
            await page.wait_for_selector("section.answer")
            await snap("ask")
            await page.goto(f"{rc.url}/people?w=shell/local")
            await snap("people")
            await page.goto(f"{rc.url}/people/shell/local/bob")
            await snap("person")
            await page.click("text=Forget this person…")
            await page.wait_for_selector("section.confirm")
            await snap("forget-confirm")
            await page.click("section.confirm button[type=submit]")
            await page.wait_for_selector("section.receipt")
            await snap("forget-receipt")
            await page.goto(f"{rc.url}/audit")
            await snap("audit")
            member = rc.session("member")  # Carol
            assert member is not None
            await page.context.clear_cookies()
            await page.context.add_cookies(
                [
                    {
                        "name": "speakermem_session",
                        "value": rc.console.state.sessions.cookie(member),
                        "url": rc.url,
                    }
                ]
            )
            await page.goto(f"{rc.url}/me")
            await snap("me")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder")
    args = parser.parse_args(argv)
    why = browser.missing()
    if why is not None:
        print(f"cannot take screenshots: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(args.out)):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
