"""Debian's Chromium driven by Playwright, for the console's browser tests and screenshots.

Never a downloaded browser: `/usr/bin/chromium` (Debian's `chromium` package, which
`.ci/run` installs) with the flags this machine needs (no background networking: its
connections would be refused) and a fresh profile each time.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is absent (apt-get install chromium)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download)"
    return None


@asynccontextmanager
async def chromium_page(*, width: int = 1280, height: int = 900) -> AsyncIterator[Any]:
    """A page in a new headless Chromium with an empty profile (removed afterwards)."""
    from playwright.async_api import async_playwright

    profile = tempfile.mkdtemp(prefix="speakermem-chromium-")
    try:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=FLAGS,
                viewport={"width": width, "height": height},
            )
            try:
                page = context.pages[0] if context.pages else await context.new_page()
                page.set_default_timeout(15_000)
                yield page
            finally:
                await context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
