"""The Discord stand-in for a sharded bot: several guilds, one gateway connection per shard.

`DiscordStandIn` serves one connection and one guild (the default every other test uses).
`ShardedGateway` serves any number of concurrent connections, as Discord does for a bot
that shards: each IDENTIFY carries ``shard: [id, count]``, and that connection gets READY
and GUILD_CREATE for the guilds of that shard only, by Discord's rule
``shard_id = (guild_id >> 22) % shard_count``. Events for a guild (`dispatch`, `post`) go
out on its shard's connection only; a shard whose connection is down collects its guilds'
posts and replays them on a RESUME of that shard's session (sessions are per shard), or
drops them (left to channel history) when the shard has to identify anew. Clearing
`accepting` holds new connections (a dropped shard stays down until it is set again).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.discord_guild import (
    APP_ID,
    CATEGORY,
    GENERAL,
    GUILD_ID,
    SECRET,
    THREAD,
    default_guild,
)


def shard_of(guild_id: str | int, shard_count: int) -> int:
    """The shard Discord routes a guild's events to."""
    return (int(guild_id) >> 22) % shard_count


def guild_id_on(shard: int, shard_count: int, n: int = 0) -> str:
    """The id of the `n`th stand-in guild that lands on `shard` of `shard_count`."""
    return str((((1_000_000 + n) * shard_count + shard) << 22) | 1)


_OFFSETS = {old: int(old) - int(GUILD_ID) for old in (GUILD_ID, CATEGORY, GENERAL, SECRET, THREAD)}
"""The default guild's own ids (the guild = its @everyone role, category, channels, thread),
as offsets from the guild id; they stay inside the low 22 bits, so on the guild's shard."""


def sharded_guild(guild_id: str, name: str) -> dict[str, Any]:
    """`default_guild()` with its guild, category, channel and thread ids moved to
    `guild_id` (+ the same offsets); members and roles other than @everyone are shared."""
    text = json.dumps(default_guild())
    for old, offset in _OFFSETS.items():
        text = text.replace(f'"{old}"', f'"{int(guild_id) + offset}"')
    guild: dict[str, Any] = json.loads(text)
    guild["name"] = name
    return guild


def general_of(guild_id: str) -> str:
    """#general of a `sharded_guild`."""
    return str(int(guild_id) + _OFFSETS[GENERAL])


@dataclass
class ShardSession:
    """One shard's gateway session as the stand-in sees it."""

    shard: int
    ws: web.WebSocketResponse | None = None
    session_id: str = ""
    identify: dict[str, Any] | None = None
    identified: asyncio.Event = field(default_factory=asyncio.Event)
    missed: list[dict[str, Any]] = field(default_factory=list)
    identifies: int = 0
    resumes: int = 0
    replayed: int = 0


