"""The web console's HTTP server: the aiohttp application, its security headers, and
`WebConsole`, which `speakermem web` and `speakermem run` (with SPEAKERMEM_WEB_PORT) start.

Every response carries a Content-Security-Policy that allows only this console's own
scripts, styles and forms, and is never framed; pages are not cached. Sessions, CSRF and
login limits are `integrations.web.sessions`; who sees what is `integrations.web.access`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import TextIO

from aiohttp import web
from pydantic import SecretStr

from speakermem.bot.settings import Settings
from speakermem.integrations.web import (
    DEFAULT_PORT,
    routes_auth,
    routes_browse,
    routes_me,
    routes_people,
)
from speakermem.integrations.web.client_address import parse_networks
from speakermem.integrations.web.oauth import DiscordOAuth, Provider, SlackOIDC
from speakermem.integrations.web.sessions import LoginLimiter, Sessions, Signer
from speakermem.integrations.web.state import STATE, ConsoleState, render
from speakermem.memory.console import ConsoleReads
from speakermem.memory.governance.service import Governance
from speakermem.memory.private_files import write_private_text
from speakermem.memory.query.pipeline import Recaller
from speakermem.memory.url_masking import mask_url

log = logging.getLogger(__name__)

LOGIN_LINK_FILE = "speakermem-login-link.txt"
"""The file a generated operator login link is written to when stdout is not a terminal."""


CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ERROR_TITLES = {
    400: "Bad request",
    401: "Sign in first",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    413: "Too large",
    429: "Slow down",
    500: "Server error",
}


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Headers on every answer, errors included; error pages rendered as HTML."""
    try:
        resp = await handler(request)
    except Exception as exc:
        if not isinstance(exc, web.HTTPException):
            # a fault of ours: logged once, answered as a page that keeps every header
            log.exception("console: %s %s failed", request.method, request.path)
            exc = web.HTTPInternalServerError(text="Something went wrong; it has been logged.")
        if (
            exc.status < 400
            or request.path.startswith("/api/")
            or "json" in (request.headers.get("Accept") or "")
        ):
            _secure(exc, request)
            raise exc from None
        resp = render(
            request,
            "error.html",
            {
                "viewer": None,
                "csrf": "",
                "title": ERROR_TITLES.get(exc.status, "Error"),
                "message": exc.text or exc.reason,
                "status": exc.status,
            },
            status=exc.status,
        )
        for name in ("Retry-After", "WWW-Authenticate"):
            if name in exc.headers:
                resp.headers[name] = exc.headers[name]
    _secure(resp, request)
    return resp


def _is_tty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream is no terminal
        return False


def _secure(resp: web.StreamResponse, request: web.Request) -> None:
    resp.headers.update(SECURITY_HEADERS)
    if not request.path.startswith("/static/"):
        resp.headers["Cache-Control"] = "no-store"


def build_app(state: ConsoleState) -> web.Application:
    app = web.Application(middlewares=[security_headers], client_max_size=256 * 1024)
    app[STATE] = state
    routes_auth.add_routes(app)
    routes_browse.add_routes(app)
    routes_people.add_routes(app)
    routes_me.add_routes(app)
    static = resources.files("speakermem.integrations.web").joinpath("static")
    app.router.add_static("/static/", str(static), append_version=False)

    async def close_client(_app: web.Application) -> None:
        if state.http is not None:
            await state.http.close()

    app.on_cleanup.append(close_client)
    return app


def providers(settings: Settings) -> dict[str, Provider]:
    """The platform sign-ins configured (each needs its client id and secret)."""
    out: dict[str, Provider] = {}
    if settings.web_discord_client_id and settings.web_discord_client_secret is not None:
        out["discord"] = DiscordOAuth(
            client_id=settings.web_discord_client_id,
            client_secret=settings.web_discord_client_secret,
            authorize_url=settings.web_discord_authorize_url,
            api_url=settings.discord_api_url,
        )
    if settings.web_slack_client_id and settings.web_slack_client_secret is not None:
        out["slack"] = SlackOIDC(
            client_id=settings.web_slack_client_id,
            client_secret=settings.web_slack_client_secret,
            authorize_url=settings.web_slack_authorize_url,
            api_url=settings.slack_api_url,
            bot_token=settings.slack_bot_token,
            admin_ids=settings.slack_admin_ids,
        )
    return out


