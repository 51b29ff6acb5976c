"""Signing in and out: the operator's token (a login link or the form) and the platforms'
OAuth flows. The only routes that run before `guard`, since they create the session; every
failed attempt counts against the per-address login limit."""

from __future__ import annotations

import logging
from urllib.parse import urlparse

from aiohttp import web

from speakermem.integrations.web.access import Principal
from speakermem.integrations.web.client_address import client_address
from speakermem.integrations.web.guard import current_session, guard, read_form
from speakermem.integrations.web.oauth import OAuthError
from speakermem.integrations.web.sessions import (
    PRE_COOKIE,
    PRE_TTL_S,
    SESSION_COOKIE,
    Session,
    same_token,
)
from speakermem.integrations.web.state import STATE, ConsoleState, render

log = logging.getLogger(__name__)


def _client(request: web.Request) -> str:
    """The client's address, through trusted proxies only (integrations.web.client_address)."""
    return client_address(
        request.remote,
        request.headers.getall("X-Forwarded-For", []),
        request.app[STATE].trusted_proxies,
    )


def _limit(request: web.Request) -> None:
    """429 while this client has used up its failed attempts (checked before any token is,
    so a blocked client learns nothing)."""
    if not request.app[STATE].limiter.allow(_client(request)):
        raise web.HTTPTooManyRequests(
            text="Too many failed sign-in attempts from this address; wait a minute and try again.",
            headers={"Retry-After": "60"},
        )


def _failed(request: web.Request) -> str:
    """Count a failed attempt against the client; its address, for the log."""
    client = _client(request)
    request.app[STATE].limiter.failed(client)
    return client


def _safe_next(value: str | None) -> str:
    """Only a path on this console (never another site) after signing in."""
    if not value or not value.startswith("/") or value.startswith("//"):
        return "/"
    parsed = urlparse(value)
    return "/" if parsed.scheme or parsed.netloc else value


def _signed_in(request: web.Request, session: Session, next_path: str) -> web.HTTPSeeOther:
    state = request.app[STATE]
    resp = web.HTTPSeeOther(_safe_next(next_path))
    resp.set_cookie(
        SESSION_COOKIE,
        state.sessions.cookie(session),
        max_age=int(state.sessions.ttl_s),
        httponly=True,
        samesite="Lax",
        secure=state.secure_cookies,
        path="/",
    )
    resp.del_cookie(PRE_COOKIE, path="/")
    return resp


def _pre_nonce(request: web.Request, state: ConsoleState) -> tuple[str, str | None]:
    """The visitor's nonce, and the cookie value to set when a new one was made."""
    cookie = request.cookies.get(PRE_COOKIE)
    nonce = state.sessions.pre_nonce(cookie)
    if nonce is not None:
        return nonce, None
    fresh = state.sessions.new_pre()
    made = state.sessions.pre_nonce(fresh)
    assert made is not None
    return made, fresh


def _set_pre(resp: web.StreamResponse, state: ConsoleState, value: str | None) -> None:
    if value is not None:
        resp.set_cookie(
            PRE_COOKIE,
            value,
            max_age=int(PRE_TTL_S),
            httponly=True,
            samesite="Lax",
            secure=state.secure_cookies,
            path="/",
        )


async def login_page(request: web.Request) -> web.StreamResponse:
    """GET /login: the sign-in choices; `?token=` signs the operator in (the printed link)."""
    state = request.app[STATE]
    next_path = _safe_next(request.query.get("next"))
    token = request.query.get("token")
    if token is not None:
        _limit(request)
        if same_token(token, state.admin_token.get_secret_value()):
            session = state.sessions.create(
                Principal(name="operator", operator=True), provider=None
            )
            log.info("console: the operator signed in with the login link")
            raise _signed_in(request, session, next_path)
        log.warning("console: a login link with a wrong token from %s", _failed(request))
        return await _login_form(
            request, next_path, error="That login link is not valid.", status=403
        )
    if await current_session(request, state) is not None:
        raise web.HTTPSeeOther(next_path)
    return await _login_form(request, next_path)


async def _login_form(
    request: web.Request, next_path: str, *, error: str | None = None, status: int = 200
) -> web.StreamResponse:
    state = request.app[STATE]
    nonce, fresh = _pre_nonce(request, state)
    resp = render(
        request,
        "login.html",
        {
            "viewer": None,
            "csrf": state.sessions.pre_csrf(nonce),
            "next": next_path,
            "error": error,
            "providers": [(p.name, p.label) for p in state.providers.values()],
        },
        status=status,
    )
    _set_pre(resp, state, fresh)
    return resp


