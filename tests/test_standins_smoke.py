"""Prove the local stand-ins work with the real, unmodified discord.py and slack-bolt.

If these fail after a library upgrade, the stand-ins (not the bot) need fixing;
see shared/TESTING.md for what the libraries expect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import aiohttp
import discord
import pytest
from aiohttp import web
from discord import app_commands
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from speakermem.integrations.discord import translate as dtr
from speakermem.integrations.slack import translate as str_
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import APP_ID, GENERAL, GUILD_ID, THREAD
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn, sign, signed_headers

pytestmark = pytest.mark.e2e

SECRET = "standin-signing-secret"


# --- Discord -----------------------------------------------------------------------------------


@pytest.fixture
async def discord_standin(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DiscordStandIn]:
    standin = await DiscordStandIn().start()
    standin.install(monkeypatch)
    yield standin
    await standin.close()


def _intents() -> discord.Intents:
    intents = discord.Intents.default()
    intents.members = True
    intents.message_content = True
    return intents


async def test_discord_client_connects_and_receives_messages(discord_standin: DiscordStandIn):
    client = discord.Client(intents=_intents(), guild_ready_timeout=0.05)
    ready = asyncio.Event()
    messages: asyncio.Queue[discord.Message] = asyncio.Queue()
    raw_updates: asyncio.Queue[discord.RawMessageUpdateEvent] = asyncio.Queue()
    raw_deletes: asyncio.Queue[discord.RawMessageDeleteEvent] = asyncio.Queue()

    @client.event
    async def on_ready() -> None:
        ready.set()

    @client.event
    async def on_message(message: discord.Message) -> None:
        await messages.put(message)

    @client.event
    async def on_raw_message_edit(payload: discord.RawMessageUpdateEvent) -> None:
        await raw_updates.put(payload)

    @client.event
    async def on_raw_message_delete(payload: discord.RawMessageDeleteEvent) -> None:
        await raw_deletes.put(payload)

    runner = asyncio.create_task(client.start("standin-token"))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert discord_standin.identify is not None
        assert discord_standin.identify["intents"] & (1 << 15)  # MESSAGE_CONTENT
        guild = client.get_guild(int(GUILD_ID))
        assert guild is not None
        assert {m.display_name for m in guild.members} == {"Olivia", "Ally", "bob", "speakermem"}
        assert guild.get_thread(int(THREAD)) is not None

        payload = discord_standin.message_create("hello <@700000000000000303>")
        payload["mentions"] = [guild.get_member(700000000000000303)._user._to_minimal_user_json()]  # type: ignore[union-attr]
        await discord_standin.dispatch("MESSAGE_CREATE", payload)
        message = await asyncio.wait_for(messages.get(), 5)
        assert message.content.startswith("hello")
        assert message.author.display_name == "Ally"
        # The same raw payload goes through our pure translator.
        event = dtr.message_create(payload, channel_parent={})
        assert event is not None
        assert event.speaker_name == "Ally"
        assert event.addressees == ("700000000000000303",)

        edit = {**payload, "content": "hello again", "edited_timestamp": payload["timestamp"]}
        await discord_standin.dispatch("MESSAGE_UPDATE", edit)
        update = await asyncio.wait_for(raw_updates.get(), 5)
        assert update.data["content"] == "hello again"

        await discord_standin.dispatch(
            "MESSAGE_DELETE", {"id": payload["id"], "channel_id": GENERAL, "guild_id": GUILD_ID}
        )
        deleted = await asyncio.wait_for(raw_deletes.get(), 5)
        assert deleted.message_id == int(payload["id"])

        sent = await client.get_channel(int(GENERAL)).send("from the bot")  # type: ignore[union-attr]
        assert sent.content == "from the bot"
        assert discord_standin.sent_messages[-1]["content"] == "from the bot"
    finally:
        await client.close()
        await runner


async def test_discord_slash_command_defer_and_followup(discord_standin: DiscordStandIn):
    client = discord.Client(intents=_intents(), guild_ready_timeout=0.05)
    tree = app_commands.CommandTree(client)
    ready = asyncio.Event()
    answered = asyncio.Event()
    seen: list[str] = []

    @tree.command(name="recall", description="Ask the channel's memory")
    async def recall(interaction: discord.Interaction, question: str) -> None:
        seen.append(question)
        await interaction.response.defer(thinking=True)
        embed = discord.Embed(description="[jump](https://discord.com/channels/1/2/3)")
        await interaction.followup.send(f"answer to: {question}", embed=embed)
        await interaction.edit_original_response(content="edited answer")
        answered.set()

    @client.event
    async def on_ready() -> None:
        await tree.sync()  # global
        tree.copy_global_to(guild=discord.Object(int(GUILD_ID)))
        await tree.sync(guild=discord.Object(int(GUILD_ID)))
        ready.set()

    runner = asyncio.create_task(client.start("standin-token"))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert discord_standin.commands[f"applications/{APP_ID}"][0]["name"] == "recall"
        guild_key = f"applications/{APP_ID}/guilds/{GUILD_ID}"
        assert [c["name"] for c in discord_standin.commands[guild_key]] == ["recall"]

        payload = discord_standin.interaction(
            "recall", [{"name": "question", "type": 3, "value": "where is the trip?"}]
        )
        await discord_standin.dispatch("INTERACTION_CREATE", payload)
        await asyncio.wait_for(answered.wait(), 5)
        assert seen == ["where is the trip?"]
        assert discord_standin.interaction_callbacks[0]["type"] == 5  # deferred
        assert discord_standin.followups[0]["content"] == "answer to: where is the trip?"
        assert discord_standin.followups[0]["embeds"][0]["description"].startswith("[jump]")
        assert discord_standin.followups[1]["content"] == "edited answer"
        assert discord_standin.followups[1]["edit"] == "@original"
        invocation = dtr.interaction_recall(payload)
        assert invocation is not None and invocation.text == "where is the trip?"
    finally:
        await client.close()
        await runner


# --- Slack -------------------------------------------------------------------------------------


@pytest.fixture
async def slack_standin() -> AsyncIterator[SlackApiStandIn]:
    standin = await SlackApiStandIn(
        users={"U1": {"name": "alice", "profile": {"display_name": "ally"}}},
        members={"C1": ["U1", "U2", "U3"]},
    ).start()
    yield standin
    await standin.close()


def _bolt_app(standin: SlackApiStandIn) -> AsyncApp:
    client = AsyncWebClient(token="xoxb-standin", base_url=standin.base_url)
    return AsyncApp(client=client, signing_secret=SECRET, process_before_response=True)


async def _serve(app: AsyncApp) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app.web_app(path="/slack/events"))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/slack/events"


async def test_slack_signed_slash_command_acks_and_responds(slack_standin: SlackApiStandIn):
    app = _bolt_app(slack_standin)
    invocations = []

    @app.command("/recall")
    async def recall(ack, respond, command, client) -> None:  # type: ignore[no-untyped-def]
        invocations.append(str_.translate_command(command))
        await ack("thinking…")
        members = []
        cursor = None
        while True:
            page = await client.conversations_members(channel=command["channel_id"], cursor=cursor)
            members += page["members"]
            cursor = page["response_metadata"]["next_cursor"]
            if not cursor:
                break
        who = await client.users_info(user=command["user_id"])
        posted = await client.chat_postMessage(channel=command["channel_id"], text="hello")
        assert who["user"]["profile"]["display_name"] == "ally" and posted["ts"]
        await respond(f"{len(members)} members")

    runner, url = await _serve(app)
    try:
        form = {
            "command": "/recall",
            "text": "where is the trip?",
            "user_id": "U1",
            "user_name": "alice",
            "channel_id": "C1",
            "team_id": TEAM_ID,
            "response_url": slack_standin.response_url("cmd1"),
            "trigger_id": "123.456",
        }
        body = urlencode(form)
        ctype = "application/x-www-form-urlencoded"
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url, data=body, headers=signed_headers(SECRET, body, content_type=ctype)
            ) as resp:
                assert resp.status == 200
                assert await resp.text() == "thinking…"
            bad = {**sign("wrong-secret", int(time.time()), body), "Content-Type": ctype}
            async with http.post(url, data=body, headers=bad) as resp:
                assert resp.status == 401
            stale = signed_headers(SECRET, body, content_type=ctype)
            stale.update(sign(SECRET, int(time.time()) - 600, body))
            async with http.post(url, data=body, headers=stale) as resp:
                assert resp.status == 401

        assert [name for name, _ in slack_standin.calls].count("conversations.members") == 2
        assert slack_standin.method_calls("auth.test")
        assert slack_standin.posted[0]["text"] == "hello"
        assert slack_standin.responses == [("cmd1", {"text": "3 members"})]
        assert invocations[0].options["response_url"] == slack_standin.response_url("cmd1")
        assert invocations[0].command == "recall"
    finally:
        await runner.cleanup()


async def test_slack_events_api_message_reaches_translator(slack_standin: SlackApiStandIn):
    app = _bolt_app(slack_standin)
    events = []

    @app.event("message")
    async def on_message(body, client) -> None:  # type: ignore[no-untyped-def]
        events.append(str_.translate_event(body, user_names={"U1": "ally"}))
        link = await client.chat_getPermalink(channel=body["event"]["channel"], message_ts="1.2")
        assert link["permalink"].endswith("/C1/p12")

    runner, url = await _serve(app)
    try:
        body = json.dumps(
            {
                "type": "event_callback",
                "team_id": TEAM_ID,
                "api_app_id": "A0STANDIN",
                "event_id": "Ev1",
                "event_time": 1700000000,
                "event": {
                    "type": "message",
                    "channel": "C1",
                    "user": "U1",
                    "text": "hi <@U2>",
                    "ts": "1700000000.000100",
                    "channel_type": "channel",
                },
            }
        )
        headers = signed_headers(SECRET, body, content_type="application/json")
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=body, headers=headers) as resp,
        ):
            assert resp.status == 200
        assert len(events) == 1
        assert events[0].speaker_name == "ally"
        assert events[0].addressees == ("U2",)
    finally:
        await runner.cleanup()


async def test_slack_rate_limit_is_retried_by_the_sdk(slack_standin: SlackApiStandIn):
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler

    client = AsyncWebClient(token="xoxb-standin", base_url=slack_standin.base_url)
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=1))
    slack_standin.rate_limit("users.info", retry_after=0)
    info = await client.users_info(user="U1")
    assert info["user"]["profile"]["display_name"] == "ally"
    assert len(slack_standin.method_calls("users.info")) == 2


async def test_slack_socket_mode_handler_acks_an_envelope(slack_standin: SlackApiStandIn):
    app = _bolt_app(slack_standin)
    seen: list[str] = []

    @app.command("/recall")
    async def recall(ack, command) -> None:  # type: ignore[no-untyped-def]
        seen.append(command["text"])
        await ack("on it")

    handler = AsyncSocketModeHandler(app, app_token="xapp-standin")
    await handler.connect_async()
    try:
        envelope_id = slack_standin.queue_envelope(
            "slash_commands",
            {
                "command": "/recall",
                "text": "who is going?",
                "user_id": "U1",
                "channel_id": "C1",
                "team_id": TEAM_ID,
                "response_url": slack_standin.response_url("sock"),
            },
            accepts_response_payload=True,
        )
        ack = await slack_standin.wait_for_ack(envelope_id)
        assert seen == ["who is going?"]
        assert ack["payload"] == {"text": "on it"}
        assert slack_standin.method_calls("apps.connections.open")
    finally:
        await handler.close_async()