class WebConsole:
    """The console on `host:port`, over one engine's reads and governance."""

    def __init__(
        self,
        settings: Settings,
        reads: ConsoleReads,
        governance: Governance,
        *,
        recaller: Recaller | None,
        host: str | None = None,
        port: int | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.settings = settings
        self.host = host or settings.web_host
        self.port = DEFAULT_PORT if port is None else port
        self.out = out
        token = settings.web_admin_token
        self.generated_token = token is None or not token.get_secret_value()
        admin_token = SecretStr(secrets.token_urlsafe(32)) if self.generated_token else token
        assert admin_token is not None
        self.state = ConsoleState(
            reads=reads,
            governance=governance,
            recaller=recaller,
            sessions=Sessions(Signer(), ttl_s=settings.web_session_hours * 3600.0),
            limiter=LoginLimiter(settings.web_login_attempts),
            admin_token=admin_token,
            public_url="",
            providers=providers(settings),
            trusted_proxies=parse_networks(settings.web_trusted_proxies or ()),
        )
        self.app = build_app(self.state)
        self._runner: web.AppRunner | None = None
        self._warm: asyncio.Task[None] | None = None
        self._link_written: Path | None = None

    @property
    def url(self) -> str:
        """Where people open the console (SPEAKERMEM_WEB_PUBLIC_URL when set)."""
        if self.settings.web_public_url:
            return self.settings.web_public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def login_url(self) -> str:
        """The operator's sign-in link (it holds the token: shown only when generated)."""
        return f"{self.url}/login?token={self.state.admin_token.get_secret_value()}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self.state.public_url = self.url
        self._warm = asyncio.create_task(self.state.reads.warm(), name="console-warm")
        log.info("web console on %s (bound to %s:%s)", mask_url(self.url), self.host, self.port)
        if self.out is not None:
            self._announce(self.out)

    def _announce(self, out: TextIO) -> None:
        """Tell the operator where the console is; print the login link only for a token
        generated now (a token the operator set is theirs, never echoed)."""
        out.write(f"SpeakerMem web console: {self.url}\n")
        if self.generated_token and _is_tty(out):
            out.write(
                "Sign in as the operator with this link (a new one each start; set "
                "SPEAKERMEM_WEB_ADMIN_TOKEN to keep one):\n"
                f"    {self.login_url()}\n"
            )
        elif self.generated_token:
            # journald and `docker logs` keep stdout: the link goes to a file only the bot's
            # user can read, and the log says where
            path = self.login_link_path
            write_private_text(path, self.login_url() + "\n")
            self._link_written = path
            log.info("web console: the operator's login link is in %s (mode 0600)", path)
            out.write(f"Sign in as the operator with the link in {path} (readable by you only).\n")
        else:
            out.write("Sign in as the operator with SPEAKERMEM_WEB_ADMIN_TOKEN at /login.\n")
        for provider in self.state.providers.values():
            out.write(f"{provider.label}: {self.url}/auth/{provider.name}\n")
        out.flush()

    @property
    def login_link_path(self) -> Path:
        """Where a generated login link goes when stdout is no terminal: beside the
        database file (the bot's own directory)."""
        return Path(self.settings.db_path).absolute().parent / LOGIN_LINK_FILE

    async def stop(self) -> None:
        if self._link_written is not None:  # its token dies with this process
            with contextlib.suppress(OSError):
                self._link_written.unlink()
            self._link_written = None
        if self._warm is not None:
            self._warm.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warm
            self._warm = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.state.sessions.drop_all()
