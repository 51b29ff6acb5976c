"""SPEAKERMEM_DISCORD_SHARD_IDS: N processes each run their own range of the shards.

The gateway stand-in records every IDENTIFY's ``shard: [id, count]``; a process given a range
must identify exactly those shards (and no others) out of the configured count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import discord
import pytest
from pydantic import ValidationError

from bot.settings import Settings, parse_shard_ids
from integrations.discord.adapter import DiscordAdapter
from tests.test_discord_adapter import GENERAL, ShardedStandIn, post, start_bot


class RecordingShardStandIn(ShardedStandIn):
    """Keeps the shard of every IDENTIFY (one gateway connection per shard)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shards: list[list[int]] = []

    async def _send_ready(self, ws: Any) -> None:
        self.shards.append(list((self.identify or {}).get("shard", [0, 1])))
        await super()._send_ready(ws)


def settings(**extra: Any) -> Settings:
    return Settings(_env_file=None, **extra)  # type: ignore[call-arg]


async def test_process_identifies_only_its_shard(tmp_path: Path):
    b, close = await start_bot(
        tmp_path,
        standin_cls=RecordingShardStandIn,
        discord_shard_count=2,
        discord_shard_ids="1",
    )
    try:
        client = b.adapter.client
        assert isinstance(client, discord.AutoShardedClient)
        assert client.shard_ids == [1] and client.shard_count == 2
        assert isinstance(b.standin, RecordingShardStandIn)
        assert b.standin.shards == [[1, 2]]
        mid = await post(b, "hello from shard one")
        assert await b.stored(GENERAL, mid) is not None
    finally:
        await close()


def built_client(**extra: Any) -> discord.Client:
    """The client the adapter would connect (never connected here: nothing to close)."""
    adapter = DiscordAdapter(settings(**extra), None, None)  # type: ignore[arg-type]
    return adapter._make_client()


def test_range_builds_client_for_those_shards():
    # the stand-in serves one gateway connection at a time, so a multi-shard range is checked
    # on the client the adapter builds (discord.py opens one connection per listed shard)
    client = built_client(discord_shard_count=4, discord_shard_ids="1-2")
    assert isinstance(client, discord.AutoShardedClient)
    assert client.shard_ids == [1, 2] and client.shard_count == 4


def test_without_ids_the_client_runs_every_shard():
    client = built_client(discord_shard_count=3)
    assert isinstance(client, discord.AutoShardedClient)
    assert client.shard_ids is None and client.shard_count == 3


@pytest.mark.parametrize(
    ("text", "ids"),
    [("0-3", (0, 1, 2, 3)), ("0,2", (0, 2)), ("4, 0-1", (0, 1, 4)), ("2,2-3", (2, 3))],
)
def test_parse_shard_ids(text: str, ids: tuple[int, ...]):
    assert parse_shard_ids(text) == ids


def test_shard_ids_from_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_COUNT", "3")
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_IDS", "0,2")
    assert settings().discord_shard_ids == (0, 2)
    monkeypatch.setenv("SPEAKERMEM_DISCORD_SHARD_IDS", "")
    assert settings().discord_shard_ids is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"discord_shard_count": 3, "discord_shard_ids": "3"}, "[3] outside 0-2"),
        ({"discord_shard_count": 4, "discord_shard_ids": "2-5"}, "[4, 5] outside 0-3"),
        ({"discord_shard_ids": "0-1"}, "needs SPEAKERMEM_DISCORD_SHARD_COUNT"),
        ({"discord_shard_count": 4, "discord_shard_ids": "a-b"}, "'a-b' in shard ids"),
        ({"discord_shard_count": 4, "discord_shard_ids": "3-1"}, "must be ascending"),
        ({"discord_shard_count": 4, "discord_shard_ids": "0,,1"}, "empty item"),
    ],
)
def test_invalid_shard_ids_are_readable(extra: dict[str, Any], message: str):
    with pytest.raises(ValidationError) as caught:
        settings(**extra)
    assert message in str(caught.value)
