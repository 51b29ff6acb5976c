"""Sign-in with the platforms: Discord OAuth2 (`identify guilds`) and Sign in with Slack
(OpenID Connect), and the periodic re-check of what they said.

Each provider turns an authorization code into a `Principal`: the user and, per workspace
the store knows, whether they administer it (Discord: owner, Administrator or Manage
Server, from `/users/@me/guilds`; Slack: admin, owner or primary owner from `users.info`
with the bot's token, or named in SPEAKERMEM_SLACK_ADMIN_USERS). The platforms' base URLs
come from the settings, so tests run against local stand-ins. Tokens are never logged.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp
from pydantic import SecretStr

from speakermem.integrations.discord.translate import ADMINISTRATOR, MANAGE_GUILD
from speakermem.integrations.web.access import Membership, Principal, Workspace
from speakermem.integrations.web.sessions import Session

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 10.0


class OAuthError(Exception):
    """A sign-in the platform did not confirm; the message is safe to show."""


@dataclass(frozen=True)
class SignIn:
    principal: Principal
    token: SecretStr | None


class Provider(Protocol):
    name: str
    label: str

    def authorize(self, *, state: str, nonce: str, redirect_uri: str) -> str: ...

    async def sign_in(
        self,
        http: aiohttp.ClientSession,
        *,
        code: str,
        redirect_uri: str,
        nonce: str,
        known: Collection[Workspace],
    ) -> SignIn: ...

    async def recheck(
        self, http: aiohttp.ClientSession, session: Session, known: Collection[Workspace]
    ) -> Principal | None: ...


async def _json(resp: aiohttp.ClientResponse, what: str) -> Any:
    if resp.status >= 400:
        raise OAuthError(f"{what} failed (HTTP {resp.status})")
    try:
        return await resp.json(content_type=None)
    except (ValueError, aiohttp.ContentTypeError) as exc:
        raise OAuthError(f"{what} answered something that is not JSON") from exc


# ---- Discord ----------------------------------------------------------------------------


def discord_memberships(
    user_id: str, guilds: Any, known: Collection[Workspace]
) -> tuple[Membership, ...]:
    """The guilds of `/users/@me/guilds` that the store knows, admin where the user owns the
    guild or holds Administrator or Manage Server there (pure; malformed entries are skipped)."""
    if not isinstance(guilds, list):
        raise OAuthError("Discord's guild list was not a list")
    out = []
    for g in guilds:
        if not isinstance(g, Mapping) or not isinstance(g.get("id"), str):
            continue
        if ("discord", g["id"]) not in known:
            continue
        try:
            perms = int(g.get("permissions") or 0)
        except (TypeError, ValueError):
            perms = 0
        admin = g.get("owner") is True or bool(perms & (ADMINISTRATOR | MANAGE_GUILD))
        out.append(Membership("discord", g["id"], user_id, admin=admin))
    return tuple(sorted(out, key=lambda m: m.workspace))


class DiscordOAuth:
    name = "discord"
    label = "Sign in with Discord"

    def __init__(
        self, *, client_id: str, client_secret: SecretStr, authorize_url: str, api_url: str
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.authorize_url = authorize_url
        self.api_url = api_url.rstrip("/")

    def authorize(self, *, state: str, nonce: str, redirect_uri: str) -> str:
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "scope": "identify guilds",
                "state": state,
                "redirect_uri": redirect_uri,
                "prompt": "none",
            }
        )
        return f"{self.authorize_url}?{query}"

    async def sign_in(
        self,
        http: aiohttp.ClientSession,
        *,
        code: str,
        redirect_uri: str,
        nonce: str,
        known: Collection[Workspace],
    ) -> SignIn:
        pair = f"{self.client_id}:{self.client_secret.get_secret_value()}".encode()
        headers = {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
        async with http.post(f"{self.api_url}/oauth2/token", data=form, headers=headers) as resp:
            grant = await _json(resp, "Discord's token exchange")
        token = grant.get("access_token") if isinstance(grant, Mapping) else None
        if not isinstance(token, str) or not token:
            raise OAuthError("Discord gave no access token")
        secret = SecretStr(token)
        user = await self._get(http, secret, "/users/@me", "Discord's user lookup")
        if not isinstance(user, Mapping) or not isinstance(user.get("id"), str):
            raise OAuthError("Discord did not say who signed in")
        guilds = await self._get(http, secret, "/users/@me/guilds", "Discord's guild list")
        name = str(user.get("global_name") or user.get("username") or user["id"])
        principal = Principal(
            name=name,
            platform="discord",
            user_id=user["id"],
            memberships=discord_memberships(user["id"], guilds, known),
        )
        return SignIn(principal=principal, token=secret)

    async def recheck(
        self, http: aiohttp.ClientSession, session: Session, known: Collection[Workspace]
    ) -> Principal | None:
        """The user's guilds and rights now; None when Discord no longer honours the token."""
        who = session.principal
        if session.token is None or who.user_id is None:
            return None
        try:
            guilds = await self._get(http, session.token, "/users/@me/guilds", "guild re-check")
        except (OAuthError, aiohttp.ClientError):
            return None
        return Principal(
            name=who.name,
            platform="discord",
            user_id=who.user_id,
            memberships=discord_memberships(who.user_id, guilds, known),
        )

    async def _get(
        self, http: aiohttp.ClientSession, token: SecretStr, path: str, what: str
    ) -> Any:
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
        async with http.get(f"{self.api_url}{path}", headers=headers) as resp:
            return await _json(resp, what)


