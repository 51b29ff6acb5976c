"""Local stand-ins for the platforms' sign-in: Discord OAuth2 and Sign in with Slack (OpenID
Connect), so the console's sign-in runs end to end without the internet.

`DiscordOAuthStandIn` serves the consent page (``/oauth2/authorize``: it consents at once as
`next_user` and redirects back with a code, or with ``error=access_denied`` when nobody is
set) and the REST calls a sign-in makes (``/api/v10/oauth2/token`` with the app's HTTP Basic
credentials, ``/api/v10/users/@me`` and ``/api/v10/users/@me/guilds`` with the user's bearer
token). `revoke(user)` makes that user's tokens answer 401.

`SlackSignInStandIn` is the Web API stand-in (`tests.standins.slack_api`) plus
``/openid/connect/authorize`` and the methods ``openid.connect.token`` (an ID token with
``aud``, ``nonce`` and the team claim; unsigned, as the console reads it over the back
channel) and ``openid.connect.userInfo``; users.info answers from `users` as before. Every
call's ``Authorization`` header is kept in its args as ``_authorization``.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from tests.standins.slack_api import SlackApiStandIn


def _redirect(uri: str, **params: str) -> web.HTTPFound:
    sep = "&" if "?" in uri else "?"
    return web.HTTPFound(uri + sep + urlencode(params))


class DiscordOAuthStandIn:
    def __init__(self, *, client_id: str, client_secret: str) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.users: dict[str, dict[str, Any]] = {}
        """user id -> the /users/@me object."""
        self.guilds: dict[str, list[dict[str, Any]]] = {}
        """user id -> the /users/@me/guilds list (id, name, owner, permissions)."""
        self.next_user: str | None = None
        """Who consents on the next authorize call (None: the user cancels)."""
        self.authorize_calls: list[dict[str, str]] = []
        self.calls: list[str] = []
        self._codes: dict[str, tuple[str, str]] = {}
        self._tokens: dict[str, str] = {}
        self._n = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def add_user(self, user_id: str, username: str, guilds: list[dict[str, Any]]) -> None:
        self.users[user_id] = {"id": user_id, "username": username, "global_name": username}
        self.guilds[user_id] = guilds

    def revoke(self, user_id: str) -> None:
        for token, uid in list(self._tokens.items()):
            if uid == user_id:
                del self._tokens[token]

    @property
    def authorize_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/oauth2/authorize"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    async def start(self) -> DiscordOAuthStandIn:
        app = web.Application()
        app.router.add_get("/oauth2/authorize", self._authorize)
        app.router.add_post("/api/v10/oauth2/token", self._token)
        app.router.add_get("/api/v10/users/@me", self._me)
        app.router.add_get("/api/v10/users/@me/guilds", self._my_guilds)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _authorize(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.authorize_calls.append(q)
        if q.get("client_id") != self.client_id or q.get("response_type") != "code":
            raise web.HTTPBadRequest(text="unknown application")
        if self.next_user is None:
            raise _redirect(q["redirect_uri"], error="access_denied", state=q.get("state", ""))
        code = f"dcode{next(self._n)}"
        self._codes[code] = (self.next_user, q["redirect_uri"])
        raise _redirect(q["redirect_uri"], code=code, state=q.get("state", ""))

    async def _token(self, request: web.Request) -> web.Response:
        self.calls.append("token")
        expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.json_response({"error": "invalid_client"}, status=401)
        form = await request.post()
        code = str(form.get("code"))
        found = self._codes.pop(code, None)
        if (
            found is None
            or form.get("grant_type") != "authorization_code"
            or form.get("redirect_uri") != found[1]
        ):
            return web.json_response({"error": "invalid_grant"}, status=400)
        token = f"discord-user-token-{next(self._n)}"
        self._tokens[token] = found[0]
        return web.json_response(
            {
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": 604800,
                "refresh_token": "r",
                "scope": "identify guilds",
            }
        )

    def _user(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        user = self._tokens.get(auth.removeprefix("Bearer "))
        if not auth.startswith("Bearer ") or user is None:
            raise web.HTTPUnauthorized(
                text=json.dumps({"message": "401: Unauthorized", "code": 0}),
                content_type="application/json",
            )
        return user

    async def _me(self, request: web.Request) -> web.Response:
        self.calls.append("users/@me")
        return web.json_response(self.users[self._user(request)])

    async def _my_guilds(self, request: web.Request) -> web.Response:
        self.calls.append("users/@me/guilds")
        return web.json_response(self.guilds.get(self._user(request), []))


def unsigned_jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


class SlackSignInStandIn(SlackApiStandIn):
    def __init__(self, *, client_id: str, client_secret: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client_id = client_id
        self.client_secret = client_secret
        self.next_user: str | None = None
        self.authorize_calls: list[dict[str, str]] = []
        self._codes: dict[str, tuple[str, str, str]] = {}
        """code -> (user id, redirect uri, nonce)."""
        self._user_tokens: dict[str, str] = {}
        self._n = itertools.count(1)
        self.id_token_nonce: str | None = None
        """When set, the ID token carries this nonce instead of the one asked for."""

    @property
    def authorize_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/openid/connect/authorize"

    async def start(self) -> SlackSignInStandIn:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/openid/connect/authorize", self._authorize)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args = await super()._args(request)
        args["_authorization"] = request.headers.get("Authorization")
        return args

    async def _authorize(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.authorize_calls.append(q)
        if q.get("client_id") != self.client_id or "openid" not in q.get("scope", "").split():
            raise web.HTTPBadRequest(text="unknown application")
        if self.next_user is None:
            raise _redirect(q["redirect_uri"], error="access_denied", state=q.get("state", ""))
        code = f"scode{next(self._n)}"
        self._codes[code] = (self.next_user, q["redirect_uri"], q.get("nonce", ""))
        raise _redirect(q["redirect_uri"], code=code, state=q.get("state", ""))

    def _m_openid_connect_token(self, args: dict[str, Any]) -> dict[str, Any]:
        if (
            args.get("client_id") != self.client_id
            or args.get("client_secret") != self.client_secret
        ):
            return {"ok": False, "error": "invalid_client_id"}
        found = self._codes.pop(str(args.get("code")), None)
        if found is None or args.get("redirect_uri") != found[1]:
            return {"ok": False, "error": "invalid_code"}
        user, _, nonce = found
        token = f"xoxp-user-token-{next(self._n)}"
        self._user_tokens[token] = user
        claims = {
            "iss": "https://slack.com",
            "sub": user,
            "aud": self.client_id,
            "nonce": self.id_token_nonce or nonce,
            "https://slack.com/user_id": user,
            "https://slack.com/team_id": self.team_id,
        }
        return {
            "ok": True,
            "access_token": token,
            "token_type": "Bearer",
            "id_token": unsigned_jwt(claims),
        }

    def _m_openid_connect_userInfo(self, args: dict[str, Any]) -> dict[str, Any]:
        auth = str(args.get("_authorization") or "")
        user = self._user_tokens.get(auth.removeprefix("Bearer "))
        if user is None:
            return {"ok": False, "error": "invalid_auth"}
        name = self.users.get(user, {}).get("real_name") or user
        return {
            "ok": True,
            "sub": user,
            "https://slack.com/user_id": user,
            "https://slack.com/team_id": self.team_id,
            "name": name,
        }
