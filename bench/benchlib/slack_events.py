"""Deterministic Slack `message` events, as the Events API delivers them."""

from __future__ import annotations

from typing import Any

BASE_TS = 1_709_283_600
"""The first event's time (2024-03-01 09:00 UTC)."""
WORDS = (
    "deploy review budget friday cello hiking launch bug ticket coffee design meeting sprint "
    "release lunch paris tokyo garden piano marathon puppy recipe server database backup "
    "holiday invoice client demo slides draft weekend football concert museum train flight"
).split()
"""Everyday topic words: the event texts are made of them."""


def event_bodies(n: int, channels: int, team: str) -> list[dict[str, Any]]:
    """Deterministic message events, interleaved over channels like live traffic."""
    out = []
    for i in range(n):
        channel = f"C{(i % channels):04d}"
        user = f"U{(i * 7) % (channels * 5):04d}"
        words = [WORDS[(i * 31 + k * 17) % len(WORDS)] for k in range(4 + i % 12)]
        out.append(
            {
                "type": "event_callback",
                "team_id": team,
                "api_app_id": "A0BENCH",
                "event_id": f"Ev{i:08d}",
                "event_time": BASE_TS + i,
                "event": {
                    "type": "message",
                    "channel": channel,
                    "user": user,
                    "text": f"message {i}: " + " ".join(words),
                    "ts": f"{BASE_TS + i}.{i:06d}",
                    "channel_type": "channel",
                },
            }
        )
    return out


async def post_event(http: Any, url: str, body: bytes, headers: dict[str, str]) -> str:
    """POST one signed event with an aiohttp session: the HTTP status as text, or the name of
    the client error that stopped it."""
    import aiohttp

    try:
        async with http.post(url, data=body, headers=headers) as resp:
            await resp.read()
            return str(resp.status)
    except aiohttp.ClientError as exc:
        return type(exc).__name__
