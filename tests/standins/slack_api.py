"""A local stand-in for Slack's Web API, response_url and Socket Mode websocket.

Build ``AsyncWebClient(token=..., base_url=standin.base_url)`` and pass it to
``AsyncApp(client=...)``; slack-bolt and ``AsyncSocketModeHandler`` then talk to
this server only. Arguments are accepted as query string, form or JSON, and
every call lands in `calls` as ``(method, args)``.

`users` entries are returned by users.info as given (``is_admin``, ``is_owner``…), and
`private` channels are ``is_private`` in conversations.info. `fail(method)` makes the
next call(s) answer ``ok: false``.

Supported methods: auth.test, conversations.members (cursor pagination,
`page_size` per page unless ``limit`` is smaller), conversations.info,
users.info, users.list (paged like conversations.members), chat.getPermalink,
chat.postMessage, chat.postEphemeral, conversations.history and conversations.replies
(a message list per channel in `history`, added with `add_message`; newest first /
thread oldest first, ``oldest``/``latest``/``inclusive``, cursor paging capped at
`history_page_size`; `delete_message`, `edit_message` and `delete_channel` change them as
Slack does: a deleted parent with replies stays as a ``tombstone``, an edit carries ``edited``,
a deleted channel is ``channel_not_found``),
apps.connections.open (returns ``ws://…/socket``). `rate_limit(method)` makes the
next call(s) answer 429 with ``Retry-After``; `cap_history` limits history reads the way
Slack does for some apps (one call a minute per method, short pages).
``/response/{key}`` records what ``respond()`` posts. The socket sends ``hello`` then
queued envelopes and records the acks.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import WSMsgType, web

log = logging.getLogger(__name__)

TEAM_ID = "T0STANDIN"
BOT_USER_ID = "U0BOTUSER"
BOT_ID = "B0BOTID01"


def sign(secret: str, timestamp: int | str, body: str | bytes) -> dict[str, str]:
    """Slack request-signing headers: ``v0=`` HMAC-SHA256 of ``v0:{ts}:{body}``."""
    raw = body.encode() if isinstance(body, str) else body
    base = b"v0:" + str(timestamp).encode() + b":" + raw
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


def signed_headers(secret: str, body: str | bytes, *, content_type: str) -> dict[str, str]:
    """`sign` with the current time plus a Content-Type, for posting to bolt."""
    return {**sign(secret, int(time.time()), body), "Content-Type": content_type}


class SlackApiStandIn:
    """Web API + response_url + Socket Mode on 127.0.0.1; see the module docstring."""

    def __init__(
        self,
        *,
        team_id: str = TEAM_ID,
        users: dict[str, dict[str, Any]] | None = None,
        members: dict[str, list[str]] | None = None,
        page_size: int = 2,
        private: set[str] | None = None,
        history_page_size: int = 1000,
    ) -> None:
        self.team_id = team_id
        self.users = users if users is not None else {}
        self.members = members if members is not None else {}
        self.page_size = page_size
        self.private = private if private is not None else set()
        """Channels conversations.info reports as ``is_private``."""
        self.history: dict[str, list[dict[str, Any]]] = {}
        """channel -> every message posted there (top level and thread replies)."""
        self.history_page_size = history_page_size
        self._history_ts = itertools.count(1)
        self._failures: dict[str, list[str]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.call_times: list[float] = []
        """time.monotonic() at which each Web API call arrived (beside `calls`)."""
        self.peers: list[Any] = []
        """The client's (host, port) of each Web API call, in order: one port = one connection."""
        self.posted: list[dict[str, Any]] = []
        self.responses: list[tuple[str, dict[str, Any]]] = []
        self.response_peers: list[Any] = []
        """The client's (host, port) of each response_url post, in order."""
        self.acks: list[dict[str, Any]] = []
        self.socket_connections = 0
        self._rate_limits: dict[str, list[int]] = {}
        self._caps: dict[str, float] = {}
        """method -> seconds between two calls it serves (`cap_history`)."""
        self._served: dict[str, float] = {}
        self._holds: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}
        self._envelopes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._ack_event = asyncio.Condition()
        self._hello_sent = asyncio.Event()
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> SlackApiStandIn:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_route("POST", "/response/{key}", self._response)
        app.router.add_route("GET", "/socket", self._socket)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def response_url(self, key: str = "r1") -> str:
        return f"http://127.0.0.1:{self.port}/response/{key}"

    def rate_limit(self, method: str, *, retry_after: int = 1, times: int = 1) -> None:
        """Answer the next `times` calls of `method` with 429 and ``Retry-After``."""
        self._rate_limits.setdefault(method, []).extend([retry_after] * times)

    def cap_history(self, *, interval_s: float = 60.0, page: int = 15) -> None:
        """Slack's limits on conversations.history and .replies for commercially distributed
        apps outside the Marketplace: one call per `interval_s` per method (a call sooner is
        answered 429 with ``Retry-After: interval_s``) and at most `page` messages a page."""
        for method in ("conversations.history", "conversations.replies"):
            self._caps[method] = interval_s
            self._served.pop(method, None)
        self.history_page_size = page

    def hold(self, method: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Hold calls of `method` until released: returns (entered, release) events; a call
        sets `entered` and waits for `release` (so a test can act while a handler is in
        flight)."""
        pair = (asyncio.Event(), asyncio.Event())
        self._holds[method] = pair
        return pair

    def fail(self, method: str, error: str = "internal_error", *, times: int = 1) -> None:
        """Answer the next `times` calls of `method` with ``{"ok": false, "error": error}``."""
        self._failures.setdefault(method, []).extend([error] * times)

    def method_calls(self, method: str) -> list[dict[str, Any]]:
        return [args for name, args in self.calls if name == method]

    # --- Web API ---------------------------------------------------------------------------

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    args.update(body)
            else:
                args.update(dict(await request.post()))
        return args

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await self._args(request)
        self.calls.append((method, args))
        self.call_times.append(time.monotonic())
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        held = self._holds.get(method)
        if held is not None:
            held[0].set()
            await held[1].wait()
        failing = self._failures.get(method)
        if failing:
            return web.json_response({"ok": False, "error": failing.pop(0)})
        cap = self._caps.get(method)
        if cap is not None:
            now = time.monotonic()
            last = self._served.get(method)
            if last is not None and now - last < cap:
                return web.json_response(
                    {"ok": False, "error": "ratelimited"},
                    status=429,
                    headers={"Retry-After": str(int(cap))},
                )
            self._served[method] = now
        pending = self._rate_limits.get(method)
        if pending:
            retry_after = pending.pop(0)
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(retry_after)},
            )
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            log.warning("slack stand-in: unknown method %s", method)
            return web.json_response({"ok": False, "error": "unknown_method"})
        return web.json_response(handler(args))

    def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://standin.slack.invalid/",
            "team": "Stand-in",
            "user": "speakermem",
            "team_id": self.team_id,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _m_conversations_members(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = args.get("channel")
        if channel not in self.members:
            return {"ok": False, "error": "channel_not_found"}
        everyone = self.members[channel]
        start = int(args.get("cursor") or 0)
        size = min(self.page_size, int(args.get("limit") or self.page_size))
        page = everyone[start : start + size]
        nxt = start + size if start + size < len(everyone) else None
        return {
            "ok": True,
            "members": page,
            "response_metadata": {"next_cursor": str(nxt) if nxt is not None else ""},
        }

    def _m_conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = args.get("channel")
        if channel not in self.members and channel not in self.history:
            return {"ok": False, "error": "channel_not_found"}
        return {
            "ok": True,
            "channel": {
                "id": channel,
                "name": channel.lower(),
                "is_member": True,
                "is_private": channel in self.private,
            },
        }

    # --- channel history ---------------------------------------------------------------------

    def add_message(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U0ALICE",
        at: float | None = None,
        thread_ts: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Post a message into `channel`'s history (a reply when `thread_ts` is given).

        Its ts is `at` (default: now) plus a unique microsecond counter, so ts order is post
        order for equal `at`. Returns the message as history will list it."""
        base = int(at if at is not None else time.time())
        ts = f"{base}.{next(self._history_ts):06d}"
        msg: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": ts, **extra}
        if thread_ts is not None:
            msg["thread_ts"] = thread_ts
            parent = next((m for m in self.history.get(channel, []) if m["ts"] == thread_ts), None)
            if parent is not None:
                msg["parent_user_id"] = parent.get("user")
        self.history.setdefault(channel, []).append(msg)
        return msg

    def _find(self, channel: str, ts: str) -> dict[str, Any]:
        return next(m for m in self.history.get(channel, []) if m["ts"] == ts)

    def delete_message(self, channel: str, ts: str) -> None:
        """Delete a message: gone from history, or, for a thread parent that has replies,
        left as a ``tombstone`` (what Slack shows as "This message was deleted.")."""
        msg = self._find(channel, ts)
        if self._thread(channel, ts):
            msg.clear()
            msg.update(
                type="message",
                subtype="tombstone",
                text="This message was deleted.",
                ts=ts,
                thread_ts=ts,
                user="USLACKBOT",
                hidden=True,
            )
        else:
            self.history[channel].remove(msg)

    def edit_message(
        self, channel: str, ts: str, text: str, *, at: float | None = None
    ) -> dict[str, Any]:
        """Edit a message's text; it carries ``edited`` ({user, ts}) from then on."""
        msg = self._find(channel, ts)
        edited_ts = f"{int(at if at is not None else time.time())}.000000"
        msg.update(text=text, edited={"user": msg.get("user"), "ts": edited_ts})
        return msg

    def delete_channel(self, channel: str) -> None:
        """Delete a channel: its history and members go; it is ``channel_not_found``."""
        self.history.pop(channel, None)
        self.members.pop(channel, None)

    @staticmethod
    def _flag(value: Any) -> bool:
        return str(value).lower() in ("1", "true")

    @staticmethod
    def _in_range(ts: str, args: dict[str, Any]) -> bool:
        value = float(ts)
        inclusive = SlackApiStandIn._flag(args.get("inclusive"))
        oldest, latest = args.get("oldest"), args.get("latest")
        if oldest not in (None, ""):
            o = float(oldest)
            if value < o or (value == o and not inclusive):
                return False
        if latest not in (None, ""):
            la = float(latest)
            if value > la or (value == la and not inclusive):
                return False
        return True

    def _page(self, items: list[dict[str, Any]], args: dict[str, Any], key: str) -> dict[str, Any]:
        start = int(args.get("cursor") or 0)
        size = min(self.history_page_size, int(args.get("limit") or 100))
        page = items[start : start + size]
        more = start + size < len(items)
        return {
            "ok": True,
            key: page,
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + size) if more else ""},
        }

    def _thread(self, channel: str, parent_ts: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.history.get(channel, [])
            if m.get("thread_ts") == parent_ts and m["ts"] != parent_ts
        ]

    def _m_conversations_history(self, args: dict[str, Any]) -> dict[str, Any]:
        """Top-level messages (and thread broadcasts) in range, newest first; parents carry
        reply_count / latest_reply like Slack's."""
        channel = args.get("channel")
        if channel not in self.history and channel not in self.members:
            return {"ok": False, "error": "channel_not_found"}
        threads: dict[str, list[dict[str, Any]]] = {}
        for m in self.history.get(channel, []):
            if m.get("thread_ts") not in (None, m["ts"]):
                threads.setdefault(m["thread_ts"], []).append(m)
        top = []
        for m in self.history.get(channel, []):
            is_reply = m.get("thread_ts") not in (None, m["ts"])
            if is_reply and m.get("subtype") != "thread_broadcast":
                continue
            if not self._in_range(m["ts"], args):
                continue
            replies = threads.get(m["ts"], []) if not is_reply else []
            if replies:
                m = {
                    **m,
                    "thread_ts": m["ts"],
                    "reply_count": len(replies),
                    "reply_users": sorted({r.get("user") for r in replies if r.get("user")}),
                    "latest_reply": max((r["ts"] for r in replies), key=float),
                }
            top.append(m)
        top.sort(key=lambda m: float(m["ts"]), reverse=True)
        return self._page(top, args, "messages")

    def _m_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        """A thread oldest first: the parent (always, like Slack), then replies in range."""
        channel, parent_ts = args.get("channel"), args.get("ts")
        parent = next((m for m in self.history.get(str(channel), []) if m["ts"] == parent_ts), None)
        if parent is None:
            return {"ok": False, "error": "thread_not_found"}
        replies = [
            r for r in self._thread(str(channel), str(parent_ts)) if self._in_range(r["ts"], args)
        ]
        replies.sort(key=lambda m: float(m["ts"]))
        return self._page([parent, *replies], args, "messages")

    def _m_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        """Every user in `users`, cursor-paged like conversations.members."""
        everyone = list(self.users)
        start = int(args.get("cursor") or 0)
        size = min(self.page_size, int(args.get("limit") or self.page_size))
        page = everyone[start : start + size]
        nxt = start + size if start + size < len(everyone) else None
        return {
            "ok": True,
            "members": [{"id": u, "team_id": self.team_id, **self.users[u]} for u in page],
            "response_metadata": {"next_cursor": str(nxt) if nxt is not None else ""},
        }

    def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        uid = args.get("user")
        if uid not in self.users:
            return {"ok": False, "error": "user_not_found"}
        user = {"id": uid, "team_id": self.team_id, **self.users[uid]}
        if str(args.get("include_locale", "")).lower() not in {"true", "1"}:
            user.pop("locale", None)  # Slack sends it only when asked
        return {"ok": True, "user": user}

    def _m_chat_getPermalink(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = args.get("channel"), str(args.get("message_ts", ""))
        return {
            "ok": True,
            "channel": channel,
            "permalink": f"https://standin.slack.invalid/archives/{channel}/p{ts.replace('.', '')}",
        }

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        self.posted.append(args)
        return {
            "ok": True,
            "channel": args.get("channel"),
            "ts": ts,
            "message": {
                "type": "message",
                "text": args.get("text", ""),
                "ts": ts,
                "user": BOT_USER_ID,
                "bot_id": BOT_ID,
            },
        }

    def _m_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        self.posted.append({**args, "ephemeral": True})
        return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}

    def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4()}"}

    # --- response_url ----------------------------------------------------------------------

    async def _response(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"raw": raw.decode(errors="replace")}
        self.responses.append((request.match_info["key"], body))
        self.response_peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        return web.Response(text="ok")

    # --- Socket Mode -----------------------------------------------------------------------

    def queue_envelope(
        self, kind: str, payload: dict[str, Any], *, accepts_response_payload: bool = False
    ) -> str:
        """Queue an envelope of `kind` (slash_commands, events_api, interactive); return its id."""
        envelope_id = str(uuid.uuid4())
        self._envelopes.put_nowait(
            {
                "envelope_id": envelope_id,
                "type": kind,
                "payload": payload,
                "accepts_response_payload": accepts_response_payload,
                "retry_attempt": 0,
                "retry_reason": "",
            }
        )
        return envelope_id

    async def wait_for_ack(self, envelope_id: str, wait_s: float = 5.0) -> dict[str, Any]:
        """The client's ack for `envelope_id`."""

        def found() -> dict[str, Any] | None:
            return next((a for a in self.acks if a.get("envelope_id") == envelope_id), None)

        async with self._ack_event:
            await asyncio.wait_for(self._ack_event.wait_for(lambda: found() is not None), wait_s)
        ack = found()
        assert ack is not None
        return ack

    async def drop_sockets(self) -> int:
        """Close every Socket Mode connection from the server side (the client reconnects
        with a new ``apps.connections.open``); returns how many were open."""
        open_now = list(self._sockets)
        for ws in open_now:
            await ws.close()
        return len(open_now)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.add(ws)
        self.socket_connections += 1
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {"host": "standin", "approximate_connection_time": 3600},
                    "connection_info": {"app_id": "A0STANDIN"},
                }
            )
        )
        sender = asyncio.create_task(self._send_envelopes(ws))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except json.JSONDecodeError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    async with self._ack_event:
                        self.acks.append(data)
                        self._ack_event.notify_all()
        finally:
            sender.cancel()
            self._sockets.discard(ws)
        return ws

    async def _send_envelopes(self, ws: web.WebSocketResponse) -> None:
        while not ws.closed:
            envelope = await self._envelopes.get()
            if ws.closed:
                self._envelopes.put_nowait(envelope)
                return
            await ws.send_str(json.dumps(envelope))
