"""Console sessions: signed cookies naming a server-side session, CSRF tokens, login limits.

A session lives in this process only (a restart signs everyone out): the browser holds a
random id signed with a per-process key, never a token or a name. Platform access tokens
stay here, for the periodic re-check of the user's workspaces and admin rights.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from pydantic import SecretStr

from speakermem.bot.rate_limit import PerMinuteLimiter
from speakermem.integrations.web.access import Principal

SESSION_COOKIE = "speakermem_session"
PRE_COOKIE = "speakermem_pre"
"""A signed random nonce for a visitor not signed in: their CSRF token and OAuth state."""
MAX_SESSIONS = 10_000
"""Sessions kept at once; beyond, the least recently used platform user's goes first (never
the operator's)."""
MAX_PER_IDENTITY = 8
"""Sessions one identity (the operator, or one platform account) keeps at once; a new
sign-in beyond ends that identity's oldest, so one account cannot crowd out the rest."""
PRE_TTL_S = 3_600.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Session:
    sid: str
    principal: Principal
    provider: str | None
    """"discord", "slack", or None for the operator."""
    created: float
    checked: float
    """When the principal's workspaces and admin rights were last confirmed."""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    token: SecretStr | None = None
    """The user's platform access token, for re-checking (never sent to the browser)."""


def identity(principal: Principal, provider: str | None = None) -> tuple[str, str]:
    """Whose a session is: ("operator", "") or (platform, account id)."""
    if principal.operator:
        return ("operator", "")
    return (principal.platform or provider or "", principal.user_id or principal.name)


class Signer:
    """HMAC-SHA256 over values with a key that never leaves the process."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def mac(self, purpose: str, value: str) -> str:
        digest = hmac.new(self._key, f"{purpose}\0{value}".encode(), hashlib.sha256).digest()
        return _b64(digest)

    def sign(self, purpose: str, value: str) -> str:
        return f"{value}.{self.mac(purpose, value)}"

    def unsign(self, purpose: str, signed: str | None) -> str | None:
        """The value, or None when the signature does not match (or nothing was given)."""
        if not signed or "." not in signed:
            return None
        value, _, mac = signed.rpartition(".")
        if not hmac.compare_digest(mac, self.mac(purpose, value)):
            return None
        return value


class Sessions:
    """Signed-in sessions by id, expiring `ttl_s` after sign-in."""

    def __init__(self, signer: Signer, *, ttl_s: float, max_sessions: int = MAX_SESSIONS) -> None:
        self.signer = signer
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(
        self, principal: Principal, *, provider: str | None, token: SecretStr | None = None
    ) -> Session:
        now = time.time()
        session = Session(
            sid=secrets.token_urlsafe(32),
            principal=principal,
            provider=provider,
            created=now,
            checked=now,
            token=token,
        )
        who = identity(principal, provider)
        mine = [
            sid
            for sid, other in self._sessions.items()
            if identity(other.principal, other.provider) == who
        ]
        for sid in mine[: max(0, len(mine) - MAX_PER_IDENTITY + 1)]:  # oldest use first
            del self._sessions[sid]
        self._sessions[session.sid] = session
        if len(self._sessions) > self.max_sessions:
            for sid in [sid for sid, s in self._sessions.items() if not s.principal.operator][
                : len(self._sessions) - self.max_sessions
            ]:
                del self._sessions[sid]
        return session

    def cookie(self, session: Session) -> str:
        return self.signer.sign("session", session.sid)

    def find(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The live session a cookie names; None for a forged, unknown or expired one."""
        sid = self.signer.unsign("session", cookie)
        if sid is None:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        now = time.time() if now is None else now
        if now - session.created > self.ttl_s:
            self._sessions.pop(sid, None)
            return None
        self._sessions.move_to_end(sid)
        return session

    def drop(self, session: Session) -> None:
        self._sessions.pop(session.sid, None)

    def drop_all(self) -> None:
        self._sessions.clear()

    # ---- visitors not signed in --------------------------------------------------------

    def new_pre(self) -> str:
        """A fresh signed nonce cookie value for a visitor (timestamped, expires)."""
        return self.signer.sign("pre", f"{secrets.token_urlsafe(24)}:{int(time.time())}")

    def pre_nonce(self, cookie: str | None, *, now: float | None = None) -> str | None:
        value = self.signer.unsign("pre", cookie)
        if value is None:
            return None
        nonce, _, stamp = value.rpartition(":")
        now = time.time() if now is None else now
        if not stamp.isdigit() or now - int(stamp) > PRE_TTL_S:
            return None
        return nonce

    def pre_csrf(self, nonce: str) -> str:
        return self.signer.mac("csrf", nonce)

    def oauth_state(self, nonce: str, provider: str) -> str:
        """The OAuth `state` for this visitor and provider (checked on the way back)."""
        return self.signer.mac(f"oauth-state:{provider}", nonce)

    def oidc_nonce(self, nonce: str, provider: str) -> str:
        return self.signer.mac(f"oidc-nonce:{provider}", nonce)


def same_token(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a submitted token (None never matches)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class LoginLimiter(PerMinuteLimiter):
    """At most `per_minute` failed sign-in attempts per client address in any 60 s; a
    success costs nothing (an operator signing in often is never locked out by it)."""

    def __init__(self, per_minute: int, *, max_clients: int = 10_000) -> None:
        super().__init__(per_minute, max_keys=max_clients)

    def allow(self, client: str, *, now: float | None = None) -> bool:
        """Whether `client` may try now (fewer than `per_minute` failures in 60 s); counts
        nothing."""
        return self.would_allow(client, now=now)

    def failed(self, client: str, *, now: float | None = None) -> None:
        """Count one failed attempt of `client`."""
        super().allow(client, now=now)
