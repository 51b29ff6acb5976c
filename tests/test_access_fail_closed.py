"""Access fails closed: unknown privacy is private, Discord needs View Channel and Read
Message History, Slack refuses private channels whose roster it cannot check, and
membership is checked when the question is asked.

Each test drives the real adapter (discord.py against the gateway stand-in, slack-bolt fed
signed HTTP against the Web API stand-in) with a real store and the real recall pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.discord.adapter import GuildState
from speakermem.integrations.discord.translate import (
    READ_MESSAGE_HISTORY,
    VIEW_CHANNEL,
    ChannelPerms,
    GuildPerms,
    Overwrite,
    can_read_channel,
    is_guild_admin,
    member_channel_permissions,
)
from speakermem.integrations.slack.translate import channel_privacy
from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterAction, RosterEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg
from tests.standins.discord_guild import (
    EVERYONE,
    GENERAL,
    GUILD_ID,
    HISTORY,
    OWNER_ID,
    ROLE_ADMIN,
    ROLE_MEMBERS,
    SECRET,
    VIEW,
    default_guild,
)
from tests.test_discord_adapter import Bot as DiscordBot
from tests.test_discord_adapter import post as discord_post
from tests.test_discord_adapter import start_bot as start_discord
from tests.test_discord_adapter import until
from tests.test_slack_adapter import GENERAL as SLACK_GENERAL
from tests.test_slack_adapter import PRIVATE as SLACK_PRIVATE
from tests.test_slack_adapter import _rig as slack_rig
from tests.test_slack_adapter import gscope as slack_scope
from tests.test_slack_adapter import message as slack_message
from tests.test_slack_adapter import section_text
from tests.test_slack_adapter import seed as slack_seed

pytestmark = pytest.mark.contract

ALICE = "700000000000000302"
BOB = "700000000000000303"


def question(text: str) -> list[dict[str, Any]]:
    return [{"name": "question", "type": 3, "value": text}]


# --- the store: privacy nobody reported is private ------------------------------------------


async def test_unknown_privacy_is_private_and_never_answers_elsewhere(
    engine: MemoryEngine,
) -> None:
    here = Scope(platform="test", workspace="w1", channel="here")
    unknown = Scope(platform="test", workspace="w1", channel="unknown")
    never_seen = Scope(platform="test", workspace="w1", channel="never-seen")
    await engine.ingest_many(
        [
            msg(here, "h1", "Ursula", "Where is the offsite this year?", 0),
            msg(unknown, "u1", "Ursula", "The offsite is in Porto, keep it quiet", 1),
        ]
    )
    await engine.store.channels.set_meta(here, name="here", is_private=False)
    for sc in (here, unknown):
        await engine.roster(RosterEvent(scope=sc, action=RosterAction.JOIN, user_id="ursula"))
    assert await engine.store.channels.is_private(unknown)  # ingested, privacy never said
    assert await engine.store.channels.is_private(never_seen)  # no row at all
    assert not await engine.store.channels.is_private(here)

    pipe = RecallPipeline(engine, config=RecallConfig(scope="workspace"))
    result = await pipe.run(RecallRequest("where is the offsite?", here, asker="ursula"))
    assert result.trace.channels == [str(here)]
    assert "Porto" not in result.answer.text
    assert all(e.scope == here for e in result.pack.excerpts)

    # once an adapter reports it public, the same question may draw on it
    await engine.store.channels.set_meta(unknown, name="unknown", is_private=False)
    result = await pipe.run(RecallRequest("where is the offsite?", here, asker="ursula"))
    assert result.trace.channels == [str(here), str(unknown)]


# --- Discord: View Channel AND Read Message History -------------------------------------------


def _guild(everyone: int) -> GuildPerms:
    return GuildPerms(guild_id="1", owner_id="9", roles={"1": everyone, "2": 0})


def test_discord_view_without_history_cannot_read() -> None:
    plain = ChannelPerms(channel_id="5")
    assert can_read_channel(set(), "3", _guild(VIEW_CHANNEL | READ_MESSAGE_HISTORY), plain)
    assert not can_read_channel(set(), "3", _guild(VIEW_CHANNEL), plain)
    assert not can_read_channel(set(), "3", _guild(READ_MESSAGE_HISTORY), plain)
    # an overwrite that denies history alone shuts the channel's memory
    no_history = ChannelPerms(
        channel_id="5", overwrites=[Overwrite(id="1", type=0, deny=READ_MESSAGE_HISTORY)]
    )
    assert not can_read_channel(set(), "3", _guild(VIEW | HISTORY), no_history)
    # ... and a member overwrite can give it back
    back = ChannelPerms(
        channel_id="5",
        overwrites=[
            Overwrite(id="1", type=0, deny=READ_MESSAGE_HISTORY),
            Overwrite(id="3", type=1, allow=READ_MESSAGE_HISTORY),
        ],
    )
    assert can_read_channel(set(), "3", _guild(VIEW | HISTORY), back)
    assert not can_read_channel(set(), "4", _guild(VIEW | HISTORY), back)


def test_discord_guild_state_rosters_need_history() -> None:
    guild = default_guild()
    general = next(c for c in guild["channels"] if c["id"] == GENERAL)
    general["permission_overwrites"] = [
        {"id": EVERYONE, "type": 0, "allow": "0", "deny": str(HISTORY)},
        {"id": ROLE_MEMBERS, "type": 0, "allow": str(HISTORY), "deny": "0"},
    ]
    state = GuildState.from_guild_create(guild)
    assert not state.can_read(ALICE, GENERAL)  # sees #general, but not its history
    assert state.can_read(BOB, GENERAL)
    assert state.can_read(OWNER_ID, GENERAL)
    assert state.is_private(GENERAL)  # @everyone cannot read it
    assert state.is_private(SECRET)


def test_discord_admin_is_manage_server_administrator_or_owner() -> None:
    state = GuildState.from_guild_create(default_guild())
    perms = state.perms
    assert is_guild_admin(set(), OWNER_ID, perms)
    assert is_guild_admin({ROLE_ADMIN}, ALICE, perms)  # Administrator
    assert not is_guild_admin(set(), ALICE, perms)
    assert not is_guild_admin({ROLE_MEMBERS}, BOB, perms)
    manage = perms.model_copy(update={"roles": {**perms.roles, ROLE_MEMBERS: 1 << 5}})
    assert is_guild_admin({ROLE_MEMBERS}, BOB, manage)
    # a role the guild does not know grants nothing; nor does @everyone listed as a role
    assert not is_guild_admin({"123", GUILD_ID}, ALICE, perms)


@pytest.mark.e2e
def test_discord_interaction_carries_discords_own_channel_permissions() -> None:
    from tests.standins.discord_gateway import DiscordStandIn

    standin = DiscordStandIn()
    full = standin.interaction("recall", [])
    assert member_channel_permissions(full) == VIEW | 1 << 11 | HISTORY
    blind = standin.interaction("recall", [], permissions=VIEW)
    assert member_channel_permissions(blind) == VIEW
    del blind["member"]["permissions"]
    assert member_channel_permissions(blind) is None


# --- Slack: privacy from the event's channel_type -------------------------------------------


def test_slack_channel_type_gives_privacy() -> None:
    def body(kind: str | None) -> dict:
        event = {"type": "message", "channel": "C1", "user": "U1", "text": "hi", "ts": "1.0"}
        if kind is not None:
            event["channel_type"] = kind
        return {"team_id": "T1", "event": event}

    assert channel_privacy(body("group")) is True
    assert channel_privacy(body("mpim")) is True
    assert channel_privacy(body("im")) is True
    assert channel_privacy(body("channel")) is False
    assert channel_privacy(body(None)) is None
    assert channel_privacy(body("something-new")) is None
    # member events use one-letter types
    assert channel_privacy({"event": {"type": "member_joined_channel", "channel_type": "G"}})
    assert (
        channel_privacy({"event": {"type": "member_joined_channel", "channel_type": "C"}}) is False
    )


# --- Slack, end to end --------------------------------------------------------------------------


@pytest.mark.e2e
async def test_slack_private_channel_refuses_when_its_roster_cannot_be_listed(
    tmp_path: Path,
) -> None:
    rig, close = await slack_rig(tmp_path)
    try:
        await slack_seed(rig)
        _, _, posted = await rig.recall("U1", SLACK_PRIVATE, "what is the launch code word?")
        assert "pineapple" in section_text(posted["blocks"])  # a member, roster listed

        rig.standin.fail("conversations.members", times=10)
        _, _, posted = await rig.recall("U1", SLACK_PRIVATE, "what is the launch code word?")
        text = section_text(posted["blocks"])
        assert "pineapple" not in text and "private channel" in text
        assert posted["response_type"] == "ephemeral"
        assert rig.adapter.stats["recall_roster_unavailable"] == 1
        # a public channel keeps answering from its (recent) roster meanwhile
        _, _, posted = await rig.recall("U1", SLACK_GENERAL, "when is the trip to Lisbon?")
        assert "Lisbon" in section_text(posted["blocks"])
    finally:
        await close()


@pytest.mark.e2e
async def test_slack_member_who_left_a_private_channel_gets_nothing_a_second_later(
    tmp_path: Path,
) -> None:
    rig, close = await slack_rig(tmp_path)
    try:
        await slack_seed(rig)
        _, _, posted = await rig.recall("U3", SLACK_PRIVATE, "what is the launch code word?")
        assert "pineapple" in section_text(posted["blocks"])
        # Carol leaves; the member_left_channel event has not arrived (or never will)
        rig.standin.members[SLACK_PRIVATE].remove("U3")
        _, _, posted = await rig.recall("U3", SLACK_PRIVATE, "what is the launch code word?")
        text = section_text(posted["blocks"])
        assert "pineapple" not in text and "cannot read" in text
        assert posted["response_type"] == "ephemeral"
        assert "U3" not in {m.user_id for m in await rig.engine.members(slack_scope(SLACK_PRIVATE))}
        # Alice, still a member, is unaffected
        _, _, posted = await rig.recall("U1", SLACK_PRIVATE, "what is the launch code word?")
        assert "pineapple" in section_text(posted["blocks"])
    finally:
        await close()


@pytest.mark.e2e
async def test_slack_privacy_comes_from_the_events_channel_type(tmp_path: Path) -> None:
    rig, close = await slack_rig(tmp_path)
    try:
        channels = rig.engine.store.channels
        rig.standin.members.update({"CGROUP": ["U1"], "CPUBLIC": ["U1"], "CQUIET": ["U1"]})
        rig.standin.fail("conversations.info", times=10)  # Slack will not say; the event does
        await rig.event(slack_message("CGROUP", "U1", "private words", 1, channel_type="group"))
        await rig.event(slack_message("CPUBLIC", "U1", "public words", 2, channel_type="channel"))
        quiet = slack_message("CQUIET", "U1", "who knows", 3)
        del quiet["channel_type"]
        await rig.event(quiet)
        assert await channels.is_private(slack_scope("CGROUP"))
        assert not await channels.is_private(slack_scope("CPUBLIC"))
        assert await channels.is_private(slack_scope("CQUIET"))  # unknown: private
        # the type changes (a channel converted to private): the store follows
        await rig.event(slack_message("CPUBLIC", "U1", "now private", 4, channel_type="group"))
        assert await channels.is_private(slack_scope("CPUBLIC"))
    finally:
        await close()


# --- Discord, end to end ------------------------------------------------------------------------


async def _discord_recall(bot: DiscordBot, payload: dict[str, Any]) -> dict[str, Any]:
    before = len(bot.standin.followups)
    await bot.standin.dispatch("INTERACTION_CREATE", payload)
    await until(lambda: len(bot.standin.followups) > before)
    return bot.standin.followups[-1]["embeds"][0]


@pytest.mark.e2e
async def test_discord_view_without_read_message_history_is_refused(tmp_path: Path) -> None:
    guild = default_guild()
    general = next(c for c in guild["channels"] if c["id"] == GENERAL)
    general["permission_overwrites"] = [
        {"id": EVERYONE, "type": 0, "allow": "0", "deny": str(HISTORY)},
        {"id": ROLE_MEMBERS, "type": 0, "allow": str(HISTORY), "deny": "0"},
    ]
    bot, close = await start_discord(tmp_path, guild)
    try:
        assert ALICE not in await bot.roster(GENERAL)  # she sees #general, not its past
        assert BOB in await bot.roster(GENERAL)
        await discord_post(bot, "the cabin code is 2468", author_index=2)
        ask = "what is the cabin code?"
        refused = await _discord_recall(bot, bot.standin.interaction("recall", question(ask)))
        assert "2468" not in str(refused) and "cannot read" in refused["description"]
        assert bot.standin.interaction_callbacks[-1]["data"]["flags"] & 64
        answered = await _discord_recall(
            bot, bot.standin.interaction("recall", question(ask), member_index=2)
        )
        assert "2468" in str(answered)
    finally:
        await close()


@pytest.mark.e2e
async def test_discord_permissions_are_computed_when_the_question_is_asked(
    tmp_path: Path,
) -> None:
    bot, close = await start_discord(tmp_path)
    try:
        await discord_post(bot, "the vault code is 1357", author_index=2, channel_id=SECRET)
        ask = question("what is the vault code?")
        ok = bot.standin.interaction("recall", ask, member_index=2, channel_id=SECRET)
        assert "1357" in str(await _discord_recall(bot, ok))
        # Bob's role was just taken away: the interaction carries his roles as of now,
        # before any GUILD_MEMBER_UPDATE reached the bot (his roster row is still there)
        assert BOB in await bot.roster(SECRET)
        now = bot.standin.interaction("recall", ask, member_index=2, channel_id=SECRET, roles=[])
        refused = await _discord_recall(bot, now)
        assert "1357" not in str(refused) and "cannot read" in refused["description"]
        # Discord's own computed permissions for the channel must agree too
        blind = bot.standin.interaction(
            "recall", ask, member_index=2, channel_id=SECRET, permissions=VIEW
        )
        assert "1357" not in str(await _discord_recall(bot, blind))
        # a server whose permissions the bot does not know yet answers nothing
        elsewhere = bot.standin.interaction("recall", ask, member_index=2, channel_id=SECRET)
        elsewhere["guild_id"] = "700000000000009999"
        assert "1357" not in str(await _discord_recall(bot, elsewhere))
    finally:
        await close()


@pytest.mark.e2e
async def test_discord_unreadable_interaction_permissions_refuse_instead_of_the_roster(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """If the invoker's permissions in the interaction cannot be read, the answer is a
    refusal; the stored roster (which still lists the member) is no fallback."""
    import speakermem.integrations.discord.translate as discord_translate
    from speakermem.integrations.payload import PayloadError

    bot, close = await start_discord(tmp_path)
    try:
        await discord_post(bot, "the vault code is 1357", author_index=2, channel_id=SECRET)
        ask = question("what is the vault code?")
        assert BOB in await bot.roster(SECRET)

        def unreadable(_d: Any) -> int | None:
            raise PayloadError("discord interaction member.permissions: not an integer")

        monkeypatch.setattr(discord_translate, "member_channel_permissions", unreadable)
        payload = bot.standin.interaction("recall", ask, member_index=2, channel_id=SECRET)
        refused = await _discord_recall(bot, payload)
        assert "1357" not in str(refused)
        assert bot.standin.interaction_callbacks[-1]["data"]["flags"] & 64  # only the asker
        monkeypatch.undo()
        ok = bot.standin.interaction("recall", ask, member_index=2, channel_id=SECRET)
        assert "1357" in str(await _discord_recall(bot, ok))
    finally:
        await close()
