"""The Slack adapter on private channels, malformed payloads, bots, Socket Mode and its pure
block rendering (split from test_slack_adapter.py, whose signed-request helpers it shares)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.slack.adapter import ACK_TEXT
from speakermem.integrations.slack.render import MAX_BLOCKS, MAX_TEXT, escape, render_blocks
from speakermem.memory.query.answer import Citation, RecallAnswer
from tests.standins.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID
from tests.test_slack_adapter import (
    GENERAL,
    JSON,
    PRIVATE,
    SECRET,
    Rig,
    _rig,
    envelope,
    gscope,
    links_in,
    message,
    rig,  # noqa: F401
    section_text,
    seed,
    ts,
)

pytestmark = pytest.mark.contract


# --- privacy -------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("recall_scope", ["channel", "workspace"])
async def test_private_channel_never_answers_elsewhere(tmp_path: Path, recall_scope: str) -> None:
    rig, close = await _rig(tmp_path, recall_scope=recall_scope)  # noqa: F811
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
    rig: Rig,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
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
    with caplog.at_level("WARNING", logger="speakermem.integrations.slack.adapter"):
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
async def test_bot_messages_are_not_stored(rig: Rig) -> None:  # noqa: F811
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
    rig, close = await _rig(tmp_path, mode="socket")  # noqa: F811
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
async def test_recall_frames_the_extractive_answer_in_the_askers_slack_locale(rig: Rig) -> None:  # noqa: F811
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
