"""A local stand-in for Discord's REST API and gateway, driven by an unmodified discord.py.

Point the client at it with `DiscordStandIn.install(monkeypatch)` (it sets
``discord.http.Route.BASE`` and ``DiscordWebSocket.DEFAULT_GATEWAY``), then
``await client.start("token")``. The gateway answers HELLO/heartbeat/IDENTIFY
with READY and GUILD_CREATE built from `guild` (see `default_guild`); tests push
further events with `dispatch`. Every REST call is recorded in `requests`.
Responses use ``Content-Type: application/json`` exactly: discord.py treats
anything else (aiohttp's default adds ``; charset=utf-8``) as text.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

import yarl
from aiohttp import BodyPartReader, WSMsgType, web

from tests.standins.discord_guild import (
    APP_ID,
    BOT_ID,
    DM_CHANNEL,
    GENERAL,
    HISTORY,
    OWNER_ID,
    SEND,
    VIEW,
    default_guild,
    user,
)

log = logging.getLogger(__name__)


def _json(data: Any, status: int = 200) -> web.Response:
    # Exactly "application/json": discord.py's json_or_text() compares the whole header.
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"}
    )


class DiscordStandIn:
    """REST + gateway on 127.0.0.1; see the module docstring."""

    def __init__(self, guild: dict[str, Any] | None = None) -> None:
        self.guild = guild if guild is not None else default_guild()
        self.bot_user = user(BOT_ID, "speakermem", bot=True)
        self.requests: list[tuple[str, str, Any]] = []
        self.sent_messages: list[dict[str, Any]] = []
        self.interaction_callbacks: list[dict[str, Any]] = []
        self.followups: list[dict[str, Any]] = []
        self.commands: dict[str, list[dict[str, Any]]] = {}
        self.identify: dict[str, Any] | None = None
        self.history: dict[str, list[dict[str, Any]]] = {}
        """channel id -> messages (ascending ids) served by GET /channels/{id}/messages."""
        self.history_rate_limits: list[float] = []
        self.backward_rate_limits: dict[str, list[float]] = {}
        """channel id -> Retry-After values for its next history GETs that page backwards
        (``before=``, reconciliation's reads)."""
        self.history_queries: list[tuple[str, dict[str, str]]] = []
        """(channel id, query) of every history GET: ``after=`` pages forward (catch-up),
        ``before=`` backwards (reconciliation)."""
        self.history_times: list[float] = []
        """time.monotonic() at which each history GET arrived (beside `history_queries`)."""
        self.deleted_channels: set[str] = set()
        """Channels and threads `delete_channel` removed: their history is a 404."""
        self.resumable = True
        """Whether a RESUME (op 6) succeeds (RESUMED) or gets INVALID_SESSION."""
        self.resumes = 0
        """Retry-After values: the next history GETs answer 429 with these, in order."""
        self.member_requests: list[dict[str, Any]] = []
        """REQUEST_GUILD_MEMBERS (op 8) payloads the client sent."""
        self.chunk_members: list[dict[str, Any]] | None = None
        """Members a chunk answers with (default: the GUILD_CREATE's)."""
        self.identified = asyncio.Event()
        self.identifies = 0
        """IDENTIFYs (op 2) received: 1 + the new sessions after the first."""
        self.missed: list[dict[str, Any]] = []
        """MESSAGE_CREATEs `post`ed while no session was live: replayed on RESUME, dropped
        (left to history) when the client has to identify anew."""
        self.replayed = 0
        self._ws: web.WebSocketResponse | None = None
        self._seq = itertools.count(1)
        self._ids = itertools.count(800000000000000001)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> DiscordStandIn:
        app = web.Application()
        app.router.add_route("GET", "/gateway", self._gateway)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    def install(self, monkeypatch: Any) -> None:
        """Redirect discord.py's REST base and default gateway here."""
        import discord.gateway
        import discord.http

        monkeypatch.setattr(discord.http.Route, "BASE", self.api_base)
        monkeypatch.setattr(
            discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(self.gateway_url)
        )

    def next_id(self) -> str:
        return str(next(self._ids))

    # --- gateway ---------------------------------------------------------------------------

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send one op-0 dispatch to the connected client."""
        await self.identified.wait()
        assert self._ws is not None
        await self._ws.send_str(json.dumps({"op": 0, "t": event, "s": next(self._seq), "d": data}))

    async def post(self, payload: dict[str, Any]) -> str:
        """A member posts `payload` (a `message_create`): it enters the channel's history
        (what REST catch-up reads) and reaches a live session as MESSAGE_CREATE; while no
        session is live it waits for a RESUME's replay, as Discord's gateway does. Returns
        "live" or "missed"."""
        self._keep_in_history(payload)
        return await self._deliver(self._ws, self.identified, self.missed, payload)

    def _keep_in_history(self, payload: dict[str, Any]) -> None:
        stored = {k: v for k, v in payload.items() if k not in ("guild_id", "member")}
        history = self.history.setdefault(payload["channel_id"], [])
        history.append(stored)
        history.sort(key=lambda x: int(x["id"]))

    async def _deliver(
        self,
        ws: web.WebSocketResponse | None,
        identified: asyncio.Event,
        missed: list[dict[str, Any]],
        payload: dict[str, Any],
    ) -> str:
        """MESSAGE_CREATE on a live, identified session; else kept for its RESUME."""
        if identified.is_set() and ws is not None and not ws.closed:
            try:
                await ws.send_str(
                    json.dumps({"op": 0, "t": "MESSAGE_CREATE", "s": next(self._seq), "d": payload})
                )
                return "live"
            except ConnectionError:
                pass
        missed.append(payload)
        return "missed"

    async def close_gateway(self, code: int) -> None:
        """Close the client's gateway connection with a close code (4004 and 4014 are fatal
        for discord.py; 4000 or 1001 make it reconnect)."""
        await self.identified.wait()
        assert self._ws is not None
        self.identified.clear()
        await self._ws.close(code=code)

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws = ws
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 41250}}))
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            payload = json.loads(msg.data)
            op = payload.get("op")
            if op == 1:
                await ws.send_str(json.dumps({"op": 11}))
            elif op == 2:
                self.identify = payload["d"]
                self.identifies += 1
                self.missed.clear()  # a new session: the gateway replays nothing
                await self._send_ready(ws)
                self.identified.set()
            elif op == 8:
                self.member_requests.append(payload["d"])
                await self._send_chunk(ws, payload["d"])
            elif op == 6:  # RESUME
                self.resumes += 1
                if self.resumable:
                    await ws.send_str(
                        json.dumps({"op": 0, "t": "RESUMED", "s": next(self._seq), "d": {}})
                    )
                    while self.missed:  # what the session missed, in order (posts may
                        data = self.missed.pop(0)  # still arrive while this runs)
                        await ws.send_str(
                            json.dumps(
                                {"op": 0, "t": "MESSAGE_CREATE", "s": next(self._seq), "d": data}
                            )
                        )
                        self.replayed += 1
                    self.identified.set()
                else:  # INVALID_SESSION, not resumable: the client identifies anew
                    await ws.send_str(json.dumps({"op": 9, "d": False}))
        return ws

    async def _send_ready(self, ws: web.WebSocketResponse) -> None:
        ready = {
            "v": 10,
            "user": {**self.bot_user, "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": self.guild["id"], "unavailable": True}],
            "session_id": "standin-session",
            "resume_gateway_url": self.gateway_url,
            "application": {"id": APP_ID, "flags": 0},
        }
        for event, data in (("READY", ready), ("GUILD_CREATE", self.guild)):
            await ws.send_str(json.dumps({"op": 0, "t": event, "s": next(self._seq), "d": data}))

    async def _send_chunk(self, ws: web.WebSocketResponse, d: dict[str, Any]) -> None:
        chunk = {
            "guild_id": d.get("guild_id"),
            "members": self.chunk_members
            if self.chunk_members is not None
            else self.guild.get("members", []),
            "chunk_index": 0,
            "chunk_count": 1,
            "nonce": d.get("nonce"),
        }
        await ws.send_str(
            json.dumps({"op": 0, "t": "GUILD_MEMBERS_CHUNK", "s": next(self._seq), "d": chunk})
        )

    # --- REST ------------------------------------------------------------------------------

    def message(self, channel_id: str, body: dict[str, Any], author: dict | None = None) -> dict:
        """A message object as the API returns it for a send."""
        return {
            "id": self.next_id(),
            "channel_id": channel_id,
            "guild_id": self.guild["id"],
            "type": 0,
            "content": body.get("content") or "",
            "author": author or self.bot_user,
            "timestamp": datetime.now(UTC).isoformat(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": body.get("embeds") or [],
            "pinned": False,
            "flags": body.get("flags") or 0,
            "components": [],
        }

    async def _rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body: Any = None
        if request.can_read_body:
            if request.content_type == "application/json":
                body = json.loads(await request.read() or b"null")
            elif request.content_type.startswith("multipart/"):
                body = await self._multipart(request)
            else:
                await request.read()
        self.requests.append((request.method, path, body))
        parts = path.strip("/").split("/")
        method = request.method

        if method == "GET" and path == "/users/@me":
            return _json(self.bot_user)
        if method == "GET" and path == "/oauth2/applications/@me":
            return _json(
                {
                    "id": APP_ID,
                    "name": "speakermem",
                    "description": "",
                    "icon": None,
                    "bot_public": False,
                    "bot_require_code_grant": False,
                    "owner": user(OWNER_ID, "olivia"),
                    "verify_key": "00" * 32,
                    "flags": 0,
                }
            )
        if parts[0] == "applications" and parts[-1] == "commands":
            key = "/".join(parts[:-1])
            if method == "PUT":
                echoed = [
                    {
                        # Discord answers "" for a context menu command, which sends none
                        "description": "",
                        **c,
                        "id": c.get("id") or self.next_id(),
                        "application_id": APP_ID,
                        "version": "1",
                    }
                    for c in (body or [])
                ]
                self.commands[key] = echoed
                return _json(echoed)
            if method == "GET":
                return _json(self.commands.get(key, []))
        if (
            method == "GET"
            and len(parts) == 3
            and parts[0] == "channels"
            and parts[2] == "messages"
        ):
            return self._history(parts[1], request.query)
        if (
            method == "POST"
            and len(parts) == 3
            and parts[0] == "channels"
            and parts[2] == "messages"
        ):
            msg = self.message(parts[1], body or {})
            self.sent_messages.append(msg)
            return _json(msg)
        if method == "POST" and parts[0] == "interactions" and parts[-1] == "callback":
            return self._callback(parts[1], body or {})
        if parts[0] == "webhooks" and len(parts) >= 3:
            return self._webhook(method, parts, body or {})
        log.warning("discord stand-in: unhandled %s %s", method, path)
        return _json({"message": "404: Not Found", "code": 0}, status=404)

    def add_history(
        self, channel_id: str, content: str, at: datetime, *, member_index: int = 1
    ) -> dict[str, Any]:
        """A message posted while the bot was away: in history, never dispatched. Its id is
        a snowflake of `at`, as Discord's are."""
        msgs = self.history.setdefault(channel_id, [])
        ms = int(at.timestamp() * 1000) - 1420070400000
        mid = str((ms << 22) + len(msgs) % 4096)
        m = self.guild["members"][member_index]
        msg = self.message(channel_id, {"content": content}, author=m["user"])
        msg.update(id=mid, timestamp=at.isoformat())
        msg.pop("guild_id", None)  # REST message objects carry no guild_id
        msgs.append(msg)
        msgs.sort(key=lambda x: int(x["id"]))
        return msg

    def delete_message(self, channel_id: str, message_id: str) -> None:
        """A message deleted (while the bot is away: no MESSAGE_DELETE is sent)."""
        msgs = self.history.get(channel_id, [])
        msgs[:] = [m for m in msgs if m["id"] != message_id]

    def edit_message(self, channel_id: str, message_id: str, content: str) -> dict[str, Any]:
        """A message edited (while the bot is away): new content, an ``edited_timestamp``."""
        msg = next(m for m in self.history.get(channel_id, []) if m["id"] == message_id)
        msg.update(content=content, edited_timestamp=datetime.now(UTC).isoformat())
        return msg

    def delete_channel(self, channel_id: str) -> None:
        """A channel or thread deleted: its history answers 404 Unknown Channel (10003), and
        the next GUILD_CREATE no longer lists it."""
        self.deleted_channels.add(channel_id)
        self.history.pop(channel_id, None)
        for key in ("channels", "threads"):
            self.guild[key] = [c for c in self.guild.get(key, []) if c["id"] != channel_id]

    def _history(self, channel_id: str, query: Any) -> web.Response:
        """Discord's paging: `after` gives the `limit` messages right after it, newest first."""
        self.history_queries.append((channel_id, dict(query)))
        self.history_times.append(time.monotonic())
        if channel_id in self.deleted_channels:
            return _json({"message": "Unknown Channel", "code": 10003}, status=404)
        limits = self.history_rate_limits
        if not limits and "before" in query:
            limits = self.backward_rate_limits.get(channel_id, [])
        if limits:
            retry = limits.pop(0)
            return web.Response(
                body=json.dumps(
                    {
                        "message": "You are being rate limited.",
                        "retry_after": retry,
                        "global": False,
                    }
                ).encode(),
                status=429,
                headers={
                    "Content-Type": "application/json",
                    "Retry-After": str(retry),
                    "Via": "1.1 google",
                    "X-RateLimit-Scope": "user",
                },
            )
        msgs = self.history.get(channel_id, [])
        limit = min(100, int(query.get("limit", 50)))
        if "after" in query:
            after = int(query["after"])
            page = [m for m in msgs if int(m["id"]) > after][:limit]
        else:
            before = int(query.get("before", 1 << 63))
            page = [m for m in msgs if int(m["id"]) < before][-limit:]
        return _json(list(reversed(page)))

    @staticmethod
    async def _multipart(request: web.Request) -> dict[str, Any]:
        """A message with files: ``payload_json`` merged with ``files``: [(name, bytes)]."""
        body: dict[str, Any] = {"multipart": True, "files": []}
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            data = await part.read()
            if part.name == "payload_json":
                body.update(json.loads(data))
            else:
                body["files"].append((part.filename, bytes(data)))
        return body

    def _callback(self, interaction_id: str, body: dict[str, Any]) -> web.Response:
        self.interaction_callbacks.append(body)
        kind = body.get("type")
        data = body.get("data") or {}
        resource: dict[str, Any] = {"type": kind}
        if kind in (4, 7):
            resource["message"] = self.message(GENERAL, data)
        return _json(
            {
                "interaction": {
                    "id": interaction_id,
                    "type": 2,
                    "response_message_loading": kind == 5,
                    "response_message_ephemeral": bool((data.get("flags") or 0) & 64),
                },
                "resource": resource,
            }
        )

    def _webhook(self, method: str, parts: list[str], body: dict[str, Any]) -> web.Response:
        # /webhooks/{app}/{token}[/messages/{id}]
        if method == "POST" and len(parts) == 3:
            msg = self.message(GENERAL, body, author=self.bot_user)
            msg["webhook_id"] = parts[1]
            self.followups.append(body)
            return _json(msg)
        if len(parts) == 5 and parts[3] == "messages":
            msg = self.message(GENERAL, body)
            msg["id"] = parts[4] if parts[4] != "@original" else self.next_id()
            if method == "PATCH":
                self.followups.append({**body, "edit": parts[4]})
            if method == "DELETE":
                return web.Response(status=204)
            return _json(msg)
        return _json({"message": "404: Not Found", "code": 0}, status=404)

    # --- payload helpers for tests ---------------------------------------------------------

    def message_create(
        self,
        content: str,
        *,
        author: dict[str, Any] | None = None,
        channel_id: str = GENERAL,
        **extra: Any,
    ) -> dict[str, Any]:
        """A MESSAGE_CREATE payload from a guild member (alice by default)."""
        m = self.guild["members"][1]
        msg = self.message(channel_id, {"content": content}, author=author or m["user"])
        msg["member"] = {k: v for k, v in m.items() if k != "user"}
        msg.update(extra)
        return msg

    def direct_message(
        self, content: str, *, member_index: int = 1, channel_id: str = DM_CHANNEL
    ) -> dict[str, Any]:
        """A MESSAGE_CREATE of a direct message to the bot: no guild, no member."""
        author = self.guild["members"][member_index]["user"]
        msg = self.message(channel_id, {"content": content}, author=author)
        msg.pop("guild_id")
        return msg

    def context_menu(self, name: str, target: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """INTERACTION_CREATE for a message context-menu command (data.type 3) on `target`
        (a message payload), with the message in ``resolved`` as Discord sends it."""
        payload = self.interaction(name, [], channel_id=target["channel_id"], **kw)
        resolved = {k: v for k, v in target.items() if k not in ("member", "guild_id")}
        payload["data"] = {
            "id": self.next_id(),
            "name": name,
            "type": 3,
            "target_id": target["id"],
            "resolved": {"messages": {target["id"]: resolved}},
        }
        return payload

    def interaction(
        self,
        name: str,
        options: list[dict[str, Any]],
        *,
        member_index: int = 1,
        channel_id: str = GENERAL,
        roles: list[str] | None = None,
        permissions: int = VIEW | SEND | HISTORY,
    ) -> dict[str, Any]:
        """An INTERACTION_CREATE payload for a chat-input command.

        `roles` replaces the member's roles as this interaction reports them (Discord
        sends the roles current at the click); `permissions` is the member's computed
        permissions in the channel, as Discord puts in ``member.permissions``.
        """
        member_payload = {**self.guild["members"][member_index], "permissions": str(permissions)}
        if roles is not None:
            member_payload["roles"] = roles
        return {
            "id": self.next_id(),
            "application_id": APP_ID,
            "type": 2,
            "token": "standin-interaction-token",
            "version": 1,
            "guild_id": self.guild["id"],
            "channel_id": channel_id,
            "channel": {
                "id": channel_id,
                "type": 0,
                "guild_id": self.guild["id"],
                "name": next(
                    (c["name"] for c in self.guild["channels"] if c["id"] == channel_id), "chat"
                ),
                "position": 0,
                "permission_overwrites": [],
            },
            "member": member_payload,
            "app_permissions": str(VIEW | SEND | HISTORY),
            "locale": "en-US",
            "attachment_size_limit": 8 * 1024 * 1024,
            "data": {"id": self.next_id(), "name": name, "type": 1, "options": options},
        }

    def subcommand(
        self, group: str, path: list[str], options: list[dict[str, Any]], **kw: Any
    ) -> dict[str, Any]:
        """INTERACTION_CREATE for ``/group sub [sub2] options…`` (subcommand groups nest)."""
        nested: list[dict[str, Any]] = options
        for depth, name in reversed(list(enumerate(path))):
            kind = 1 if depth == len(path) - 1 else 2
            nested = [{"type": kind, "name": name, "options": nested}]
        return self.interaction(group, nested, **kw)

    def component_click(
        self,
        custom_id: str,
        *,
        member_index: int = 1,
        channel_id: str = GENERAL,
        roles: list[str] | None = None,
        message_flags: int = 64,
    ) -> dict[str, Any]:
        """INTERACTION_CREATE type 3: a button (component_type 2) clicked on a bot message."""
        payload = self.interaction("", [], member_index=member_index, channel_id=channel_id)
        if roles is not None:
            payload["member"]["roles"] = roles
        message = self.message(channel_id, {"content": "confirm?", "flags": message_flags})
        message["components"] = [
            {
                "type": 1,
                "components": [{"type": 2, "style": 4, "label": "Confirm", "custom_id": custom_id}],
            }
        ]
        payload.update(
            type=3,
            message=message,
            data={"custom_id": custom_id, "component_type": 2},
        )
        return payload
