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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from bot.dispatch import Dispatcher
from bot.settings import Settings
from integrations.slack.adapter import ACK_TEXT, SlackAdapter
from integrations.slack.render import MAX_BLOCKS, MAX_TEXT, escape, render_blocks
from memory.config import RecallConfig
from memory.engine import MemoryEngine
from memory.models import Scope
from memory.query.answer import Citation, RecallAnswer
from memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID, SlackApiStandIn, sign

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


# --- privacy -------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("recall_scope", ["channel", "workspace"])
async def test_private_channel_never_answers_elsewhere(tmp_path: Path, recall_scope: str) -> None:
    rig, close = await _rig(tmp_path, recall_scope=recall_scope)
    try:
        await seed(rig)
        question = "what is the launch code word for the Lisbon trip?"
        # U1 reads #secret: asked there, the best match is found (the data is real)
        _, _, inside = await rig.recall("U1", PRIVATE, question)
        assert "pineapple" in section_text(inside["blocks"])
        cited_inside = {c for c, _ in links_in(inside["blocks"])}
        # workspace scope may add public #general to an answer given inside #secret
        assert cited_inside == ({PRIVATE} if recall_scope == "channel" else {PRIVATE, GENERAL})

        # U2 is not in #secret: asked in #general it is never cited
        _, _, posted = await rig.recall("U2", GENERAL, question)
        assert {c for c, _ in links_in(posted["blocks"])} <= {GENERAL}
        assert "pineapple" not in json.dumps(posted)
        assert PRIVATE not in json.dumps(posted)
        # nor for U1, who can read it, asking in #general (a private channel stays put)
        _, _, posted = await rig.recall("U1", GENERAL, question)
        assert "pineapple" not in json.dumps(posted)
        assert PRIVATE not in json.dumps(posted)

        # U2 asking inside #secret is refused, ephemerally
        _, ack, refused = await rig.recall("U2", PRIVATE, question)
        assert ack == ACK_TEXT
        assert refused["response_type"] == "ephemeral"
        assert "cannot read" in section_text(refused["blocks"])
        assert "pineapple" not in json.dumps(refused)
    finally:
        await close()


# --- malformed payloads and bots -------------------------------------------------------------