class ShardedGateway(DiscordStandIn):
    """REST + a gateway serving one connection per shard; see the module docstring.

    REST (history, messages, interactions) is the base class's, shared by every shard.
    """

    def __init__(self, guilds: list[dict[str, Any]], shard_count: int) -> None:
        super().__init__(guilds[0])
        self.guilds = {g["id"]: g for g in guilds}
        self.shard_count = shard_count
        self.sessions: dict[int, ShardSession] = {}
        self.identified_shards: list[list[int]] = []
        """Every IDENTIFY's ``shard``, in arrival order."""
        self.member_request_shards: list[int | None] = []
        """The shard of the connection each REQUEST_GUILD_MEMBERS (op 8) came over."""
        self.accepting = asyncio.Event()
        """Cleared: new gateway connections wait (unanswered) until it is set again, so a
        test can hold a dropped shard down for as long as it needs."""
        self.accepting.set()
        self.channel_guild = {
            c["id"]: g["id"] for g in guilds for c in [*g["channels"], *g.get("threads", [])]
        }

    async def start(self) -> ShardedGateway:
        await super().start()
        return self

    def shard(self, shard: int) -> ShardSession:
        if shard not in self.sessions:
            self.sessions[shard] = ShardSession(shard)
        return self.sessions[shard]

    def guilds_of(self, shard: int) -> list[dict[str, Any]]:
        return [g for gid, g in self.guilds.items() if shard_of(gid, self.shard_count) == shard]

    def _session_for(self, data: dict[str, Any]) -> ShardSession:
        gid = data.get("guild_id") or self.channel_guild.get(str(data.get("channel_id")))
        if gid is None:
            raise ValueError("sharded stand-in: an event must name its guild or a known channel")
        return self.shard(shard_of(gid, self.shard_count))

    # --- events -----------------------------------------------------------------------------

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send one dispatch on the connection of the shard of `data`'s guild."""
        session = self._session_for(data)
        await session.identified.wait()
        assert session.ws is not None
        await session.ws.send_str(
            json.dumps({"op": 0, "t": event, "s": next(self._seq), "d": data})
        )

    async def post(self, payload: dict[str, Any]) -> str:
        """As `DiscordStandIn.post`, on (or missed by) the guild's shard only."""
        self._keep_in_history(payload)
        session = self._session_for(payload)
        return await self._deliver(session.ws, session.identified, session.missed, payload)

    async def close_shard(self, shard: int, code: int) -> None:
        """Close one shard's connection with a close code (4000: discord.py resumes it)."""
        session = self.shard(shard)
        await session.identified.wait()
        assert session.ws is not None
        session.identified.clear()
        await session.ws.close(code=code)

    async def close_gateway(self, code: int) -> None:
        await self.close_shard(0, code)

    def message_create(
        self, content: str, *, author: dict[str, Any] | None = None, **extra: Any
    ) -> dict[str, Any]:
        """A MESSAGE_CREATE in `channel_id` (default the first guild's #general), carrying
        the guild that channel belongs to."""
        payload = super().message_create(content, author=author, **extra)
        payload["guild_id"] = self.channel_guild[payload["channel_id"]]
        return payload

    # --- gateway ----------------------------------------------------------------------------

    async def close(self) -> None:
        self.accepting.set()  # let held connections through, to be closed
        for session in self.sessions.values():
            if session.ws is not None and not session.ws.closed:
                await session.ws.close()
        await super().close()

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        await self.accepting.wait()
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        session: ShardSession | None = None
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 41250}}))
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            payload = json.loads(msg.data)
            op, d = payload.get("op"), payload.get("d")
            if op == 1:
                await ws.send_str(json.dumps({"op": 11}))
            elif op == 2:
                shard, count = d.get("shard", [0, 1])
                if count != self.shard_count:
                    await ws.close(code=4011)  # Discord: "sharding required" / invalid shard
                    break
                session = self.shard(shard)
                session.ws, session.identify = ws, d
                session.identifies += 1
                session.session_id = f"standin-session-{shard}-{session.identifies}"
                session.missed.clear()  # a new session: the gateway replays nothing
                self.identify = d
                self.identifies += 1
                self.identified_shards.append([shard, count])
                await self._ready_shard(ws, session)
                session.identified.set()
                self.identified.set()
            elif op == 6:  # RESUME: the session id says which shard
                self.resumes += 1
                found = [s for s in self.sessions.values() if s.session_id == d["session_id"]]
                if not found or not self.resumable:
                    await ws.send_str(json.dumps({"op": 9, "d": False}))
                    continue
                session = found[0]
                session.ws = ws
                session.resumes += 1
                await ws.send_str(
                    json.dumps({"op": 0, "t": "RESUMED", "s": next(self._seq), "d": {}})
                )
                while session.missed:
                    data = session.missed.pop(0)
                    await ws.send_str(
                        json.dumps(
                            {"op": 0, "t": "MESSAGE_CREATE", "s": next(self._seq), "d": data}
                        )
                    )
                    session.replayed += 1
                    self.replayed += 1
                session.identified.set()
            elif op == 8:
                self.member_requests.append(d)
                self.member_request_shards.append(session.shard if session else None)
                await self._send_chunk(ws, d)
        if session is not None and session.ws is ws:
            session.identified.clear()
        return ws

    async def _ready_shard(self, ws: web.WebSocketResponse, session: ShardSession) -> None:
        guilds = self.guilds_of(session.shard)
        ready = {
            "v": 10,
            "user": {**self.bot_user, "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": g["id"], "unavailable": True} for g in guilds],
            "session_id": session.session_id,
            "resume_gateway_url": self.gateway_url,
            "application": {"id": APP_ID, "flags": 0},
            "shard": [session.shard, self.shard_count],
        }
        await ws.send_str(json.dumps({"op": 0, "t": "READY", "s": next(self._seq), "d": ready}))
        for guild in guilds:
            await ws.send_str(
                json.dumps({"op": 0, "t": "GUILD_CREATE", "s": next(self._seq), "d": guild})
            )

    async def _send_chunk(self, ws: web.WebSocketResponse, d: dict[str, Any]) -> None:
        guild = self.guilds.get(str(d.get("guild_id")), self.guild)
        chunk = {
            "guild_id": d.get("guild_id"),
            "members": self.chunk_members
            if self.chunk_members is not None
            else guild.get("members", []),
            "chunk_index": 0,
            "chunk_count": 1,
            "nonce": d.get("nonce"),
        }
        await ws.send_str(
            json.dumps({"op": 0, "t": "GUILD_MEMBERS_CHUNK", "s": next(self._seq), "d": chunk})
        )
