"""The Slack adapter end to end: real slack-bolt AsyncApp, signed HTTP, the Web API stand-in,
a real store and a real RecallPipeline (no LLM), wired through the Dispatcher.

`process_before_response=True` makes every handler finish before the HTTP 200, so the
assertions after a request need no polling.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.adapter import ACK_TEXT, SlackAdapter
from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.answer import RecallAnswer
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.slack_api import BOT_USER_ID, TEAM_ID, SlackApiStandIn, sign

pytestmark = pytest.mark.contract

SECRET = "adapter-signing-secret"
GENERAL = "CGENERAL"
PRIVATE = "CSECRET"
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
PERMALINK = re.compile(r"https://standin\.slack\.invalid/archives/(\w+)/p(\d+)")

USERS: dict[str, dict[str, Any]] = {
    "U1": {"name": "alice", "profile": {"display_name": "Alice"}},
    "U2": {"name": "bob", "profile": {"display_name": "Bob"}},
    "U3": {"name": "carol", "profile": {"display_name": "Carol"}},
    "U4": {"name": "dave", "profile": {"display_name": "Dave"}},
    BOT_USER_ID: {"name": "speakermem", "is_bot": True, "profile": {"display_name": "mem"}},
}


StandIn = SlackApiStandIn


def gscope(channel: str = GENERAL) -> Scope:
    return Scope(platform="slack", workspace=TEAM_ID, channel=channel)


def ts(n: int) -> str:
    return f"{1709283600 + n * 60}.{n:06d}"


def message(channel: str, user: str, text: str, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts(n),
        "channel_type": "group" if channel == PRIVATE else "channel",  # as Slack sends them
        **extra,
    }


def envelope(event: dict[str, Any], n: int = 0) -> dict[str, Any]:
    return {
        "type": "event_callback",
        "team_id": TEAM_ID,
        "api_app_id": "A0STANDIN",
        "event_id": f"Ev{n:06d}",
        "event_time": 1709283600 + n,
        "event": event,
    }


@dataclass
class Rig:
    standin: StandIn
    engine: MemoryEngine
    dispatcher: Dispatcher
    adapter: SlackAdapter
    http: aiohttp.ClientSession
    ack_s: float = 0.0
    sent: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.adapter.url

    async def post_raw(
        self, body: bytes | str, content_type: str, *, secret: str = SECRET, at: int | None = None
    ) -> tuple[int, str]:
        raw = body.encode() if isinstance(body, str) else body
        headers = {
            **sign(secret, at if at is not None else int(time.time()), raw),
            "Content-Type": content_type,
        }
        async with self.http.post(self.url, data=raw, headers=headers) as resp:
            return resp.status, await resp.text()

    async def event(self, event: dict[str, Any], n: int = 0) -> int:
        status, _ = await self.post_raw(json.dumps(envelope(event, n)), JSON)
        return status

    async def recall(
        self, user: str, channel: str, question: str, *, wait_s: float = 0.0
    ) -> tuple[int, str, dict]:
        key = f"r{len(self.standin.responses)}-{user}-{channel}"
        form = {
            "command": "/recall",
            "text": question,
            "user_id": user,
            "user_name": USERS[user]["name"],
            "channel_id": channel,
            "team_id": TEAM_ID,
            "response_url": self.standin.response_url(key),
            "trigger_id": "1.2",
        }
        status, text = await self.post_raw(urlencode(form), FORM)
        self.ack_s = time.monotonic()
        for _ in range(int(wait_s / 0.02)):
            if any(k == key for k, _ in self.standin.responses):
                break
            await asyncio.sleep(0.02)
        posted = [b for k, b in self.standin.responses if k == key]
        assert len(posted) == 1, self.standin.responses
        return status, text, posted[0]

    async def counts(self) -> dict[str, int]:
        return await self.engine.store.messages.counts()


async def _rig(
    tmp_path: Path,
    *,
    recall_scope: str = "channel",
    mode: str = "http",
    process_before_response: bool = True,
) -> tuple[Rig, Any]:
    standin = StandIn(
        users={k: dict(v) for k, v in USERS.items()},
        members={
            GENERAL: ["U1", "U2", "U3", BOT_USER_ID],
            PRIVATE: ["U1", "U3", BOT_USER_ID],
        },
        private={PRIVATE},
    )
    await standin.start()
    config = make_config(tmp_path)
    config.recall = RecallConfig(scope=recall_scope)  # type: ignore[arg-type]
    engine = await MemoryEngine.open(config, HashEmbedder())
    dispatcher = Dispatcher(engine, RecallPipeline(engine))
    settings = Settings(
        db_path=tmp_path / "unused.db",
        slack_bot_token="xoxb-test-token",  # type: ignore[arg-type]
        slack_signing_secret=SECRET,  # type: ignore[arg-type]
        slack_app_token="xapp-test-token",  # type: ignore[arg-type]
        slack_mode=mode,  # type: ignore[arg-type]
        slack_http_host="127.0.0.1",
        slack_http_port=0,
        slack_api_url=standin.base_url,
    )
    adapter = SlackAdapter(
        settings, dispatcher, engine, process_before_response=process_before_response
    )
    await adapter.start()
    http = aiohttp.ClientSession()
    rig = Rig(standin, engine, dispatcher, adapter, http)

    async def close() -> None:
        await http.close()
        await adapter.stop()
        await engine.close()
        await standin.close()

    return rig, close


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r, close = await _rig(tmp_path)
    yield r
    await close()


def links_in(blocks: list[dict]) -> list[tuple[str, str]]:
    """(channel, ts-digits) of every standin permalink anywhere in the blocks."""
    return PERMALINK.findall(json.dumps(blocks))


def section_text(blocks: list[dict]) -> str:
    return "\n".join(b["text"]["text"] for b in blocks if b["type"] == "section")


async def seed(rig: Rig) -> None:
    lines = [
        (GENERAL, "U1", "The team trip to Lisbon is booked for May 3rd", 1),
        (GENERAL, "U3", "Great, I will bring the camera to Lisbon", 2),
        (GENERAL, "U2", "Lunch today is at the noodle place", 3),
        (PRIVATE, "U1", "The launch code word for the Lisbon trip is pineapple", 4),
        (PRIVATE, "U3", "Keep the Lisbon launch code word pineapple secret", 5),
    ]
    for channel, user, text, n in lines:
        assert await rig.event(message(channel, user, text, n), n) == 200


# --- /recall -----------------------------------------------------------------------------


@pytest.mark.e2e
async def test_web_api_calls_share_one_connection(rig: Rig) -> None:
    """slack_sdk opens a session (and a connection) per call unless given one: permalink
    lookups for every cited message would each pay for a new connection."""
    before = len(rig.standin.peers)
    for n in range(3):
        await rig.adapter.client.chat_getPermalink(channel=GENERAL, message_ts=f"170000000{n}.0")
    await rig.adapter.client.users_info(user="U1")
    ports = {peer[1] for peer in rig.standin.peers[before:]}
    assert len(rig.standin.peers) - before == 4 and len(ports) == 1, ports


@pytest.mark.e2e
async def test_recall_answers_share_one_connection(rig: Rig) -> None:
    """Bolt's respond() opens a session per call: each answer would pay for a connection
    (a TLS handshake to Slack). The answers go through the adapter's session instead, on
    the connections its Web API calls opened."""
    await seed(rig)
    for _ in range(3):
        _, _, posted = await rig.recall("U1", GENERAL, "when is the trip to Lisbon?", wait_s=10)
        assert "Lisbon" in section_text(posted["blocks"])
    answered = [peer[1] for peer in rig.standin.response_peers]
    web_api = {peer[1] for peer in rig.standin.peers}  # the permalink lookups' connections
    # no answer opened a connection of its own
    assert len(answered) == 3 and set(answered) <= web_api, (answered, web_api)


@pytest.mark.e2e
async def test_recall_acks_then_answers_with_permalink_citations(rig: Rig) -> None:
    await seed(rig)
    status, ack_body, posted = await rig.recall("U1", GENERAL, "when is the trip to Lisbon?")
    assert status == 200 and ack_body == ACK_TEXT
    assert posted["response_type"] == "in_channel"
    blocks = posted["blocks"]
    assert blocks[0]["type"] == "section"
    body = section_text(blocks)
    cited = re.findall(r"<([^|>]+)\|\[(\d+)\]>", body)
    assert cited, body
    permalink_calls = {
        (a["channel"], a["message_ts"]) for a in rig.standin.method_calls("chat.getPermalink")
    }
    context = [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]
    assert len(context) >= len({n for _, n in cited})
    for link, n in cited:
        channel, digits = PERMALINK.fullmatch(link).groups()  # type: ignore[union-attr]
        assert channel == GENERAL
        # the link is the stand-in's chat.getPermalink answer for that very message
        stamp = next(t for c, t in permalink_calls if c == channel and t.replace(".", "") == digits)
        stored = await rig.engine.store.messages.get(gscope(), stamp)
        assert stored is not None
        line = next(t for t in context if t.startswith(f"[{n}] "))
        assert stored.speaker_name in line and link in line
    assert "Lisbon" in body
    # the second time the permalinks come from the cache
    calls = len(rig.standin.method_calls("chat.getPermalink"))
    await rig.recall("U1", GENERAL, "when is the trip to Lisbon?")
    assert len(rig.standin.method_calls("chat.getPermalink")) == calls


@pytest.mark.e2e
async def test_recall_ephemeral_setting_and_empty_question(rig: Rig) -> None:
    await seed(rig)
    rig.adapter.settings.recall_ephemeral = True
    _, _, posted = await rig.recall("U1", GENERAL, "when is the trip to Lisbon?")
    assert posted["response_type"] == "ephemeral"
    rig.adapter.settings.recall_ephemeral = False
    _, _, posted = await rig.recall("U1", GENERAL, "")
    assert posted["response_type"] == "ephemeral"  # a refusal is always ephemeral
    assert "Ask me something" in section_text(posted["blocks"])


@pytest.mark.e2e
async def test_ack_does_not_wait_for_a_slow_recall(tmp_path: Path) -> None:
    """The production default (process_before_response=False): ack first, answer later."""
    rig, close = await _rig(tmp_path, process_before_response=False)
    try:
        real_recall = rig.dispatcher.recall
        answered_at: list[float] = []

        async def slow_recall(inv: Any) -> RecallAnswer:
            await asyncio.sleep(0.5)
            answered_at.append(time.monotonic())
            return await real_recall(inv)

        rig.dispatcher.recall = slow_recall  # type: ignore[method-assign]
        status, ack_body, posted = await rig.recall("U1", GENERAL, "anything?", wait_s=5)
        assert status == 200 and ack_body == ACK_TEXT
        assert posted["blocks"]
        assert rig.ack_s < answered_at[0]  # the HTTP ack came back before the recall finished
    finally:
        await close()


# --- events change the store and the roster -----------------------------------------------


@pytest.mark.e2e
async def test_message_edit_delete_and_member_events(rig: Rig) -> None:
    assert await rig.event(message(GENERAL, "U1", "first draft of the plan", 1)) == 200
    stored = await rig.engine.store.messages.get(gscope(), ts(1))
    assert stored is not None and stored.text == "first draft of the plan"
    assert stored.speaker_name == "Alice"  # users.info, via the roster sync
    members = {m.user_id: m for m in await rig.engine.members(gscope())}
    assert set(members) == {"U1", "U2", "U3", BOT_USER_ID}
    assert members["U2"].display_name == "Bob" and members[BOT_USER_ID].is_bot
    # paged conversations.members (page_size 2 → 2 pages)
    assert len(rig.standin.method_calls("conversations.members")) == 2

    edit = {
        "type": "message",
        "subtype": "message_changed",
        "channel": GENERAL,
        "ts": ts(2),
        "message": {
            "type": "message",
            "user": "U1",
            "text": "final plan",
            "ts": ts(1),
            "edited": {"user": "U1", "ts": ts(2)},
        },
        "previous_message": {"type": "message", "user": "U1", "text": "first draft", "ts": ts(1)},
    }
    assert await rig.event(edit, 2) == 200
    stored = await rig.engine.store.messages.get(gscope(), ts(1))
    assert stored is not None and stored.text == "final plan" and stored.edited_at is not None

    delete = {
        "type": "message",
        "subtype": "message_deleted",
        "channel": GENERAL,
        "ts": ts(3),
        "deleted_ts": ts(1),
        "hidden": True,
    }
    assert await rig.event(delete, 3) == 200
    counts = await rig.counts()
    assert counts["messages"] == 0 and counts["deleted"] == 1

    rig.standin.members[GENERAL].append("U4")
    joined = {
        "type": "member_joined_channel",
        "user": "U4",
        "channel": GENERAL,
        "channel_type": "C",
        "team": TEAM_ID,
        "event_ts": ts(4),
    }
    assert await rig.event(joined, 4) == 200
    members = {m.user_id: m for m in await rig.engine.members(gscope())}
    assert members["U4"].display_name == "Dave"

    rig.standin.members[GENERAL].remove("U4")
    left = {
        "type": "member_left_channel",
        "user": "U4",
        "channel": GENERAL,
        "channel_type": "C",
        "team": TEAM_ID,
        "event_ts": ts(5),
    }
    assert await rig.event(left, 5) == 200
    assert "U4" not in {m.user_id for m in await rig.engine.members(gscope())}

    renamed = {
        "type": "user_change",
        "user": {
            "id": "U2",
            "team_id": TEAM_ID,
            "name": "bob",
            "profile": {"display_name": "Robert"},
        },
        "event_ts": ts(6),
    }
    assert await rig.event(renamed, 6) == 200
    members = {m.user_id: m for m in await rig.engine.members(gscope())}
    assert members["U2"].display_name == "Robert"
    assert await rig.adapter.roster.user_info(TEAM_ID, "U2") == ("Robert", False)


@pytest.mark.e2e
async def test_concurrent_first_sight_syncs_each_channel_once(rig: Rig) -> None:
    events = [
        message(GENERAL if n % 2 else PRIVATE, f"U{1 + n % 3}", f"burst message {n}", n)
        for n in range(1, 13)
    ]
    statuses = await asyncio.gather(*(rig.event(e, n) for n, e in enumerate(events, 1)))
    assert statuses == [200] * 12
    assert (await rig.counts())["messages"] == 12
    # one auth.test (at start), one paged member listing per channel (2 pages each)
    assert len(rig.standin.method_calls("auth.test")) == 1
    assert len(rig.standin.method_calls("conversations.members")) == 4
    # names from one paged users.list for the workspace, not a users.info per member
    pages = -(-len(rig.standin.users) // rig.standin.page_size)
    assert len(rig.standin.method_calls("users.list")) == pages
    assert not rig.standin.method_calls("users.info")
    assert await rig.engine.store.channels.is_private(gscope(PRIVATE))
    assert not await rig.engine.store.channels.is_private(gscope(GENERAL))


@pytest.mark.e2e
async def test_resync_leaves_members_slack_no_longer_lists(rig: Rig) -> None:
    assert await rig.event(message(GENERAL, "U1", "hello", 1)) == 200
    rig.standin.members[GENERAL].remove("U3")
    assert await rig.adapter.roster.ensure(gscope(), force=True)
    assert "U3" not in {m.user_id for m in await rig.engine.members(gscope())}
    # within the TTL a second ensure makes no API call
    calls = len(rig.standin.calls)
    assert await rig.adapter.roster.ensure(gscope())
    assert len(rig.standin.calls) == calls


@pytest.mark.e2e
async def test_users_list_rate_limit_is_retried(rig: Rig) -> None:
    rig.standin.rate_limit("users.list", retry_after=0)
    assert await rig.event(message(GENERAL, "U2", "hi all", 1)) == 200
    stored = await rig.engine.store.messages.get(gscope(), ts(1))
    assert stored is not None and stored.speaker_name == "Bob"
    members = {m.user_id: m.display_name for m in await rig.engine.members(gscope())}
    assert members == {"U1": "Alice", "U2": "Bob", "U3": "Carol", BOT_USER_ID: "mem"}
    # the directory's pages, the first one asked twice (one 429, retried); no users.info
    pages = -(-len(rig.standin.users) // rig.standin.page_size)
    assert len(rig.standin.method_calls("users.list")) == pages + 1
    assert not rig.standin.method_calls("users.info")


# --- signatures ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_bad_signature_and_stale_timestamp_get_401(rig: Rig) -> None:
    body = json.dumps(envelope(message(GENERAL, "U1", "should never be stored", 1)))
    before = await rig.counts()
    assert (await rig.post_raw(body, JSON, secret="wrong-secret"))[0] == 401
    assert (await rig.post_raw(body, JSON, at=int(time.time()) - 301))[0] == 401
    form = urlencode(
        {
            "command": "/recall",
            "text": "x",
            "user_id": "U1",
            "channel_id": GENERAL,
            "team_id": TEAM_ID,
            "response_url": rig.standin.response_url("nope"),
        }
    )
    assert (await rig.post_raw(form, FORM, secret="wrong-secret"))[0] == 401
    async with rig.http.post(rig.url, data=body, headers={"Content-Type": JSON}) as resp:
        assert resp.status == 401  # unsigned
    assert await rig.counts() == before
    assert rig.standin.responses == []
    assert await rig.engine.members(gscope()) == []
    assert rig.adapter.stats["bad_signature"] == 4
