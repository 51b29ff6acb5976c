"""Slack's request signature, checked on the raw bytes (the pure half of the HTTP endpoint)."""

from __future__ import annotations

import hashlib
import hmac

from integrations.slack.http_endpoint import MAX_SKEW_S, signature_ok

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
