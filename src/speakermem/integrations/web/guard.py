"""`guard`: the one check every console route (pages and API) calls before reading anything.

It finds the session, re-confirms a platform user's workspaces and admin rights when the
last check is older than `ConsoleState.recheck_s`, decides what they may see now
(`integrations.web.access`), checks the CSRF token of every POST, and refuses:
401 / a redirect to the sign-in page when nobody is signed in, 404 for a channel or
workspace the viewer cannot see (the same answer as for one that does not exist), 403 for an
admin action by someone who is not admin there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web
from multidict import MultiDict, MultiDictProxy

from speakermem.integrations.web.access import Visibility, visibility
from speakermem.integrations.web.sessions import SESSION_COOKIE, Session, same_token
from speakermem.integrations.web.state import NOT_FOUND, STATE, ConsoleState
from speakermem.memory.models import Scope

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Viewer:
    """A signed-in request that passed the guard."""

    session: Session
    can: Visibility
    form: MultiDictProxy[Any]

    @property
    def csrf(self) -> str:
        return self.session.csrf

    def actor(self) -> str:
        """How the audit log names this person."""
        who = self.session.principal
        if who.operator:
            return "web:operator"
        return f"web:{who.platform}:{who.user_id}"

    def user_in(self, platform: str, workspace: str) -> str | None:
        """The viewer's own user id in a workspace (None: the operator, or not a member)."""
        m = self.session.principal.membership(platform, workspace)
        return None if m is None else m.user_id


def page(viewer: Viewer, **extra: Any) -> dict[str, Any]:
    """The context every signed-in page's template gets, plus the page's own."""
    return {"viewer": viewer, "csrf": viewer.csrf, "can": viewer.can, **extra}


def scope_of(request: web.Request) -> Scope:
    """The channel a /c/{platform}/{workspace}/{channel} path names (404 if malformed)."""
    try:
        return Scope(
            platform=request.match_info["platform"],
            workspace=request.match_info["workspace"],
            channel=request.match_info["channel"],
        )
    except (KeyError, ValueError):
        raise not_found() from None


def wants_html(request: web.Request) -> bool:
    path = request.path
    return request.method == "GET" and not path.startswith("/api/") and not path.endswith(".json")


def not_found() -> web.HTTPNotFound:
    return web.HTTPNotFound(text=NOT_FOUND)


async def read_form(request: web.Request) -> MultiDictProxy[Any]:
    """The POST body's fields; 400 for a body that does not parse (a broken multipart
    boundary, bytes that are not the declared charset), not an exception in the handler."""
    try:
        return await request.post()
    except web.HTTPException:
        raise
    except (ValueError, LookupError, AssertionError, TypeError) as exc:
        log.info("console: unparsable form body refused (%s)", type(exc).__name__)
        raise web.HTTPBadRequest(text="The form could not be read; reload the page.") from None


async def current_session(request: web.Request, state: ConsoleState) -> Session | None:
    """The request's live session, re-checked with its platform when due (None: signed out)."""
    session = state.sessions.find(request.cookies.get(SESSION_COOKIE))
    if session is None or session.provider is None:
        return session
    if time.time() - session.checked < state.recheck_s:
        return session
    provider = state.providers.get(session.provider)
    principal = None
    if provider is not None:
        try:
            known = set(await state.reads.workspaces())
            principal = await provider.recheck(state.client(), session, known)
        except Exception as exc:  # a re-check that fails is no confirmation (fail closed)
            log.warning("console: re-checking a %s sign-in failed (%s)", session.provider, exc)
    if principal is None or not principal.memberships:  # left every known workspace
        state.sessions.drop(session)
        return None
    session.principal = principal
    session.checked = time.time()
    return session


async def guard(
    request: web.Request,
    *,
    scope: Scope | None = None,
    workspace: tuple[str, str] | None = None,
    admin: bool = False,
) -> Viewer:
    """Let the request through for a signed-in viewer who may see `scope` / `workspace`
    (and administers it, with `admin`); raise the refusal otherwise."""
    state = request.app[STATE]
    session = await current_session(request, state)
    if session is None:
        if wants_html(request):
            raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
        raise web.HTTPUnauthorized(text="Sign in first.")
    form: MultiDictProxy[Any] = MultiDictProxy(MultiDict(request.query))
    if request.method == "POST":
        form = await read_form(request)
        if not same_token(_text(form.get("csrf")), session.csrf):
            raise web.HTTPForbidden(text="The form was stale or not from this console; reload it.")
    can = await visibility(state.reads, state.governance, session.principal)
    if scope is not None and not can.can_read(scope):
        raise not_found()
    if workspace is not None and not can.sees_workspace(*workspace):
        raise not_found()
    if admin:
        target = workspace or (None if scope is None else (scope.platform, scope.workspace))
        allowed = can.is_admin(*target) if target is not None else can.any_admin
        if not allowed:
            raise web.HTTPForbidden(text="Only an admin of this workspace may do that.")
    return Viewer(session=session, can=can, form=form)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
