"""What every console handler reaches through `request.app[STATE]`, and page rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import aiohttp
import jinja2
from aiohttp import web
from pydantic import SecretStr

from speakermem.integrations.web.client_address import Network
from speakermem.integrations.web.oauth import Provider
from speakermem.integrations.web.sessions import LoginLimiter, Sessions
from speakermem.memory.console import ConsoleReads
from speakermem.memory.governance.service import Governance
from speakermem.memory.query.pipeline import Recaller

RECHECK_S = 300.0
"""How often a platform user's workspaces and admin rights are confirmed with the platform."""
RECORDS_PAGE = 25
"""Records per page, of a channel's and of a person's."""


NOT_FOUND = "Not found, or not yours to see."
MAX_ID = 2**63 - 1
"""The largest id either database stores (a signed 64-bit integer)."""


def whole_number(value: object, default: int = 0, *, per: int = 1) -> int:
    """A non-negative integer from a query or path value (a record id, or `?page=` with
    `per` rows a page); `default` when it is not one. One past what a 64-bit id or offset
    can reach names nothing: 404 (the driver would raise on binding it)."""
    text = str(value)
    if not (text.isascii() and text.isdigit()):  # "²" is a digit to isdigit alone
        return default
    if len(text) > 19 or int(text) > MAX_ID // per:  # int() of 4,300+ digits raises
        raise web.HTTPNotFound(text=NOT_FOUND)
    return int(text)


@dataclass
class ConsoleState:
    reads: ConsoleReads
    governance: Governance
    recaller: Recaller | None
    sessions: Sessions
    limiter: LoginLimiter
    admin_token: SecretStr
    public_url: str
    providers: dict[str, Provider] = field(default_factory=dict)
    trusted_proxies: tuple[Network, ...] = ()
    """Whose X-Forwarded-For names the client (SPEAKERMEM_WEB_TRUSTED_PROXIES)."""
    recheck_s: float = RECHECK_S
    http: aiohttp.ClientSession | None = None
    templates: jinja2.Environment = field(default_factory=lambda: templates())

    @property
    def secure_cookies(self) -> bool:
        return self.public_url.startswith("https://")

    def client(self) -> aiohttp.ClientSession:
        """The HTTP client for the platforms (created on first use, closed by the server)."""
        if self.http is None or self.http.closed:
            self.http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=10.0), raise_for_status=False
            )
        return self.http


STATE: web.AppKey[ConsoleState] = web.AppKey("speakermem_console", ConsoleState)


def fmt_time(ts: float | datetime | None) -> str:
    if ts is None:
        return "never"
    if isinstance(ts, datetime):
        ts = ts.timestamp()
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def templates() -> jinja2.Environment:
    """Templates shipped in the package (autoescaped: every value is text, never markup)."""
    folder = resources.files("speakermem.integrations.web").joinpath("templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["time"] = fmt_time
    env.filters["bytes"] = fmt_bytes
    return env


def render(
    request: web.Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status: int = 200,
) -> web.Response:
    state = request.app[STATE]
    text = state.templates.get_template(template).render(**context)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")
