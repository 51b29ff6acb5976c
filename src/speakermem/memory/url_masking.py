"""Credentials inside URLs, masked for output.

Settings such as SPEAKERMEM_LLM_BASE_URL or SPEAKERMEM_DB_URL are plain URLs, yet an
operator may put a secret in them: `https://user:pass@host/`, `?api-key=...`,
`postgresql://u@h/db?password=...`. Everything that prints such a URL (`speakermem config`,
`doctor`, the LLM probe's log, the store's log lines and errors, /healthz) passes it through
`mask_url`, the one rule. It is pure text work, so it also masks a URL no parser accepts:
the user info runs to the LAST `@` of the authority (a raw `@` in a password is hidden
whole, as is every host of a multi-host URL's credentials), and every query parameter whose
name says secret has its value replaced.
"""

from __future__ import annotations

import re

MASK = "***"

SECRET_PARAM = re.compile(
    r"(?i)(pass|pwd|secret|token|key|sig|auth|credential|session|code)",
)
"""A query parameter whose name contains one of these words carries a secret
(`password`, `api-key`, `api_key`, `access_token`, `sig`, `client_secret`, `authorization`)."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)(.*)$", re.DOTALL)


def _mask_userinfo(authority_and_rest: str) -> str:
    """`user:pass@host/...` -> `user:***@host/...`; the authority ends at the first `/`, `?`
    or `#` after the last `@` that precedes the query."""
    head, sep, query = authority_and_rest.partition("?")
    at = head.rfind("@")
    if at < 0:
        return authority_and_rest
    userinfo, rest = head[:at], head[at:]
    user, colon, _password = userinfo.partition(":")
    if colon:
        userinfo = f"{user}:{MASK}"
    elif "/" in userinfo:  # the `@` sits in a path: there was no user info
        return authority_and_rest
    return f"{userinfo}{rest}{sep}{query}"


def _mask_query(text: str) -> str:
    head, sep, query = text.partition("?")
    if not sep:
        return text
    query, hash_sep, fragment = query.partition("#")
    parts = []
    for item in query.split("&"):
        name, eq, value = item.partition("=")
        if eq and value and SECRET_PARAM.search(name):
            item = f"{name}={MASK}"
        parts.append(item)
    return f"{head}?{'&'.join(parts)}{hash_sep}{fragment}"


def mask_url(url: str) -> str:
    """`url` with any password in its user info and every secret query value as `***`.
    Text that is not a URL comes back with only its `?name=value` secrets masked."""
    match = _SCHEME.match(url.strip())
    if match is None:
        return _mask_query(url)
    scheme, rest = match.groups()
    return scheme + _mask_query(_mask_userinfo(rest))


def mask_optional_url(url: str | None) -> str | None:
    """`mask_url` for a setting that may be unset."""
    return None if url is None else mask_url(url)
