"""Slack catch-up after downtime against the Web API stand-in: conversations.history and
replies, paged, rate-limited, resumable from the saved cursor; Socket Mode reconnects catch
up; Events API retries of one event are stored once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from speakermem.bot.catchup import ChannelProgress
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.governance_commands import render_status
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.adapter import SlackAdapter
from speakermem.integrations.slack.history import SlackHistory
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.standins.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID, SlackApiStandIn, sign

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

SECRET = "catchup-signing-secret"
GENERAL = "CGENERAL"
USERS: dict[str, dict[str, Any]] = {
    "U1": {"name": "alice", "profile": {"display_name": "Alice"}},
    "U2": {"name": "bob", "profile": {"display_name": "Bob"}},
    BOT_USER_ID: {"name": "speakermem", "is_bot": True},
}
SCOPE = Scope(platform="slack", workspace=TEAM_ID, channel=GENERAL)
T0 = int(time.time()) - 2 * 3600


def new_standin() -> SlackApiStandIn:
    return SlackApiStandIn(
        users={k: dict(v) for k, v in USERS.items()},
        members={GENERAL: ["U1", "U2", BOT_USER_ID]},
    )


@dataclass
class Run:
    standin: SlackApiStandIn
    engine: MemoryEngine
    adapter: SlackAdapter

    async def stop(self) -> None:
        await self.adapter.stop()
        await self.engine.close()

    async def post(self, event: dict[str, Any], *, event_id: str, retry: int | None = None) -> int:
        body = json.dumps(
            {
                "type": "event_callback",
                "team_id": TEAM_ID,
                "api_app_id": "A0STANDIN",
                "event_id": event_id,
                "event_time": int(time.time()),
                "event": event,
            }
        )
        headers = {**sign(SECRET, int(time.time()), body), "Content-Type": "application/json"}
        if retry is not None:
            headers["X-Slack-Retry-Num"] = str(retry)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.adapter.url, data=body, headers=headers) as resp,
        ):
            return resp.status


async def start(
    standin: SlackApiStandIn, tmp_path: Path, *, mode: str = "http", **options: Any
) -> Run:
    engine = await MemoryEngine.open(make_config(tmp_path))
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
        settings,
        Dispatcher(engine, RecallPipeline(engine)),
        engine,
        process_before_response=True,
        **options,
    )
    await adapter.start()
    return Run(standin, engine, adapter)


def live(msg: dict[str, Any]) -> dict[str, Any]:
    """A history message as its live event."""
    return {**msg, "channel": GENERAL, "channel_type": "channel"}


async def stored_ids(engine: MemoryEngine) -> list[str]:
    rows = await engine.store.db.read(
        "SELECT m.message_id FROM messages m JOIN channels c ON c.id = m.channel_pk"
        " WHERE c.channel = ?",
        (GENERAL,),
    )
    return [r[0] for r in rows]


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polling the store
            await asyncio.sleep(0.05)


async def first_run(standin: SlackApiStandIn, tmp_path: Path) -> dict[str, Any]:
    """Start, receive one live message, stop: the store knows the channel up to it."""
    first = standin.add_message(GENERAL, "before the outage, planning thread", user="U1", at=T0)
    run = await start(standin, tmp_path)
    try:
        assert await run.post(live(first), event_id="Ev0") == 200
        assert await stored_ids(run.engine) == [first["ts"]]
    finally:
        await run.stop()
    return first


def history_calls(standin: SlackApiStandIn, since: int = 0) -> list[dict[str, Any]]:
    """Catch-up's conversations.history calls (exclusive of `oldest`). Reconciliation's,
    which ask for inclusive spans after a pass, are tested in test_reconcile_slack.py."""
    return [
        a
        for m, a in standin.calls[since:]
        if m == "conversations.history" and a.get("inclusive") != "1"
    ]


async def test_300_messages_posted_while_down_are_stored_exactly_once(tmp_path: Path) -> None:
    standin = await new_standin().start()
    try:
        first = await first_run(standin, tmp_path)

        # the bot is down: 300 messages, among them a thread started during the outage and
        # replies to a thread started before it (its parent is not in the gap's history)
        posted: list[dict[str, Any]] = []
        at = T0 + 10
        parent: dict[str, Any] | None = None
        for i in range(260):
            msg = standin.add_message(
                GENERAL, f"while down {i}", user="U2" if i % 2 else "U1", at=at
            )
            posted.append(msg)
            if i == 100:
                parent = msg
            at += 1
            if i % 13 == 0:  # replies interleaved in time with top-level messages
                user = "U2" if i % 2 else "U1"
                if parent is not None and len(posted) < 200:
                    posted.append(
                        standin.add_message(
                            GENERAL, f"reply {i}", user=user, at=at, thread_ts=parent["ts"]
                        )
                    )
                posted.append(
                    standin.add_message(
                        GENERAL, f"old-thread reply {i}", user=user, at=at, thread_ts=first["ts"]
                    )
                )
        assert parent is not None
        while len(posted) < 300:
            at += 1
            posted.append(
                standin.add_message(GENERAL, "late reply", user="U2", at=at, thread_ts=parent["ts"])
            )
        # not stored, however they are fetched: a bot's post, a join, the bot's own post
        standin.add_message(GENERAL, "beep", user="UBOT", at=at, subtype="bot_message", bot_id="B9")
        standin.add_message(GENERAL, "<@U9> has joined", user="U9", at=at, subtype="channel_join")
        own = standin.add_message(GENERAL, "I remember", user=BOT_USER_ID, at=at, bot_id=BOT_ID)
        replies = [m for m in posted if "thread_ts" in m]
        assert len(posted) == 300 and 20 < len(replies) < 60

        calls_before = len(standin.calls)
        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            ids = await stored_ids(run.engine)
            assert len(ids) == 301 == len(set(ids))
            assert set(ids) == {first["ts"], *(m["ts"] for m in posted)}
            # names come from the directory, not the bare ids of history payloads
            reply = await run.engine.store.messages.get(SCOPE, replies[0]["ts"])
            assert reply is not None and reply.speaker_name in ("Alice", "Bob")
            assert reply.thread_id == replies[0]["thread_ts"]

            # history paged 200 at a time from a day before the last stored message (threads),
            # replies asked for the new thread and the old one, each newer than that message
            hist = history_calls(standin, calls_before)
            assert len(hist) == 2 and all(h["limit"] == "200" for h in hist)
            assert float(hist[0]["oldest"]) == float(first["ts"]) - 24 * 3600
            rep = [a for m, a in standin.calls[calls_before:] if m == "conversations.replies"]
            assert {a["ts"] for a in rep} == {first["ts"], parent["ts"]}
            assert all(a["oldest"] == first["ts"] for a in rep)

            # fetched: the 300 and the two bot posts (the dispatcher drops those); the join
            # is no message event at all
            assert run.adapter.catchup_lines() == [
                ChannelProgress(
                    scope=SCOPE,
                    name="cgeneral",
                    fetched=302,
                    newest_ts=float(own["ts"]),
                    done=True,
                ).line()
            ]
            assert "caught up to" in run.adapter.catchup_lines()[0]
            cursor = (await run.engine.store.catchup.cursors("slack"))[0]
            assert cursor.finished and cursor.cursor_id == own["ts"]
            assert run.adapter.stats["catchup_messages"] == 302  # exported with /metrics
            # `/memory status` (and `speakermem status`) read the same line from the cursor
            status = await Governance(run.engine).status("slack", TEAM_ID)
            (entry,) = [e for e in status["catchup"] if e["kind"] == "catchup"]
            assert entry["fetched"] == 302 and entry["name"] == "cgeneral" and entry["finished"]
            shown = render_status(status).text.splitlines()
            assert f"• History: {run.adapter.catchup_lines()[0]}" in shown
        finally:
            await run.stop()

        # a restart with nothing new fetches once, from the newest message, and stores nothing
        run = await start(standin, tmp_path)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            assert len(await stored_ids(run.engine)) == 301
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_interrupted_catch_up_resumes_from_its_saved_cursor(tmp_path: Path) -> None:
    standin = await new_standin().start()
    try:
        first = await first_run(standin, tmp_path)
        posted = [
            standin.add_message(GENERAL, f"gap {i}", user="U1", at=T0 + 10 + i) for i in range(300)
        ]

        # run 2: the history fetch is held while a live message arrives (newer than the gap),
        # then the pass is cut after its first page of 50, as if the process died there
        entered, release = standin.hold("conversations.history")
        run = await start(standin, tmp_path, catchup_page_size=50, thread_lookback_s=0)
        assert run.adapter.catchup is not None
        pages: list[int] = []

        def die_after_first_page(prog: ChannelProgress, n: int) -> None:
            pages.append(n)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()

        run.adapter.catchup.catchup.on_page = die_after_first_page
        try:
            await asyncio.wait_for(entered.wait(), 10)
            newer = standin.add_message(GENERAL, "live, after the gap", user="U2", at=T0 + 900)
            assert await run.post(live(newer), event_id="Ev1") == 200
            standin._holds.clear()
            release.set()
            await until(lambda: _done(run))
        finally:
            await run.stop()
        assert pages == [50]
        cursor = (await _cursors(tmp_path))[0]
        assert not cursor.finished and cursor.fetched == 50
        assert cursor.cursor_id == posted[49]["ts"]

        # run 3 starts from that cursor, not from the newest stored message (the live one)
        calls_before = len(standin.calls)
        run = await start(standin, tmp_path, catchup_page_size=50, thread_lookback_s=0)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            hist = history_calls(standin, calls_before)
            assert hist[0]["oldest"] == posted[49]["ts"] != newer["ts"]
            assert run.adapter.catchup.progress()[0].fetched == 250 + 1  # the live one again
            ids = await stored_ids(run.engine)
            assert len(ids) == len(set(ids)) == 302
            assert set(ids) == {first["ts"], newer["ts"], *(m["ts"] for m in posted)}
        finally:
            await run.stop()
        cursor = (await _cursors(tmp_path))[0]
        assert cursor.finished and cursor.cursor_id == newer["ts"]
    finally:
        await standin.close()


async def _done(run: Run) -> bool:
    assert run.adapter.catchup is not None
    return not run.adapter.catchup.running


async def _cursors(tmp_path: Path) -> list[Any]:
    engine = await MemoryEngine.open(make_config(tmp_path))
    try:
        return await engine.store.catchup.cursors("slack")
    finally:
        await engine.close()


async def test_a_429_on_a_history_page_is_waited_out_and_the_page_asked_again(
    tmp_path: Path,
) -> None:
    standin = await new_standin().start()
    try:
        await first_run(standin, tmp_path)
        posted = [
            standin.add_message(GENERAL, f"gap {i}", user="U1", at=T0 + 10 + i) for i in range(120)
        ]
        standin.rate_limit("conversations.history", retry_after=1)
        calls_before = len(standin.calls)
        run = await start(standin, tmp_path, catchup_page_size=100, thread_lookback_s=0)
        try:
            assert run.adapter.catchup is not None
            await run.adapter.catchup.wait()
            hist = history_calls(standin, calls_before)
            # the refused first page, the same page again, then the second page
            assert len(hist) == 3 and hist[0] == hist[1] and hist[2]["cursor"] == "100"
            # and the same page was asked again only after the Retry-After (1 s)
            asked = [
                t
                for (method, _), t in zip(
                    standin.calls[calls_before:], standin.call_times[calls_before:], strict=True
                )
                if method == "conversations.history"
            ]
            assert asked[1] - asked[0] >= 1.0 - 0.02
            assert len(set(await stored_ids(run.engine))) == 121
            assert {m["ts"] for m in posted} <= set(await stored_ids(run.engine))
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_history_waits_out_repeated_429s_itself(tmp_path: Path) -> None:
    """Without the client's retry handler: SlackHistory's own loop (shared with the roster
    directory) waits each Retry-After and asks the same page again."""
    from slack_sdk.web.async_client import AsyncWebClient

    standin = await new_standin().start()
    try:
        for i in range(5):
            standin.add_message(GENERAL, f"m{i}", user="U1", at=T0 + i)
        standin.rate_limit("conversations.history", retry_after=2, times=3)
        slept: list[float] = []

        async def sleep(s: float) -> None:
            slept.append(s)

        history = SlackHistory(
            AsyncWebClient(token="xoxb-t", base_url=standin.base_url),
            page_size=2,
            thread_lookback_s=0,
            sleep=sleep,
        )
        pages = [p async for p in history.pages(SCOPE, after_id=None, after_ts=T0 - 1)]
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [e.text for p in pages for e in p] == [f"m{i}" for i in range(5)]
        assert slept == [2.0, 2.0, 2.0] and history.api.waited_s == 6.0
        hist = history_calls(standin)
        assert len(hist) == 3 + 3 and hist[0] == hist[1] == hist[2] == hist[3]
    finally:
        await standin.close()


async def test_socket_mode_reconnect_catches_up_what_was_sent_meanwhile(tmp_path: Path) -> None:
    standin = await new_standin().start()
    try:
        first = standin.add_message(GENERAL, "before", user="U1", at=T0)
        run = await start(standin, tmp_path, mode="socket")
        try:
            assert run.adapter.catchup is not None
            env = standin.queue_envelope(
                "events_api",
                {"type": "event_callback", "team_id": TEAM_ID, "event": live(first)},
            )
            await standin.wait_for_ack(env)

            async def first_in() -> bool:
                return len(await stored_ids(run.engine)) == 1

            await until(first_in)
            assert run.adapter.catchup.runs == 0  # nothing was stored before: nothing to do

            # the socket drops; what is posted meanwhile never comes as an event
            missed = [
                standin.add_message(GENERAL, f"missed {i}", user="U2", at=T0 + 60 + i)
                for i in range(40)
            ]
            calls_before = len(standin.calls)
            assert await standin.drop_sockets() == 1

            async def caught_up() -> bool:
                return len(await stored_ids(run.engine)) == 41

            await until(caught_up)
            await run.adapter.catchup.wait()
            assert standin.socket_connections == 2
            assert run.adapter.catchup.reconnects == 1 and run.adapter.catchup.runs == 1
            hist = history_calls(standin, calls_before)
            assert hist and float(hist[0]["oldest"]) == float(first["ts"]) - 24 * 3600
            ids = await stored_ids(run.engine)
            assert len(ids) == len(set(ids)) == 41
            assert set(ids) == {first["ts"], *(m["ts"] for m in missed)}

            # the new session delivers events as before
            after = standin.add_message(GENERAL, "after", user="U1", at=T0 + 200)
            env = standin.queue_envelope(
                "events_api",
                {"type": "event_callback", "team_id": TEAM_ID, "event": live(after)},
            )
            await standin.wait_for_ack(env)

            async def all_in() -> bool:
                return len(await stored_ids(run.engine)) == 42

            await until(all_in)
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_events_api_retries_of_one_event_are_stored_once_and_all_acked(
    tmp_path: Path,
) -> None:
    standin = await new_standin().start()
    try:
        run = await start(standin, tmp_path)
        try:
            msg = standin.add_message(GENERAL, "retried delivery", user="U1", at=T0)
            statuses = [
                await run.post(live(msg), event_id="EvRETRY", retry=retry) for retry in (None, 1, 2)
            ]
            assert statuses == [200, 200, 200]
            assert await stored_ids(run.engine) == [msg["ts"]]
            counts = await run.engine.store.messages.counts()
            assert counts["messages"] == 1
            handled = run.adapter.dispatcher.stats.handled
            assert handled["message_stored"] == 1 and handled["message_duplicate"] == 2
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_windows_follow_a_thread_across_them_and_resume_from_a_cursor(
    tmp_path: Path,
) -> None:
    """A 30-day range in 7-day windows: a thread started in the first window and answered in
    the third is followed there; a fetch stopped after the first window resumes from its
    last message and, with a lookback reaching the thread's start, still gets its replies."""
    from slack_sdk.web.async_client import AsyncWebClient

    day = 86400
    base = int(time.time()) - 30 * day
    standin = await new_standin().start()
    try:
        top = [
            standin.add_message(GENERAL, f"day {d}", user="U1", at=base + d * day + 60)
            for d in range(0, 30, 2)
        ]
        parent = top[0]
        replies = [
            standin.add_message(
                GENERAL, f"answer {d}", user="U2", at=base + d * day + 120, thread_ts=parent["ts"]
            )
            for d in (3, 17)
        ]
        everything = sorted([*top, *replies], key=lambda m: float(m["ts"]))

        def history(lookback: float) -> SlackHistory:
            return SlackHistory(
                AsyncWebClient(token="xoxb-t", base_url=standin.base_url),
                window_s=7 * day,
                thread_lookback_s=lookback,
            )

        got = [
            e.message_id
            async for p in history(0).pages(SCOPE, after_id=None, after_ts=base)
            for e in p
        ]
        assert got == [m["ts"] for m in everything]
        rep = [a for m, a in standin.calls if m == "conversations.replies"]
        # asked in each window up to the one holding its latest reply (day 17: the third)
        assert len(rep) == 3 and all(a["ts"] == parent["ts"] for a in rep)

        # stop after the first window's page, resume from its newest message
        first_pages: list[list[str]] = []
        async for p in history(0).pages(SCOPE, after_id=None, after_ts=base):
            first_pages.append([e.message_id for e in p])
            break
        cursor = first_pages[0][-1]
        assert first_pages[0] == [m["ts"] for m in everything if float(m["ts"]) < base + 7 * day]
        calls = len(standin.calls)
        rest = [
            e.message_id
            async for p in history(30 * day).pages(SCOPE, after_id=cursor, after_ts=None)
            for e in p
        ]
        assert first_pages[0] + rest == [m["ts"] for m in everything]
        assert float(history_calls(standin, calls)[0]["oldest"]) == float(cursor) - 30 * day
    finally:
        await standin.close()