# ---- Slack ------------------------------------------------------------------------------


def id_token_claims(id_token: str) -> dict[str, Any]:
    """The claims of an ID token received straight from the token endpoint over TLS (OpenID
    Connect Core 3.1.3.7 lets TLS stand in for the signature there); malformed is an error."""
    try:
        payload = id_token.split(".")[1]
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error) as exc:
        raise OAuthError("Slack's ID token could not be read") from exc
    if not isinstance(data, dict):
        raise OAuthError("Slack's ID token could not be read")
    return data


def slack_is_admin(user: Any, team: str) -> bool:
    """Admin, owner or primary owner of `team` per a users.info `user` (guests from another
    workspace are no admin here; anything unreadable is no)."""
    if not isinstance(user, Mapping) or user.get("deleted") is True:
        return False
    if user.get("team_id") not in (None, team):
        return False
    return any(user.get(k) is True for k in ("is_admin", "is_owner", "is_primary_owner"))


class SlackOIDC:
    name = "slack"
    label = "Sign in with Slack"

    def __init__(
        self,
        *,
        client_id: str,
        client_secret: SecretStr,
        authorize_url: str,
        api_url: str,
        bot_token: SecretStr | None,
        admin_ids: frozenset[str],
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.authorize_url = authorize_url
        self.api_url = api_url if api_url.endswith("/") else api_url + "/"
        self.bot_token = bot_token
        self.admin_ids = admin_ids

    def authorize(self, *, state: str, nonce: str, redirect_uri: str) -> str:
        query = urlencode(
            {
                "response_type": "code",
                "scope": "openid profile",
                "client_id": self.client_id,
                "state": state,
                "nonce": nonce,
                "redirect_uri": redirect_uri,
            }
        )
        return f"{self.authorize_url}?{query}"

    async def sign_in(
        self,
        http: aiohttp.ClientSession,
        *,
        code: str,
        redirect_uri: str,
        nonce: str,
        known: Collection[Workspace],
    ) -> SignIn:
        form = {
            "client_id": self.client_id,
            "client_secret": self.client_secret.get_secret_value(),
            "code": code,
            "redirect_uri": redirect_uri,
            "grant_type": "authorization_code",
        }
        async with http.post(f"{self.api_url}openid.connect.token", data=form) as resp:
            grant = await _json(resp, "Slack's token exchange")
        if not isinstance(grant, Mapping) or grant.get("ok") is not True:
            raise OAuthError("Slack did not confirm the sign-in")
        token, id_token = grant.get("access_token"), grant.get("id_token")
        if not isinstance(token, str) or not isinstance(id_token, str):
            raise OAuthError("Slack gave no access or ID token")
        claims = id_token_claims(id_token)
        if claims.get("aud") != self.client_id or claims.get("nonce") != nonce:
            raise OAuthError("Slack's ID token was not issued for this sign-in")
        headers = {"Authorization": f"Bearer {token}"}
        async with http.post(f"{self.api_url}openid.connect.userInfo", headers=headers) as resp:
            info = await _json(resp, "Slack's user lookup")
        if not isinstance(info, Mapping) or info.get("ok") is not True:
            raise OAuthError("Slack did not say who signed in")
        user_id = info.get("https://slack.com/user_id")
        team = info.get("https://slack.com/team_id")
        if not isinstance(user_id, str) or not isinstance(team, str):
            raise OAuthError("Slack did not say who signed in")
        if claims.get("https://slack.com/team_id", team) != team:
            raise OAuthError("Slack's ID token names another workspace")
        admin = await self._is_admin(http, team, user_id)
        if admin is None:
            raise OAuthError("Slack says this account is deactivated")
        name = str(info.get("name") or info.get("given_name") or user_id)
        memberships = (
            (Membership("slack", team, user_id, admin=admin),) if ("slack", team) in known else ()
        )
        principal = Principal(name=name, platform="slack", user_id=user_id, memberships=memberships)
        return SignIn(principal=principal, token=None)

    async def recheck(
        self, http: aiohttp.ClientSession, session: Session, known: Collection[Workspace]
    ) -> Principal | None:
        """Admin rights now, from users.info; None when the account is gone."""
        out = []
        for m in session.principal.memberships:
            admin = await self._is_admin(http, m.workspace, m.user_id)
            if admin is None:
                return None
            out.append(Membership(m.platform, m.workspace, m.user_id, admin=admin))
        who = session.principal
        return Principal(
            name=who.name, platform=who.platform, user_id=who.user_id, memberships=tuple(out)
        )

    async def _is_admin(self, http: aiohttp.ClientSession, team: str, user_id: str) -> bool | None:
        """True/False per users.info (or the admin list); None: Slack says the user is
        deactivated. Without a bot token, or when Slack cannot be asked, only the list counts."""
        if user_id in self.admin_ids:
            return True
        if self.bot_token is None or not self.bot_token.get_secret_value():
            return False
        headers = {"Authorization": f"Bearer {self.bot_token.get_secret_value()}"}
        try:
            async with http.get(
                f"{self.api_url}users.info", params={"user": user_id}, headers=headers
            ) as resp:
                data = await _json(resp, "users.info")
        except (OAuthError, aiohttp.ClientError) as exc:
            log.warning("slack users.info failed; treating the user as no admin (%s)", exc)
            return False
        if not isinstance(data, Mapping) or data.get("ok") is not True:
            return False
        user = data.get("user")
        if isinstance(user, Mapping) and user.get("deleted") is True:
            return None
        return slack_is_admin(user, team)
