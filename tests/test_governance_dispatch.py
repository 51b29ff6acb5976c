"""`/memory` through the real Dispatcher: parsing, admin refusal, confirmation tokens, hygiene,
the one-time notice and record access. Real store, real pipeline (no LLM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.commands import COMMANDS, MEMORY_SUBCOMMANDS
from speakermem.bot.dispatch import NOTICE_TEXT, Dispatcher
from speakermem.bot.events import CommandInvocation
from speakermem.bot.governance import (
    AliasChange,
    ChannelSwitch,
    CommandSyntaxError,
    ForgetMessage,
    ForgetUser,
    Help,
    OptOut,
    PendingActions,
    RetentionSet,
    is_destructive,
    parse_memory_command,
)
from speakermem.memory.config import GovernanceConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import visible_records
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import make_config, msg
from tests.fakes import HashEmbedder
from tests.test_governance_forget import GENERAL, SECRET, rec

pytestmark = pytest.mark.contract

# ---- the parser (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", Help()),
        ("help", Help()),
        ("channel off purge", ChannelSwitch(on=False, purge=True)),
        ("channel on", ChannelSwitch(on=True)),
        ("retention 30", RetentionSet(days=30)),
        ("retention 7d workspace", RetentionSet(days=7, workspace=True)),
        ("retention off workspace", RetentionSet(days=None, workspace=True)),
        ("opt-out forget", OptOut(forget=True)),
    ],
)
def test_parser_reads_the_documented_forms(line: str, expected: object) -> None:
    assert parse_memory_command(line) == expected


def test_parser_user_and_message_references() -> None:
    cmd = parse_memory_command("alias add <@U1|bob> Bobby B")
    assert isinstance(cmd, AliasChange)
    assert (cmd.add, cmd.user.kind, cmd.user.value, cmd.user.label, cmd.alias) == (
        True,
        "id",
        "U1",
        "bob",
        "Bobby B",
    )
    cmd2 = parse_memory_command("forget user <@!123456789>")
    assert isinstance(cmd2, ForgetUser) and cmd2.user.value == "123456789"
    by_name = parse_memory_command("forget user @bob smith")
    assert isinstance(by_name, ForgetUser)
    assert (by_name.user.kind, by_name.user.value) == ("name", "bob smith")
    link = parse_memory_command("forget message https://discord.com/channels/11/22/33")
    assert isinstance(link, ForgetMessage)
    assert (link.ref.workspace, link.ref.channel, link.ref.message_id) == ("11", "22", "33")
    slack = parse_memory_command(
        "forget message <https://acme.slack.com/archives/C0ABC/p1700000000123456>"
    )
    assert isinstance(slack, ForgetMessage)
    assert (slack.ref.channel, slack.ref.message_id) == ("C0ABC", "1700000000.123456")
    thread = parse_memory_command(
        "forget message https://acme.slack.com/archives/C0ABC/p1700000001000100"
        "?thread_ts=1700000000.123456&cid=C0ABC"
    )
    assert isinstance(thread, ForgetMessage) and thread.ref.message_id == "1700000001.000100"


@pytest.mark.parametrize(
    ("line", "hint"),
    [
        ("channel maybe", "on or off"),
        ("channel on purge", "only `off` takes `purge`"),
        ("retention soon", "not a number"),
        ("retention 0", "1 to"),
        ("forget", "forget what"),
        ("forget message https://example.com/x", "cannot read that link"),
        ("status now", "takes no arguments"),
        ("frobnicate", "unknown subcommand"),
        ("alias add @bob", "alias add"),
    ],
)
def test_parser_errors_say_what_was_expected(line: str, hint: str) -> None:
    with pytest.raises(CommandSyntaxError, match=hint):
        parse_memory_command(line)


def test_one_table_says_admin_only_and_destructive() -> None:
    names = {s.name for s in MEMORY_SUBCOMMANDS}
    assert {
        "channel",
        "retention",
        "alias",
        "forget",
        "export",
        "status",
        "audit",
        "mine",
        "opt-out",
        "opt-in",
        "forget-me",
        "help",
    } == names
    assert "memory" in {c.name for c in COMMANDS}
    admin = {s.name for s in MEMORY_SUBCOMMANDS if s.admin_only}
    assert admin == {"channel", "retention", "alias", "forget", "export", "status", "audit"}
    assert is_destructive(parse_memory_command("channel off purge"))
    assert not is_destructive(parse_memory_command("channel off"))
    assert is_destructive(parse_memory_command("forget-me"))
    assert not is_destructive(parse_memory_command("opt-out"))


def test_confirmation_tokens_are_single_use_user_bound_and_expire() -> None:
    pending = PendingActions(ttl_s=60)
    action = pending.add(
        user_id="u1",
        platform="p",
        workspace="w",
        command=Help(),
        context={},
        admin_required=True,
        now=1000.0,
    )
    assert "only the person" in str(pending.take(action.token, user_id="u2", now=1001.0))
    assert pending.take(action.token, user_id="u1", now=1002.0) is action
    assert "expired or was already used" in str(pending.take(action.token, user_id="u1"))
    late = pending.add(
        user_id="u1",
        platform="p",
        workspace="w",
        command=Help(),
        context={},
        admin_required=True,
        now=1000.0,
    )
    assert "expired" in str(pending.take(late.token, user_id="u1", now=1061.0))


# ---- through the dispatcher -------------------------------------------------------------


def inv(
    text: str, *, user: str = "alice", admin: bool = False, scope: Scope = GENERAL
) -> CommandInvocation:
    return CommandInvocation(scope=scope, command="memory", user_id=user, text=text, is_admin=admin)


def dispatcher(engine: MemoryEngine, **cfg: object) -> Dispatcher:
    """The governance settings go to the engine: its admission gate is the one that decides
    (the service reads the same config)."""
    engine.config = engine.config.model_copy(
        update={"governance": GovernanceConfig(**cfg)}  # type: ignore[arg-type]
    )
    return Dispatcher(engine, RecallPipeline(engine), governance=Governance(engine))


async def stored(engine: MemoryEngine) -> set[str]:
    rows = await engine.store.db.read("SELECT message_id FROM messages WHERE deleted_at IS NULL")
    return {r[0] for r in rows}


async def test_admin_commands_refuse_members_and_run_for_admins(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    await d.handle(msg(GENERAL, "m1", "Alice", "hello there", 0))
    for line in (
        "status",
        "audit",
        "channel off",
        "retention 30",
        "forget user bob",
        "export user alice",
        "alias add alice Ally",
    ):
        reply = await d.memory_command(inv(line, admin=False))
        assert reply.refused and "for workspace admins" in reply.text and reply.ephemeral, line
    assert await engine.store.db.read("SELECT * FROM channel_policy WHERE enabled = 0") == []
    status = await d.memory_command(inv("status", admin=True))
    assert not status.refused and status.ephemeral
    assert status.data is not None and status.data["status"]["messages"] == 1
    assert "LLM: not configured" in status.text
    help_member = await d.memory_command(inv("help"))
    assert "/memory mine" in help_member.text and "/memory status" not in help_member.text
    help_admin = await d.memory_command(inv("", admin=True))
    assert "/memory status" in help_admin.text
    bad = await d.memory_command(inv("retention forever-and-ever", admin=True))
    assert bad.refused and "/memory help" in bad.text


async def test_channel_off_stops_ingestion_and_recall_then_on_restores(
    engine: MemoryEngine,
) -> None:
    d = dispatcher(engine)
    await d.handle(msg(GENERAL, "m1", "Alice", "the budget is approved", 0))
    reply = await d.memory_command(inv("channel off", admin=True))
    assert not reply.refused and "off" in reply.text
    await d.handle(msg(GENERAL, "m2", "Bob", "the budget moved to May", 1))
    assert await stored(engine) == {"m1"}
    answer = await d.recall(
        CommandInvocation(
            scope=GENERAL, command="recall", user_id="alice", text="what about the budget?"
        )
    )
    assert answer.refused and "off" in answer.text
    # the pipeline itself refuses too (fail closed for any caller)
    with pytest.raises(PermissionError):
        await RecallPipeline(engine).run(RecallRequest("budget?", GENERAL))
    await d.memory_command(inv("channel on", admin=True))
    await d.handle(msg(GENERAL, "m3", "Bob", "budget final", 2))
    assert await stored(engine) == {"m1", "m3"}
    answer = await d.recall(
        CommandInvocation(
            scope=GENERAL, command="recall", user_id="alice", text="what about the budget?"
        )
    )
    assert not answer.refused


async def test_default_off_setting_keeps_new_channels_off(engine: MemoryEngine) -> None:
    d = dispatcher(engine, channel_default_enabled=False)
    await d.handle(msg(GENERAL, "m1", "Alice", "hello", 0))
    assert await stored(engine) == set()
    await d.memory_command(inv("channel on", admin=True))
    await d.handle(msg(GENERAL, "m2", "Alice", "hello again", 1))
    assert await stored(engine) == {"m2"}


async def test_opt_out_stops_storing_and_opt_in_restores(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    await d.handle(msg(GENERAL, "m1", "Carol", "first words", 0))
    reply = await d.memory_command(inv("opt-out", user="carol"))
    assert not reply.refused and reply.confirm is None
    await d.handle(msg(GENERAL, "m2", "Carol", "second words", 1))
    await d.handle(msg(GENERAL, "m3", "Bob", "bob speaks", 2))
    assert await stored(engine) == {"m1", "m3"}
    assert d.stats.ignored["opted_out"] == 1
    await d.memory_command(inv("opt-in", user="carol"))
    await d.handle(msg(GENERAL, "m4", "Carol", "third words", 3))
    assert await stored(engine) == {"m1", "m3", "m4"}
    # bot messages are never stored
    await d.handle(msg(GENERAL, "m5", "Bot", "beep", 4, speaker_is_bot=True))
    assert "m5" not in await stored(engine)


async def test_destructive_commands_confirm_first(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    for i, who in enumerate(("Alice", "Bob", "Alice")):
        await d.handle(msg(GENERAL, f"m{i}", who, f"words number {i}", i))
    ask = await d.memory_command(inv("forget user <@bob>", user="admin1", admin=True))
    assert ask.confirm is not None and "Forget" in ask.confirm.summary
    assert await stored(engine) == {"m0", "m1", "m2"}  # nothing done yet
    # another user cannot press it; a cancel does nothing
    other = await d.confirm(ask.confirm.token, user_id="admin2", is_admin=True, accept=True)
    assert other.refused and await stored(engine) == {"m0", "m1", "m2"}
    # admin is re-checked at confirm time
    demoted = await d.confirm(ask.confirm.token, user_id="admin1", is_admin=False, accept=True)
    assert demoted.refused and "no longer an admin" in demoted.text
    assert await stored(engine) == {"m0", "m1", "m2"}
    # the token was used up by that attempt
    used = await d.confirm(ask.confirm.token, user_id="admin1", is_admin=True, accept=True)
    assert used.refused
    again = await d.memory_command(inv("forget user <@bob>", user="admin1", admin=True))
    assert again.confirm is not None
    cancel = await d.confirm(again.confirm.token, user_id="admin1", is_admin=True, accept=False)
    assert "nothing was changed" in cancel.text.lower()
    again = await d.memory_command(inv("forget user <@bob>", user="admin1", admin=True))
    assert again.confirm is not None
    done = await d.confirm(again.confirm.token, user_id="admin1", is_admin=True, accept=True)
    assert not done.refused and done.data is not None
    assert done.data["receipt"]["counts"]["messages"] == 1
    assert await stored(engine) == {"m0", "m2"}
    (entry,) = (await d.memory_command(inv("audit", admin=True))).data["audit"]  # type: ignore[index]
    assert (entry["actor"], entry["action"], entry["target"]) == (
        "test:admin1",
        "forget-user",
        "bob",
    )
    # forget-me is for members, confirmed by the member
    me = await d.memory_command(inv("forget-me", user="alice"))
    assert me.confirm is not None
    done = await d.confirm(me.confirm.token, user_id="alice", is_admin=False, accept=True)
    assert not done.refused and await stored(engine) == set()


async def test_forget_message_by_link_and_ambiguous_names(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    discord = Scope(platform="discord", workspace="111", channel="222")
    await d.handle(msg(discord, "333", "Sam", "forget this one", 0))
    await d.handle(msg(discord, "334", "Sam", "keep this one", 1))
    link = "https://discord.com/channels/111/222/333"
    ask = await d.memory_command(inv(f"forget message {link}", admin=True, scope=discord))
    assert ask.confirm is not None
    done = await d.confirm(ask.confirm.token, user_id="alice", is_admin=True, accept=True)
    assert done.data is not None and done.data["receipt"]["counts"]["messages"] == 1
    assert await stored(engine) == {"334"}
    wrong = await d.memory_command(
        inv("forget message https://discord.com/channels/999/222/333", admin=True, scope=discord)
    )
    assert wrong.refused and "another workspace" in wrong.text
    missing = await d.memory_command(inv("forget message 999", admin=True, scope=discord))
    assert missing.refused and "no message" in missing.text
    # two members called Sam: a name is ambiguous, and the error lists both
    await d.handle(RosterEvent(scope=discord, action=RosterAction.JOIN, user_id="sam2", name="Sam"))
    amb = await d.memory_command(inv("export user Sam", admin=True, scope=discord))
    assert amb.refused and "sam" in amb.text and "sam2" in amb.text


async def test_alias_export_and_mine(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    await d.handle(msg(GENERAL, "a1", "Alice", "I adopted a greyhound", 0))
    await d.handle(msg(SECRET, "a2", "Alice", "secret hobby is falconry", 1))
    await engine.store.records.add_records(
        GENERAL, [rec("Alice adopted a greyhound", ("a1",), owner="alice", source="alice")], None
    )
    await engine.store.records.add_records(
        SECRET, [rec("Alice practises falconry", ("a2",), owner="alice", source="alice")], None
    )
    added = await d.memory_command(inv("alias add alice Ally", admin=True))
    assert not added.refused and "Ally" in added.text
    assert await engine.store.channels.find_user("test", "w1", "ally") == ["alice"]
    exported = await d.memory_command(inv("export user Ally", admin=True))
    assert exported.data is not None
    assert [m["message_id"] for m in exported.data["messages"]] == ["a1", "a2"]
    assert {r["content"] for r in exported.data["records"]} == {
        "Alice adopted a greyhound",
        "Alice practises falconry",
    }
    assert all(r["from_ids"] and r["chain"] for r in exported.data["records"])
    removed = await d.memory_command(inv("alias remove alice Ally", admin=True))
    assert "no longer" in removed.text
    # mine shows records from channels the member can read only, with links
    mine = await d.memory_command(
        CommandInvocation(
            scope=GENERAL,
            command="memory",
            user_id="alice",
            text="mine",
            readable_channels=("general",),
        )
    )
    assert "greyhound" in mine.text and "falconry" not in mine.text
    assert mine.data is not None and mine.data["records"][0]["links"] == [None]  # test platform


async def test_notice_is_posted_once_and_not_when_the_setting_is_off(
    tmp_path: Path, embedder: HashEmbedder
) -> None:
    for notice_on in (True, False):
        eng = await MemoryEngine.open(make_config(tmp_path / str(notice_on)), embedder)
        try:
            d = dispatcher(eng, channel_notice=notice_on)
            posted: list[tuple[Scope, str]] = []

            async def notify(scope: Scope, text: str, posted: list = posted) -> None:
                posted.append((scope, text))

            d.set_notifier("test", notify)
            for i in range(3):
                await d.handle(msg(GENERAL, f"m{i}", "Alice", f"hello {i}", i))
            await d.handle(msg(SECRET, "s1", "Alice", "psst", 5))
            await d.drain_notices()
            if notice_on:
                assert posted == [(GENERAL, NOTICE_TEXT), (SECRET, NOTICE_TEXT)]
                assert "opt-out" in NOTICE_TEXT
            else:
                assert posted == []
        finally:
            await eng.close()


async def test_the_notice_claim_is_one_write_per_channel_not_one_per_message(
    engine: MemoryEngine,
) -> None:
    """Claiming the notice is a write transaction; once this process knows a channel's
    notice is posted it stops asking (a restarted process asks once and finds it posted)."""
    claims: list[Scope] = []
    posted: list[Scope] = []

    async def notify(scope: Scope, text: str) -> None:
        posted.append(scope)

    for _restart in range(2):
        d = dispatcher(engine)
        claim = d.governance.claim_notice

        async def counting(scope: Scope, claim: Any = claim) -> bool:
            claims.append(scope)
            return bool(await claim(scope))

        d.governance.claim_notice = counting  # type: ignore[method-assign]
        d.set_notifier("test", notify)
        for i in range(20):
            await d.handle(msg(GENERAL, f"r{_restart}-{i}", "Alice", f"hello {i}", i))
            await d.drain_notices()
    assert posted == [GENERAL]
    assert claims == [GENERAL, GENERAL]  # once per process, not once per stored message
    assert len(await stored(engine)) == 40


async def test_a_failed_notice_is_retried(engine: MemoryEngine) -> None:
    d = dispatcher(engine)
    calls: list[Scope] = []

    async def flaky(scope: Scope, text: str) -> None:
        calls.append(scope)
        if len(calls) == 1:
            raise RuntimeError("missing permission")

    d.set_notifier("test", flaky)
    for i, text in enumerate(("one", "two", "three")):
        await d.handle(msg(GENERAL, f"m{i + 1}", "Alice", text, i))
        await d.drain_notices()
    assert calls == [GENERAL, GENERAL]
    assert await stored(engine) == {"m1", "m2", "m3"}


def test_a_record_shows_only_where_every_message_it_cites_is_readable() -> None:
    """The access rule on records' sources (channel pks): all readable, or not shown; a
    record with no live source left is not shown either (fail closed)."""
    sources = {1: {10}, 2: {10, 20}, 3: set()}
    assert visible_records(sources, {10}) == {1}
    assert visible_records(sources, {10, 20}) == {1, 2}
    assert visible_records(sources, {20}) == set()


async def test_a_record_from_a_private_channel_never_answers_elsewhere(
    engine: MemoryEngine,
) -> None:
    """With workspace-wide recall, a question in a public channel draws on the other public
    channels the asker reads, never on a private one: the record built from the private
    channel's messages stays there, even for someone who reads both."""
    engine.config = engine.config.model_copy(
        update={"recall": engine.config.recall.model_copy(update={"scope": "workspace"})}
    )
    await engine.ingest_many(
        [
            msg(GENERAL, "g1", "Alice", "I love sailing on weekends", 0),
            msg(SECRET, "s1", "Alice", "sailing to the secret island", 1),
        ]
    )
    # the adapters tell the store which channels are public (new ones count as private)
    await engine.store.channels.set_meta(GENERAL, name="general", is_private=False)
    (public,) = await engine.store.records.add_records(
        GENERAL,
        [rec("Alice loves sailing on weekends", ("g1",), owner="alice", source="alice")],
        None,
    )
    (private,) = await engine.store.records.add_records(
        SECRET,
        [rec("Alice loves sailing to the secret island", ("s1",), owner="alice", source="alice")],
        None,
    )

    async def shown(where: Scope, readers: list[str] | None) -> set[int]:
        readable = (
            None
            if readers is None
            else [Scope(platform="test", workspace="w1", channel=c) for c in readers]
        )
        result = await RecallPipeline(engine).run(
            RecallRequest(
                "what does Alice love about sailing?",
                where,
                asker=None if readers is None else "alice",
                readable=readable,
            )
        )
        return {rr.record.id for row in result.rows for rr in row.records}

    for readers in (None, ["general"], ["general", "secret"]):
        assert await shown(GENERAL, readers) == {public}, readers
    # asked in the private channel by someone who reads it: its record answers there
    assert private in await shown(SECRET, ["general", "secret"])


async def test_settings_reach_the_dispatcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder: HashEmbedder
) -> None:
    """SPEAKERMEM_CHANNEL_DEFAULT_ENABLED and SPEAKERMEM_CHANNEL_NOTICE change what the bot does."""
    from speakermem.bot.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_CHANNEL_DEFAULT_ENABLED", "false")
    monkeypatch.setenv("SPEAKERMEM_CHANNEL_NOTICE", "false")
    settings = Settings(db_path=tmp_path / "s.db")
    eng = await MemoryEngine.open(settings.memory_config(), embedder)
    try:
        d = Dispatcher(eng, RecallPipeline(eng))  # the governance defaults come from settings
        posted: list[Scope] = []

        async def notify(scope: Scope, text: str) -> None:
            posted.append(scope)

        d.set_notifier("test", notify)
        await d.handle(msg(GENERAL, "m1", "Alice", "hello", 0))
        assert await stored(eng) == set()
        await d.memory_command(inv("channel on", admin=True))
        await d.handle(msg(GENERAL, "m2", "Alice", "hello again", 1))
        await d.drain_notices()
        assert await stored(eng) == {"m2"} and posted == []
    finally:
        await eng.close()