async def login_post(request: web.Request) -> web.StreamResponse:
    """POST /login: the operator pastes the token."""
    state = request.app[STATE]
    _limit(request)
    form = await read_form(request)
    next_path = _safe_next(str(form.get("next") or "/"))
    nonce = state.sessions.pre_nonce(request.cookies.get(PRE_COOKIE))
    csrf = form.get("csrf")
    if nonce is None or not same_token(
        csrf if isinstance(csrf, str) else None, state.sessions.pre_csrf(nonce)
    ):
        return await _login_form(
            request, next_path, error="The form was stale; try again.", status=403
        )
    token = form.get("token")
    if isinstance(token, str) and same_token(token.strip(), state.admin_token.get_secret_value()):
        session = state.sessions.create(Principal(name="operator", operator=True), provider=None)
        log.info("console: the operator signed in with the token")
        raise _signed_in(request, session, next_path)
    log.warning("console: a wrong operator token from %s", _failed(request))
    return await _login_form(request, next_path, error="That token is not valid.", status=403)


async def logout(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    state = request.app[STATE]
    state.sessions.drop(viewer.session)
    resp = web.HTTPSeeOther("/login")
    resp.del_cookie(SESSION_COOKIE, path="/")
    raise resp


def _redirect_uri(state: ConsoleState, provider: str) -> str:
    return f"{state.public_url}/auth/{provider}/callback"


async def oauth_start(request: web.Request) -> web.StreamResponse:
    """GET /auth/{provider}: off to the platform's consent page."""
    state = request.app[STATE]
    name = request.match_info["provider"]
    provider = state.providers.get(name)
    if provider is None:
        raise web.HTTPNotFound(text="That sign-in is not configured here.")
    nonce, fresh = _pre_nonce(request, state)
    url = provider.authorize(
        state=state.sessions.oauth_state(nonce, name),
        nonce=state.sessions.oidc_nonce(nonce, name),
        redirect_uri=_redirect_uri(state, name),
    )
    resp = web.HTTPFound(url)
    _set_pre(resp, state, fresh)
    raise resp


async def oauth_callback(request: web.Request) -> web.StreamResponse:
    """GET /auth/{provider}/callback: the platform sends the user back with a code."""
    state = request.app[STATE]
    name = request.match_info["provider"]
    provider = state.providers.get(name)
    if provider is None:
        raise web.HTTPNotFound(text="That sign-in is not configured here.")
    _limit(request)
    nonce = state.sessions.pre_nonce(request.cookies.get(PRE_COOKIE))
    given = request.query.get("state")
    if nonce is None or not same_token(given, state.sessions.oauth_state(nonce, name)):
        _failed(request)
        return await _login_form(
            request,
            "/",
            error="That sign-in did not start here, or took too long; try again.",
            status=403,
        )
    if request.query.get("error"):
        return await _login_form(
            request, "/", error=f"{provider.label} was cancelled or refused.", status=403
        )
    code = request.query.get("code")
    if not code:
        return await _login_form(request, "/", error="The platform sent no code.", status=400)
    try:
        signed = await provider.sign_in(
            state.client(),
            code=code,
            redirect_uri=_redirect_uri(state, name),
            nonce=state.sessions.oidc_nonce(nonce, name),
            known=set(await state.reads.workspaces()),
        )
    except OAuthError as exc:
        log.warning("console: %s sign-in failed from %s: %s", name, _failed(request), exc)
        return await _login_form(request, "/", error=f"Sign-in failed: {exc}.", status=403)
    except Exception as exc:
        log.warning("console: %s sign-in failed (%s)", name, type(exc).__name__)
        return await _login_form(
            request, "/", error=f"Could not reach {name} to finish signing in.", status=502
        )
    if not signed.principal.memberships:
        # an account in no guild or workspace this bot serves has nothing to see here
        log.warning(
            "console: %s user %s is in no known workspace; refused (from %s)",
            name,
            signed.principal.user_id,
            _failed(request),
        )
        return await _login_form(
            request,
            "/",
            error="That account is in no workspace or server this bot serves.",
            status=403,
        )
    session = state.sessions.create(signed.principal, provider=name, token=signed.token)
    log.info(
        "console: %s user %s signed in (%s)", name, signed.principal.user_id, signed.principal.role
    )
    raise _signed_in(request, session, "/")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login_post)
    app.router.add_post("/logout", logout)
    app.router.add_get("/auth/{provider}", oauth_start)
    app.router.add_get("/auth/{provider}/callback", oauth_callback)