@pytest.mark.e2e
async def test_malformed_payloads_are_acked_logged_and_skipped(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    assert await rig.event(message(GENERAL, "U1", "baseline", 1), 1) == 200
    before = await rig.counts()
    huge = "x" * 40_001
    bad_events: list[dict[str, Any]] = [
        {"type": "message", "channel": GENERAL, "user": "U1", "text": "no ts"},
        {"type": "message", "user": "U1", "text": "no channel", "ts": ts(2)},
        {"type": "message", "channel": GENERAL, "text": "nobody said this", "ts": ts(3)},
        {"type": "message", "channel": GENERAL, "user": "U1", "text": "?", "ts": "yesterday"},
        {
            "type": "message",
            "subtype": "weird_new_subtype",
            "channel": GENERAL,
            "user": "U1",
            "text": "unknown subtype",
            "ts": ts(4),
        },
        {"type": "message", "subtype": "message_changed", "channel": GENERAL, "ts": ts(5)},
        message(GENERAL, "U1", huge, 6),
        message(GENERAL, "U1", "lone \udcff surrogate", 7),
        {"type": "member_joined_channel", "channel": GENERAL},
        {"type": "user_change", "user": "not-an-object"},
        {"type": "some_future_event", "channel": GENERAL},
    ]
    with caplog.at_level("WARNING", logger="integrations.slack.adapter"):
        for n, event in enumerate(bad_events, start=10):
            assert await rig.event(event, n) == 200, event
        weird_bodies = [
            json.dumps({"type": "event_callback", "team_id": TEAM_ID, "event": "not an object"}),
            json.dumps({"type": "event_callback", "team_id": TEAM_ID, "event": {"no": "type"}}),
            json.dumps(envelope(message(GENERAL, "U1", "x", 8)))[:-7],  # truncated JSON
        ]
        for body in weird_bodies:
            status, _ = await rig.post_raw(body, JSON)
            assert status == 200, body
        raw = json.dumps(envelope(message(GENERAL, "U1", "BYTES", 9))).encode()
        raw = raw.replace(b"BYTES", b"\xff\xfe\xc3\x28")
        assert (await rig.post_raw(raw, JSON))[0] == 200
    assert await rig.counts() == before
    assert rig.adapter.stats["malformed"] >= 8
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "skipped" in logged
    assert huge not in logged and "nobody said this" not in logged
    assert "xoxb-test-token" not in logged and SECRET not in logged
    # still serving
    assert await rig.event(message(GENERAL, "U1", "after the storm", 30), 30) == 200
    stored = await rig.engine.store.messages.get(gscope(), ts(30))
    assert stored is not None and stored.text == "after the storm"


@pytest.mark.e2e
async def test_bot_messages_are_not_stored(rig: Rig) -> None:
    own = message(GENERAL, BOT_USER_ID, "I am the bot", 1)
    own_bot = {
        "type": "message",
        "subtype": "bot_message",
        "channel": GENERAL,
        "bot_id": BOT_ID,
        "text": "bot via bot_id",
        "ts": ts(2),
    }
    other = {
        "type": "message",
        "subtype": "bot_message",
        "channel": GENERAL,
        "bot_id": "B0OTHER",
        "username": "deploybot",
        "text": "deployed",
        "ts": ts(3),
    }
    other_user = message(GENERAL, "U9", "integration user", 4, bot_id="B0OTHER2")
    for n, event in enumerate([own, own_bot, other, other_user], start=1):
        assert await rig.event(event, n) == 200
    assert (await rig.counts())["messages"] == 0
    assert await rig.event(message(GENERAL, "U1", "a person", 5), 5) == 200
    assert (await rig.counts())["messages"] == 1


# --- Socket Mode -----------------------------------------------------------------------------


@pytest.mark.e2e
async def test_socket_mode_acks_envelopes_and_answers(tmp_path: Path) -> None:
    rig, close = await _rig(tmp_path, mode="socket")
    try:
        standin = rig.standin
        assert standin.method_calls("apps.connections.open")
        event_id = standin.queue_envelope(
            "events_api", envelope(message(GENERAL, "U1", "the offsite is in Porto", 1), 1)
        )
        ack = await standin.wait_for_ack(event_id)
        assert ack["envelope_id"] == event_id
        stored = await rig.engine.store.messages.get(gscope(), ts(1))
        assert stored is not None and stored.text == "the offsite is in Porto"

        cmd_id = standin.queue_envelope(
            "slash_commands",
            {
                "command": "/recall",
                "text": "where is the offsite?",
                "user_id": "U1",
                "user_name": "alice",
                "channel_id": GENERAL,
                "team_id": TEAM_ID,
                "response_url": standin.response_url("sock"),
            },
            accepts_response_payload=True,
        )
        ack = await standin.wait_for_ack(cmd_id)
        assert ack["payload"] == {"text": ACK_TEXT}
        for _ in range(100):
            if standin.responses:
                break
            await asyncio.sleep(0.02)
        key, posted = standin.responses[0]
        assert key == "sock"
        assert "Porto" in section_text(posted["blocks"])
        assert {c for c, _ in links_in(posted["blocks"])} == {GENERAL}
    finally:
        await close()


# --- render_blocks (pure) --------------------------------------------------------------------


def _cite(n: int, channel: str = GENERAL) -> Citation:
    return Citation(
        n=n,
        scope=gscope(channel),
        message_id=ts(n),
        speaker="A & <B>",
        time=datetime(2024, 3, 1, tzinfo=UTC),
        link=f"https://x.invalid/{n}",
    )


def test_render_escapes_and_links_citations() -> None:
    answer = RecallAnswer(
        text="Tom said <!channel> & left [1][2]; see [3]", citations=[_cite(1), _cite(2)]
    )
    blocks = render_blocks(answer, {1: "https://s.invalid/p1", 2: "https://s.invalid/p2"})
    text = blocks[0]["text"]["text"]
    assert "&lt;!channel&gt; &amp; left" in text
    assert "<https://s.invalid/p1|[1]><https://s.invalid/p2|[2]>" in text
    assert text.endswith("see [3]")  # no link known: left as plain text
    context = blocks[-1]["elements"]
    assert (
        context[0]["text"] == "[1] A &amp; &lt;B&gt; · 2024-03-01 · <https://s.invalid/p1|message>"
    )
    assert context[1]["text"].endswith("<https://s.invalid/p2|message>")
    assert escape("a<b>&c") == "a&lt;b&gt;&amp;c"


@pytest.mark.e2e
def test_render_respects_slack_limits() -> None:
    n = 600
    text = " ".join(f"fact number {i} is long enough to matter [{i}]" for i in range(1, n + 1))
    text = (text + "\n") * 3
    answer = RecallAnswer(text=text, citations=[_cite(i) for i in range(1, n + 1)])
    links = {i: f"https://standin.slack.invalid/archives/C/p{i:012d}" for i in range(1, n + 1)}
    blocks = render_blocks(answer, links)
    assert len(blocks) <= MAX_BLOCKS
    for b in blocks:
        if b["type"] == "section":
            t = b["text"]["text"]
            assert 0 < len(t) <= MAX_TEXT
            assert t.count("<") == t.count(">")  # no link split across sections
        if b["type"] == "context":
            assert len(b["elements"]) <= 10
    sections = [b for b in blocks if b["type"] == "section"]
    assert len(sections) > 1
    assert "truncated" in json.dumps(blocks[-1])


def test_render_refusal_and_empty() -> None:
    blocks = render_blocks(RecallAnswer(text="Sorry: no.", refused=True), {})
    assert blocks == [{"type": "section", "text": {"type": "mrkdwn", "text": "Sorry: no."}}]
    blocks = render_blocks(RecallAnswer(text=""), {})
    assert blocks[0]["text"]["text"] == "_(no answer)_"
    one_long_word = RecallAnswer(text="y" * 7000)
    assert [len(b["text"]["text"]) for b in render_blocks(one_long_word, {})] == [3000, 3000, 1000]


@pytest.mark.e2e
async def test_recall_frames_the_extractive_answer_in_the_askers_slack_locale(rig: Rig) -> None:
    await seed(rig)
    rig.standin.users["U3"]["locale"] = "ja-JP"
    _, _, posted = await rig.recall("U3", GENERAL, "when is the trip to Lisbon?")
    body = section_text(posted["blocks"])
    assert body.startswith("見つかった内容です：") and "Here is what I found" not in body
    assert "The team trip to Lisbon is booked for May 3rd" in body  # the quote stays verbatim
    context = [e["text"] for b in posted["blocks"] if b["type"] == "context" for e in b["elements"]]
    assert any("抜粋による回答" in t for t in context)
    calls = [c for c in rig.standin.method_calls("users.info") if c.get("user") == "U3"]
    assert any(str(c.get("include_locale")).lower() in {"1", "true"} for c in calls)
    # a user without a locale keeps English
    _, _, posted = await rig.recall("U1", GENERAL, "when is the trip to Lisbon?")
    assert section_text(posted["blocks"]).startswith("Here is what I found:")
