"""Slack's request signature, checked on the raw bytes (the pure half of the HTTP endpoint)."""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter

import aiohttp
import pytest
from slack_bolt.app.async_app import AsyncApp

from speakermem.integrations.slack.http_endpoint import MAX_SKEW_S, SlackHttpEndpoint, signature_ok

SECRET = b"8f742231b10e8888abcd99yyyzzz85a5"
BODY = b'{"type":"event_callback","event":{"type":"message","text":"caf\xc3\xa9"}}'
NOW = 1_700_000_000.0


def signed(body: bytes, stamp: float, secret: bytes = SECRET) -> dict[str, str]:
    base = b"v0:" + str(int(stamp)).encode() + b":" + body
    digest = hmac.new(secret, base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(int(stamp)), "X-Slack-Signature": f"v0={digest}"}


def test_a_signed_body_passes_within_the_replay_window() -> None:
    assert signature_ok(SECRET, BODY, signed(BODY, NOW), now=NOW)
    assert signature_ok(SECRET, BODY, signed(BODY, NOW - MAX_SKEW_S), now=NOW)


def test_a_stale_or_future_stamp_fails() -> None:
    assert not signature_ok(SECRET, BODY, signed(BODY, NOW - MAX_SKEW_S - 1), now=NOW)
    assert not signature_ok(SECRET, BODY, signed(BODY, NOW + MAX_SKEW_S + 1), now=NOW)


def test_another_secret_another_body_or_odd_headers_fail() -> None:
    assert not signature_ok(SECRET, BODY, signed(BODY, NOW, secret=b"other"), now=NOW)
    assert not signature_ok(SECRET, BODY + b" ", signed(BODY, NOW), now=NOW)
    assert not signature_ok(SECRET, BODY, {}, now=NOW)
    forged = {**signed(BODY, NOW), "X-Slack-Signature": "v0=\u00e9"}  # not ASCII: no crash
    assert not signature_ok(SECRET, BODY, forged, now=NOW)
    assert not signature_ok(SECRET, BODY, {**signed(BODY, NOW), "X-Slack-Request-Timestamp": "x"})


@pytest.mark.parametrize("stamp", ["\u00b2", "1" * 4301, "\u0661\u0667\u0660\u0660", " 17", "-5"])
async def test_an_odd_timestamp_is_a_counted_401_not_a_crash(
    stamp: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`²` is a digit to str.isdigit and int() refuses more than 4,300 digits: both raised
    inside the handler (a 500 and a traceback) instead of rejecting the request."""
    stats: Counter[str] = Counter()
    endpoint = SlackHttpEndpoint(AsyncApp(token="xoxb-x", signing_secret="s"), SECRET, stats)
    port = await endpoint.serve("127.0.0.1", 0, "/slack/events")
    try:
        headers = {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": "v0=00"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{port}/slack/events", data=BODY, headers=headers) as r,
        ):
            assert r.status == 401
    finally:
        await endpoint.close()
    assert stats["bad_signature"] == 1
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]
