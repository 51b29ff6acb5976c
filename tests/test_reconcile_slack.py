"""Reconciliation after downtime on Slack, through the Web API stand-in: messages deleted and
edited while the bot was down are forgotten / edited after the restart; a rate-capped history
is reconciled newest first and `status` reports what was left; deleted channels go."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.governance_commands import render_status
from speakermem.bot.settings import Settings
from speakermem.integrations.slack.adapter import SlackAdapter
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Layer, NewRecord, RecordScope
from speakermem.memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn
from tests.test_governance_forget import fts_hits, table_scan
from tests.test_reliability_slack_catchup import (
    GENERAL,
    SCOPE,
    SECRET,
    Run,
    new_standin,
)

pytestmark = [pytest.mark.contract, pytest.mark.e2e]

T0 = int(time.time()) - 2 * 3600
WORDS = (
    "zorblatt",
    "quixvane",
    "mervolin",
    "plimwick",
    "dravenox",
    "tessaloon",
    "brindlewax",
    "crumhorn",
    "fennimax",
    "gorvathi",
    "hollowick",
    "jintrabe",
)


async def start(
    standin: SlackApiStandIn,
    tmp_path: Path,
    *,
    thread_lookback_s: float = 24 * 3600.0,
    **settings: Any,
) -> Run:
    engine = await MemoryEngine.open(make_config(tmp_path), embedder=HashEmbedder())
    adapter = SlackAdapter(
        Settings(
            db_path=tmp_path / "unused.db",
            slack_bot_token="xoxb-test-token",  # type: ignore[arg-type]
            slack_signing_secret=SECRET,  # type: ignore[arg-type]
            slack_mode="http",
            slack_http_host="127.0.0.1",
            slack_http_port=0,
            slack_api_url=standin.base_url,
            **settings,
        ),
        Dispatcher(engine, RecallPipeline(engine)),
        engine,
        process_before_response=True,
        thread_lookback_s=thread_lookback_s,
    )
    await adapter.start()
    return Run(standin, engine, adapter)


async def until(predicate: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polling
            await asyncio.sleep(0.05)


async def wait_pass(run: Run) -> None:
    assert run.adapter.catchup is not None
    await run.adapter.catchup.wait()


async def live_text(engine: MemoryEngine, message_id: str) -> str | None:
    got = await engine.store.messages.get(SCOPE, message_id)
    return None if got is None or got.deleted else got.text


async def recall_text(engine: MemoryEngine, question: str) -> str:
    try:
        result = await RecallPipeline(engine).run(RecallRequest(question, SCOPE))
    except AccessDenied:
        return ""
    rows = " ".join(rr.record.content for r in result.rows for rr in r.records)
    excerpts = " ".join(e.text for e in result.pack.excerpts)
    return f"{result.answer.text} {rows} {excerpts}".casefold()


def record(content: str, from_ids: tuple[str, ...], owner: str) -> NewRecord:
    return NewRecord(
        layer=Layer.PROFILE,
        record_scope=RecordScope.PERSON,
        content=content,
        source=owner,
        owner=owner,
        event="",
        time=datetime.fromtimestamp(T0, UTC),
        session_id=0,
        from_ids=from_ids,
        writer_model="test",
        prompt_version="t1",
    )


def reconcile_entries(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in status["catchup"] if e["kind"] == "reconcile"]


async def post_all(run: Run, msgs: list[dict[str, Any]], channel: str = GENERAL) -> None:
    for msg in msgs:
        event = {**msg, "channel": channel, "channel_type": "channel"}
        assert await run.post(event, event_id=f"Ev{msg['ts']}") == 200


def notes(standin: SlackApiStandIn, n: int, channel: str = GENERAL) -> list[dict[str, Any]]:
    """`n` top-level messages, one word of WORDS each, Alice and Bob in turn, a second apart."""
    return [
        standin.add_message(
            channel,
            f"note {i}: the {WORDS[i % len(WORDS)]} plan",
            user="U1" if i % 2 == 0 else "U2",
            at=T0 + i,
        )
        for i in range(n)
    ]


async def test_messages_deleted_and_edited_while_down_are_reconciled_after_restart(
    tmp_path: Path,
) -> None:
    standin = await new_standin().start()
    try:
        top = notes(standin, 9)
        parent = top[8]
        replies = [
            standin.add_message(
                GENERAL,
                f"reply {j}: the {WORDS[9 + j]} idea",
                user="U2",
                at=T0 + 20 + j,
                thread_ts=parent["ts"],
            )
            for j in range(3)
        ]
        run = await start(standin, tmp_path)
        try:
            await post_all(run, [*top, *replies])
            await run.engine.embed_pending()
            # what the Writer would have derived from the messages about to be deleted
            recs = [
                record(f"Alice has a {WORDS[0]}", (top[0]["ts"],), "U1"),
                record(f"Bob plans the {WORDS[1]}", (top[1]["ts"],), "U2"),
                record(f"Bob has an idea about the {WORDS[9]}", (replies[0]["ts"],), "U2"),
            ]
            embedder = HashEmbedder()
            await run.engine.store.records.add_records(
                SCOPE, recs, embedder.embed_sync([r.content for r in recs])
            )
            assert await fts_hits(run.engine, WORDS[0])
        finally:
            await run.stop()

        # while the bot is down: 5 deleted (a thread's parent and one of its replies among
        # them), 5 edited (a reply among them); a note and a reply stay as they were
        deleted = [top[0], top[1], top[2], parent, replies[0]]
        edited = [top[3], top[4], top[5], top[6], replies[1]]
        new_words = ("vantablur", "snorkwell", "pemmicor", "yarrowin", "kestrolin")
        for msg in deleted:
            standin.delete_message(GENERAL, msg["ts"])
        for k, msg in enumerate(edited):
            standin.edit_message(
                GENERAL, msg["ts"], f"edited {k}: the {new_words[k]} now", at=T0 + 600 + k
            )
        gone_words = (WORDS[0], WORDS[1], WORDS[2], WORDS[8], WORDS[9])
        old_words = (WORDS[3], WORDS[4], WORDS[5], WORDS[6], WORDS[10])

        run = await start(standin, tmp_path)
        try:
            await wait_pass(run)
            engine = run.engine
            # deleted: the text is gone from the store, FTS, vectors, records and /recall
            for msg in deleted:
                assert await live_text(engine, msg["ts"]) is None
            gone_ids = {m["ts"] for m in deleted}
            for word in gone_words:
                assert await fts_hits(engine, word) == [], word
                assert await table_scan(engine, word) == [], word
                dense = await engine.search(word, [SCOPE], mode="dense", limit=50)
                assert not {h.message.message_id for h in dense} & gone_ids, word
                assert word not in await recall_text(engine, f"who has the {word}?"), word
            assert (await engine.store.records.counts())["records"] == 0
            # edited: the new text, the old words no longer found
            for k, msg in enumerate(edited):
                assert await live_text(engine, msg["ts"]) == f"edited {k}: the {new_words[k]} now"
                assert await fts_hits(engine, old_words[k]) == [], old_words[k]
                assert await fts_hits(engine, new_words[k]), new_words[k]
            # the rest as it was
            assert await live_text(engine, top[7]["ts"]) == top[7]["text"]
            assert await live_text(engine, replies[2]["ts"]) == replies[2]["text"]

            # the thread's replies were asked for, over the window
            rep = [a for m, a in standin.calls if m == "conversations.replies"]
            assert rep and all(a["ts"] == parent["ts"] for a in rep)

            # one audit receipt for the run, with counts and no text
            gov = Governance(engine)
            (entry,) = [
                e for e in await gov.audit(20, platform="slack") if e["action"] != "edit-recheck"
            ]
            assert entry["action"] == "platform-reconcile" and entry["actor"] == "reconcile"
            assert entry["receipt"]["messages"] == 5
            assert entry["receipt"]["messages_edited"] == 5
            assert entry["receipt"]["records"] == 3
            assert entry["args"]["deleted"] == 5 and entry["args"]["edited"] == 5
            assert not any(w in str(entry) for w in (*gone_words, *old_words))

            # status: the channel's reconciliation, finished
            status = await gov.status("slack", TEAM_ID)
            (rec,) = reconcile_entries(status)
            assert rec["finished"] and rec["detail"]["unchecked"] == 0
            shown = render_status(status).text
            assert "reconcile: #cgeneral reconciled 12 messages back to" in shown
            assert "5 deleted, 5 edited" in shown
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_a_rate_capped_history_is_reconciled_newest_first_and_status_reports_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    standin = await new_standin().start()
    try:
        posted = notes(standin, 40)
        run = await start(standin, tmp_path)
        try:
            await post_all(run, posted)
        finally:
            await run.stop()
        old_gone, new_gone = [posted[1], posted[3]], [posted[30], posted[38]]
        for msg in (*old_gone, *new_gone):
            standin.delete_message(GENERAL, msg["ts"])

        # Slack's cap for some apps: a history call per interval (2 s here for a quick test;
        # a minute on Slack), 15 messages a page; the run may spend 3 s on the channel
        standin.cap_history(interval_s=2, page=15)
        caplog.set_level(logging.INFO, logger="speakermem.bot.reconcile")
        run = await start(standin, tmp_path, reconcile_budget_s=3.0)
        try:
            await wait_pass(run)
            engine = run.engine
            # the newest page (the platform's newest 15: posted[23..39] less the two deleted)
            # was checked: its deletions are applied; the older part was not
            for msg in new_gone:
                assert await live_text(engine, msg["ts"]) is None
            for msg in old_gone:
                assert await live_text(engine, msg["ts"]) == msg["text"]
            status = await Governance(engine).status("slack", TEAM_ID)
            (rec,) = reconcile_entries(status)
            detail = rec["detail"]
            assert not rec["finished"]
            assert detail["checked"] == 17 and detail["deleted"] == 2
            assert detail["unchecked"] == 23  # posted[0..22], the two deleted among them
            assert detail["stopped"] == "rate limited: asked to wait 2 s"
            (_lo, hi), *_ = detail["todo"]
            assert hi < float(posted[23]["ts"]) and float(posted[22]["ts"]) <= hi
            line = render_status(status).text
            assert (
                "reconcile: #cgeneral reconciled the newest 17 messages: 2 deleted; 23 older"
                in (line)
            )
            assert "not checked (rate limited: asked to wait 2 s); the next start resumes" in line
            assert any(
                r.levelno == logging.WARNING and "23 older" in r.getMessage()
                for r in caplog.records
            )
        finally:
            await run.stop()

        # the limit lifted, the next start checks the rest too
        standin.cap_history(interval_s=0, page=1000)
        run = await start(standin, tmp_path, reconcile_budget_s=3.0)
        try:
            await wait_pass(run)
            for msg in old_gone:
                assert await live_text(run.engine, msg["ts"]) is None
            status = await Governance(run.engine).status("slack", TEAM_ID)
            (rec,) = reconcile_entries(status)
            assert rec["finished"] and rec["detail"]["unchecked"] == 0
            assert rec["detail"]["deleted"] == 2  # this run's: the two older ones
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_lookback_zero_turns_reconciliation_off(tmp_path: Path) -> None:
    standin = await new_standin().start()
    try:
        posted = notes(standin, 3)
        run = await start(standin, tmp_path)
        try:
            await post_all(run, posted)
        finally:
            await run.stop()
        standin.delete_message(GENERAL, posted[0]["ts"])

        calls = len(standin.calls)
        run = await start(standin, tmp_path, reconcile_lookback_s=0)
        try:
            await wait_pass(run)
            assert await live_text(run.engine, posted[0]["ts"]) == posted[0]["text"]
            inclusive = [a for m, a in standin.calls[calls:] if a.get("inclusive") == "1"]
            assert inclusive == []
        finally:
            await run.stop()

        run = await start(standin, tmp_path)  # the default looks back a day
        try:
            await wait_pass(run)
            assert await live_text(run.engine, posted[0]["ts"]) is None
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_deleted_channels_are_forgotten_live_and_after_downtime(tmp_path: Path) -> None:
    users = new_standin().users
    standin = await SlackApiStandIn(
        users=users,
        members={GENERAL: ["U1", "U2"], "CRANDOM": ["U1", "U2"], "GPRIVATE": ["U1"]},
        private={"GPRIVATE"},
    ).start()
    try:
        general = notes(standin, 3)
        random = notes(standin, 2, "CRANDOM")
        private = notes(standin, 2, "GPRIVATE")
        run = await start(standin, tmp_path)
        try:
            await post_all(run, general)
            await post_all(run, random, "CRANDOM")
            await post_all(run, private, "GPRIVATE")
            await run.engine.embed_pending()
            # the channel_deleted / group_deleted events (channels:read / groups:read)
            for i, (kind, channel) in enumerate(
                (("channel_deleted", "CRANDOM"), ("group_deleted", "GPRIVATE"))
            ):
                assert await run.post({"type": kind, "channel": channel}, event_id=f"Del{i}") == 200
            for channel, msgs in (("CRANDOM", random), ("GPRIVATE", private)):
                scope = SCOPE.model_copy(update={"channel": channel})
                for msg in msgs:
                    got = await run.engine.store.messages.get(scope, msg["ts"])
                    assert got is not None and got.deleted and got.text == ""
            assert await live_text(run.engine, general[0]["ts"]) == general[0]["text"]
            actions = [e["action"] for e in await Governance(run.engine).audit(10)]
            assert actions.count("platform-channel-delete") == 2
        finally:
            await run.stop()

        # #general is deleted while the bot is down: history and info say channel_not_found
        standin.delete_channel(GENERAL)
        run = await start(standin, tmp_path)
        try:
            await wait_pass(run)
            for msg in general:
                assert await live_text(run.engine, msg["ts"]) is None
            for word in (WORDS[0], WORDS[1], WORDS[2]):
                assert await table_scan(run.engine, word) == [], word
            status = await Governance(run.engine).status("slack", TEAM_ID)
            rec = next(e for e in reconcile_entries(status) if e["channel"].endswith(GENERAL))
            assert rec["detail"]["channel_gone"]
            assert "was deleted on the platform" in render_status(status).text
            assert not await Governance(run.engine).channel_enabled(SCOPE)  # memory off
            infos = [a for m, a in standin.calls if m == "conversations.info"]
            assert any(a.get("channel") == GENERAL for a in infos)
        finally:
            await run.stop()
    finally:
        await standin.close()


async def test_a_slow_reconciliation_does_not_hold_up_the_next_catch_up(tmp_path: Path) -> None:
    """Reconciliation runs in a task of its own: while it is stuck on a slow history read, a
    Socket Mode reconnect's catch-up goes ahead and stores what was missed."""
    standin = await new_standin().start()
    try:
        posted = notes(standin, 5)
        reply = standin.add_message(
            GENERAL, "a reply", user="U2", at=T0 + 10, thread_ts=posted[4]["ts"]
        )
        run = await start(standin, tmp_path)
        try:
            await post_all(run, [*posted, reply])
        finally:
            await run.stop()
        # the thread's read (reconciliation's; catch-up without thread lookback makes none)
        # hangs until released
        entered, release = standin.hold("conversations.replies")
        run = await start(standin, tmp_path, thread_lookback_s=0)
        try:
            assert run.adapter.catchup is not None
            reconcile = run.adapter.catchup.catchup.reconcile
            assert reconcile is not None
            await asyncio.wait_for(entered.wait(), 20)
            missed = standin.add_message(GENERAL, "sent while the socket was down", user="U2")
            await run.adapter.catchup.on_reconnect()  # what the socket listener calls

            async def caught_up() -> bool:
                return await live_text(run.engine, missed["ts"]) is not None

            await until(caught_up)
            assert reconcile.running  # still at it: the catch-up did not wait for it
            standin._holds.clear()
            release.set()
            await wait_pass(run)
            status = await Governance(run.engine).status("slack", TEAM_ID)
            (rec,) = reconcile_entries(status)
            assert rec["finished"] and rec["detail"]["unchecked"] == 0
        finally:
            standin._holds.clear()
            release.set()
            await run.stop()
    finally:
        await standin.close()
