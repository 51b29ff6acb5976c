"""Access fails closed: unknown privacy is private, Discord needs View Channel and Read
Message History, Slack refuses private channels whose roster it cannot check, and
membership is checked when the question is asked.

Each test drives the real adapter (discord.py against the gateway stand-in, slack-bolt fed
signed HTTP against the Web API stand-in) with a real store and the real recall pipeline.
"""

from __future__ import annotations

from integrations.discord.adapter import GuildState
from integrations.discord.translate import (
    READ_MESSAGE_HISTORY,
    VIEW_CHANNEL,
    ChannelPerms,
    GuildPerms,
    Overwrite,
    can_read_channel,
    is_guild_admin,
    member_channel_permissions,
)
from integrations.slack.translate import channel_privacy
from memory.config import RecallConfig
from memory.engine import MemoryEngine
from memory.models import RosterAction, RosterEvent, Scope
from memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg
from tests.standins.discord_gateway import (
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

ALICE = "700000000000000302"
BOB = "700000000000000303"

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
