"""`speakermem demo`: the shipped conversation, its load through the dispatcher, its answers."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from speakermem.bot.events import DeleteEvent, EditEvent, MessageEvent, RosterAction, RosterEvent
from speakermem.bot.settings import Settings
from speakermem.integrations.embeddings import minilm
from speakermem.integrations.embeddings.minilm import EmbedderUnavailable
from speakermem.integrations.shell import demo
from speakermem.integrations.shell.commands import run_demo
from speakermem.integrations.shell.session import local_bot
from tests.llm_server import LLMServer


def _minilm_installed() -> bool:
    try:
        minilm.locate_model_dir()
    except EmbedderUnavailable:
        return False
    return True


def settings_for(tmp_path: Path, **extra: object) -> Settings:
    values: dict[str, object] = {"db_path": tmp_path / "demo.db", "embedder": "none"}
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


@pytest.fixture(scope="module")
def conv() -> demo.DemoConversation:
    return demo.load_conversation()


# ---- the data has what the issue asks for -----------------------------------------------


def test_demo_conversation_shape(conv: demo.DemoConversation) -> None:
    events = demo.to_events(conv)
    messages = [e for e in events if isinstance(e, MessageEvent)]
    assert 5 <= len(conv.people) <= 6
    assert 200 <= len(messages) <= 300
    days = {m.ts.date() for m in messages}
    assert 12 <= (max(days) - min(days)).days + 1 <= 16  # about two weeks
    assert {c.private for c in conv.channels} == {True, False}
    assert {m.scope.channel for m in messages} == {c.id for c in conv.channels}
    assert len({m.speaker_id for m in messages}) == len(conv.people)

    # a person who joins late: their join comes days after the first message, none before
    first = min(m.ts for m in messages)
    joins = {e.user_id: e.at for e in events if isinstance(e, RosterEvent) and e.action == "join"}
    late = [uid for uid, at in joins.items() if (at - first).days >= 5]
    assert late
    for uid in late:
        assert all(m.ts >= joins[uid] for m in messages if m.speaker_id == uid)

    # an alias, registered and used in the text by others
    aliases = [e for e in events if isinstance(e, RosterEvent) and e.action is RosterAction.ALIAS]
    assert aliases
    alias = aliases[0]
    assert any(alias.name in m.text and m.speaker_id != alias.user_id for m in messages)

    # a thread: replies point at an earlier message of the same channel
    ids = {m.message_id: m for m in messages}
    replies = [m for m in messages if m.thread_id]
    assert len(replies) >= 3
    assert all(r.thread_id in ids and ids[r.thread_id].ts < r.ts for r in replies)
    assert len({r.speaker_id for r in replies}) >= 3

    # one edited and one deleted message, both of messages that exist before the change
    edits = [e for e in events if isinstance(e, EditEvent)]
    deletes = [e for e in events if isinstance(e, DeleteEvent)]
    assert len(edits) >= 1 and len(deletes) >= 1
    assert all(e.message_id in ids and ids[e.message_id].ts < e.edited_at for e in edits)
    assert all(d.message_id in ids for d in deletes)
    # events are in time order (the ingest path sees them as a platform would send them)
    times = [
        getattr(e, "ts", None) or getattr(e, "at", None) or getattr(e, "edited_at", None)
        for e in events
    ]
    stamped = [t for t in times if t is not None]
    assert stamped == sorted(stamped)


def test_examples_are_supported_by_the_messages_they_cite(conv: demo.DemoConversation) -> None:
    by_id = {m.message_id: m for m in demo.to_events(conv) if isinstance(m, MessageEvent)}
    assert len(conv.examples) == 3
    opinion, decisions, alias = conv.examples
    # "what did Alice think of Bob's plan": Alice's own message about Bob's plan
    (cite,) = opinion.cites
    assert by_id[cite].speaker_name == "Alice" and "Bob's" in by_id[cite].text
    # a decision that changed twice: three decisions on three different days
    days = {by_id[c].ts.date() for c in decisions.cites}
    assert len(decisions.cites) == 3 and len(days) == 3
    assert all("launch date" in by_id[c].text.lower() for c in decisions.cites)
    # asked by alias: the cited proposal is Bob's, and the question says Bobby
    assert "Bobby" in alias.question and by_id[alias.cites[0]].speaker_id == "bob"
    for ex in conv.examples:
        assert ex.asker in {p.id for p in conv.people}


# ---- the demo runs through the real ingest path and answers with the right citations ----


@pytest.mark.slow
@pytest.mark.parametrize(
    "embedder",
    [
        "none",
        pytest.param(
            "minilm",
            marks=pytest.mark.skipif(not _minilm_installed(), reason="MiniLM weights absent"),
        ),
    ],
)
async def test_demo_answers_cite_the_supporting_messages(tmp_path: Path, embedder: str) -> None:
    out = io.StringIO()
    async with local_bot(settings_for(tmp_path, embedder=embedder), background=False) as bot:
        answers = await run_demo(bot, out)
        assert len(answers) == 3
        for ex, result in answers:
            cited = [c.message_id for c in result.answer.citations]
            assert set(ex.cites) <= set(cited), (ex.question, cited)
            assert not result.answer.refused
        # edits and deletes went through as events
        edited = await bot.engine.store.messages.by_ids(demo_scope(bot), ["g050"])
        assert "Thursday, not Wednesday" in edited["g050"].text
        counts = await bot.engine.store.messages.counts()
        assert counts == {**counts, "messages": 226, "deleted": 1}
        hits = await bot.engine.search("staging key stg_4f9a8c21e7b0d3a6", [demo_scope(bot)])
        assert all("stg_4f9a" not in h.message.text for h in hits)
    text = out.getvalue()
    assert "Loaded 227 messages, 1 edit, 1 delete" in text
    assert "No LLM is configured, so the Writer does not run on new messages" in text
    assert "SPEAKERMEM_LLM_BASE_URL" in text
    assert text.count("explain: read as issue") == 3
    assert "[1] Alice · #general · Tue 2025-03-04 09:55 · id g033" in text


def demo_scope(bot: object) -> demo.Scope:
    return demo.load_conversation().scope("general")


async def test_demo_without_an_llm_replays_its_written_records(tmp_path: Path) -> None:
    conv = demo.load_conversation()
    out = io.StringIO()
    async with local_bot(settings_for(tmp_path), background=False) as bot:
        await run_demo(bot, out)
        store = bot.engine.store
        general = await bot.engine.channel_pks([conv.scope("general")])
        leads = await bot.engine.channel_pks([conv.scope("leads")])
        heads = await store.records.heads(general)
        private = await store.records.heads(leads)
        chains = await store.records.chains([h.id for h in heads])
    # every scripted record passed the Writer's checks: one head per record, chains for updates
    assert len(heads) == sum(r.channel == "general" for r in conv.records)
    assert len(private) == sum(r.channel == "leads" for r in conv.records)
    assert {h.writer_model for h in heads + private} == {demo.SCRIPTED_WRITER}
    assert {h.owner for h in heads} >= {p.id for p in conv.people} | {"GROUP"}
    launch = next(h for h in heads if h.event == "launch date")
    assert chains[launch.id][0].content.startswith("The team launches Atlas 2.0")
    assert len(chains[launch.id]) == 3 and "April 11" in launch.content
    assert set(launch.from_ids) == {"g164", "g165"}
    total = len(heads) + len(private)
    assert f"Records: {total + 4} written with the demo (no LLM)" in out.getvalue()


async def test_demo_runs_again_without_duplicates(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    async with local_bot(settings, background=False) as bot:
        await run_demo(bot, io.StringIO())
        records = await bot.engine.store.records.counts()
    out = io.StringIO()
    async with local_bot(settings, background=False) as bot:
        await run_demo(bot, out)
        assert (await bot.engine.store.messages.counts())["messages"] == 226
        assert await bot.engine.store.records.counts() == records
    assert "Already loaded" in out.getvalue()
    assert "written with the demo" not in out.getvalue()


@pytest.mark.slow
async def test_demo_with_an_llm_runs_the_writer_over_every_segment(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    settings = settings_for(tmp_path, llm_base_url=llm_server.base_url, llm_model="test-model")
    out = io.StringIO()
    async with local_bot(settings, background=False) as bot:
        await run_demo(bot, out)
        segments = await bot.engine.store.segments.counts()
    done = segments["segments_done"]
    assert segments["segments_pending"] == 0 and segments["segments_open"] == 0 and done > 0
    text = out.getvalue()
    assert f"Writer: test-model at {llm_server.base_url}" in text
    assert f"from {done} segments" in text
    writer_calls = [
        r for r in llm_server.requests if "writer_actions" in str(r.get("response_format"))
    ]
    assert len(writer_calls) >= done


@pytest.mark.e2e
def test_speakermem_demo_no_input(tmp_path: Path) -> None:
    env = {**os.environ, "SPEAKERMEM_EMBEDDER": "none", "SPEAKERMEM_LLM_BASE_URL": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "speakermem.integrations.cli.main", "demo", "--no-input"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "speakermem-demo.db").exists()  # the default demo database
    assert Counter(line[:14] for line in proc.stdout.splitlines())["--- example 1:"] == 1
    assert "--no-input: the shell is not opened" in proc.stdout
