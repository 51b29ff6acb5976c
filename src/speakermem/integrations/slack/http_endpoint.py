"""The Events API over HTTP: verify Slack's signature on the raw bytes, then hand to bolt.

The signature is checked before anything decodes the body, so a signed body that is not
UTF-8 (or that bolt cannot parse) is acked and dropped instead of crashing the request
handler; an ack is what stops Slack from redelivering it three times.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections import Counter
from collections.abc import Mapping

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from speakermem.integrations.slack.errors import brief

__all__ = ["MAX_BODY_BYTES", "MAX_SKEW_S", "SlackHttpEndpoint", "signature_ok"]

log = logging.getLogger(__name__)

MAX_SKEW_S = 60 * 5
"""Slack's replay window for signed requests."""
MAX_BODY_BYTES = 2 * 1024 * 1024
STAMP = re.compile(r"[0-9]{1,12}")
"""A request timestamp: Unix seconds in ASCII digits (twelve reach the year 33658)."""


def signature_ok(
    secret: bytes, raw: bytes, headers: Mapping[str, str], *, now: float | None = None
) -> bool:
    """Whether `raw` carries Slack's v0 signature with `secret`, stamped within the window."""
    stamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    now = time.time() if now is None else now
    # ASCII digits only, and few: int() raises on "²" (a digit to isdigit) and on more than
    # 4,300 digits, and a forged header must be a 401, not a 500
    if not STAMP.fullmatch(stamp) or abs(now - int(stamp)) > MAX_SKEW_S:
        return False
    if not signature.isascii():
        return False  # compare_digest raises on non-ASCII str; a forged header is a 401
    base = b"v0:" + stamp.encode() + b":" + raw
    expected = "v0=" + hmac.new(secret, base, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.encode())


class SlackHttpEndpoint:
    """An aiohttp server for one path, in front of a bolt app."""

    def __init__(self, app: AsyncApp, signing_secret: bytes, stats: Counter[str]) -> None:
        self.app = app
        self.signing_secret = signing_secret
        self.stats = stats
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        """The bound port (after `serve`; useful with port 0)."""

    @property
    def serving(self) -> bool:
        return self._runner is not None

    async def serve(self, host: str, port: int, path: str) -> int:
        """Listen on `host`:`port` for POSTs to `path`; returns the bound port."""
        web_app = web.Application(client_max_size=MAX_BODY_BYTES)
        web_app.router.add_post(path, self.handle)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: web.Request) -> web.Response:
        """Verify on raw bytes, drop undecodable bodies, then hand the request to bolt."""
        raw = await request.read()
        if not signature_ok(self.signing_secret, raw, request.headers):
            self.stats["bad_signature"] += 1
            log.warning("slack request with a bad or stale signature rejected")
            return web.Response(status=401)
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.stats["malformed"] += 1
            log.warning("signed slack request body is not valid UTF-8; acked and skipped")
            return web.Response(status=200)
        try:
            bolt_req = AsyncBoltRequest(
                body=body,
                query=request.query_string,
                headers=request.headers,  # type: ignore[arg-type]
            )
        except ValueError as exc:  # bolt parses JSON/form bodies eagerly
            self.stats["malformed"] += 1
            log.warning("signed slack request body unparsable; acked and skipped (%s)", brief(exc))
            return web.Response(status=200)
        resp = await self.app.async_dispatch(bolt_req)
        if resp.status == 404 and bolt_req.body.get("type") == "event_callback":
            # an event no listener matches (no "type"): ack it, or Slack redelivers it
            self.stats["malformed"] += 1
            log.warning("slack event without a usable type; acked and skipped")
            resp = BoltResponse(status=200, body="")
        return await to_aiohttp_response(resp)
