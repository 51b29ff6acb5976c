"""DiscordChatExporter JSON → events, for backfilling history.

DiscordChatExporter (Tyrrrz) writes one JSON file per channel or thread:
``guild{id,name}``, ``channel{id,type,categoryId,category,name,topic}``,
``messages[…]`` and ``messageCount``. Each message has ``id``, ``type`` (the
MessageKind name: "Default", "Reply", "GuildMemberJoin", …), ``timestamp`` and
``timestampEdited`` (ISO 8601 with offset), ``content``, ``author{id,name,
nickname,isBot}``, ``mentions[{id,…}]`` and, for replies, ``reference{messageId,
channelId,guildId[,type]}``.

Mapping, consistent with the live translator:

- a thread export (channel type GuildPublicThread / GuildPrivateThread /
  GuildNewsThread) is scoped to its parent channel, which current
  DiscordChatExporter versions write in ``categoryId`` ("category actually refers
  to the parent channel" for threads), with ``thread_id`` = the thread's id;
- speaker name: ``author.nickname`` (the exporter fills it with the member's
  display name) > ``author.name``;
- ``reply_to`` from ``reference.messageId`` when the reference points into the
  same channel and is not a forward; the referenced author joins the addressees
  when that message is in the same file;
- a forward (``forwardedMessage``, written by builds from 2025 on with or without
  ``"type": "Forward"`` on the reference) carries the forwarded words after
  ``[forwarded]`` or ``[forwarded from NAME]`` (`forwarded_text`); the forwarder speaks;
- "GuildMemberJoin" system messages → JOIN in the guild scope (channel "*");
  other system kinds are skipped.

Files are streamed (ijson): the header pass builds only ``guild`` and ``channel`` and
counts the messages, and `events()` parses one message at a time, so a multi-gigabyte
export never sits in memory. The exporter writes messages oldest first; a small reorder
window (`REORDER_WINDOW`) puts locally shuffled ones back in timestamp order.

Files nested deeper than `MAX_JSON_DEPTH` are refused with an error naming them (the
header pass reads basic parse events, so that costs linear time). Folders are read by
`export_folder`, which also places thread files whose ``categoryId`` is a category.

Limits: edits are not flagged (MessageEvent has no edit field; the exported
content is the edited one); attachments, embeds and stickers are not turned into
text (a forward's attachment names are); direct-message exports are not imported.
Malformed messages are skipped and listed in ``errors`` unless ``strict=True``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from speakermem.bot.events import Event, MessageEvent, RosterAction, RosterEvent, Scope
from speakermem.integrations.discord.translate import GUILD_CHANNEL, PLATFORM
from speakermem.integrations.payload import (
    PayloadError,
    build,
    check_text,
    parse_iso,
    req_dict,
    req_str,
)

__all__ = [
    "DiscordExport",
    "DiscordExportChannel",
    "forwarded_text",
    "read_discord_export",
]

log = logging.getLogger(__name__)

THREAD_KINDS = frozenset({"GuildPublicThread", "GuildPrivateThread", "GuildNewsThread", 10, 11, 12})
DIRECT_KINDS = frozenset({"DirectTextChat", "DirectGroupTextChat", 1, 3})
MESSAGE_KINDS = frozenset(
    {"Default", "Reply", "ChatInputCommand", "ContextMenuCommand", 0, 19, 20, 23}
)
JOIN_KINDS = frozenset({"GuildMemberJoin", 7})
MAX_JSON_DEPTH = 64
"""Deepest nesting read; the exporter's own files (a forward's embed's fields in a message
in the list) stay under 10."""
REORDER_WINDOW = 2_000
"""Messages held back to restore timestamp order when an export is locally out of order."""


@dataclass(frozen=True)
class DiscordExportChannel:
    """Where an exported file's messages go: the scope channel and thread (if any)."""

    id: str
    name: str
    kind: str
    channel: str
    """Scope channel: the parent for a thread, else `id`."""
    thread_id: str | None


@dataclass
class DiscordExport:
    """One exported channel or thread; iterate for events in message order."""

    path: Path
    guild_id: str
    guild_name: str
    channel: DiscordExportChannel
    count: int
    strict: bool = False
    errors: list[str] = field(default_factory=list)
    category_id: str | None = None
    """The file's ``channel.categoryId``: a thread's parent (current builds) or a category."""
    _direct: bool = False

    def rescoped(self, parent: str | None) -> DiscordExport:
        """This thread file scoped to `parent` (None: to a channel of its own)."""
        channel = replace(
            self.channel,
            channel=parent or self.channel.id,
            thread_id=self.channel.id if parent else None,
        )
        return replace(self, channel=channel, errors=self.errors)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """Messages and joins in timestamp order, parsed one at a time from the file."""
        if self._direct:
            return
        scope = build(
            Scope,
            "discord export",
            platform=PLATFORM,
            workspace=self.guild_id,
            channel=self.channel.channel,
        )
        guild_scope = scope.model_copy(update={"channel": GUILD_CHANNEL})
        authors: dict[str, str] = {}
        window: list[tuple[datetime, int, MessageEvent | RosterEvent]] = []
        for index, raw in enumerate(self._stream()):
            try:
                event = self._message(raw, scope, guild_scope, authors)
            except (PayloadError, ValueError) as exc:
                where = f"{self.path.name} message {_id_of(raw)}"
                if self.strict:
                    raise PayloadError(f"{where}: {exc}") from exc
                log.warning("skipping %s: %s", where, exc)
                self.errors.append(f"{where}: {exc}")
                continue
            if event is not None:
                when = event.ts if isinstance(event, MessageEvent) else event.at
                heapq.heappush(window, (when, index, event))
                if len(window) > REORDER_WINDOW:
                    yield heapq.heappop(window)[2]
        while window:
            yield heapq.heappop(window)[2]

    def _stream(self) -> Iterator[Any]:
        where = f"discord export {self.path.name}"
        try:
            yield from _items(self.path, "messages.item")
        except ijson.JSONError as exc:
            raise PayloadError(f"{where}: not valid JSON ({_brief(exc)})") from exc

    def _message(
        self, raw: Any, scope: Scope, guild_scope: Scope, authors: dict[str, str]
    ) -> MessageEvent | RosterEvent | None:
        where = "discord export message"
        if not isinstance(raw, dict):
            raise PayloadError(f"{where}: expected an object, got {type(raw).__name__}")
        message_id = req_str(raw, "id", where)
        kind = raw.get("type", "Default")
        author = req_dict(raw, "author", where)
        author_id = req_str(author, "id", where)
        when = parse_iso(raw.get("timestamp"), where)
        name = _name(author) or author_id
        is_bot = bool(author.get("isBot"))
        if kind in JOIN_KINDS:
            return RosterEvent(
                scope=guild_scope,
                action=RosterAction.JOIN,
                user_id=author_id,
                name=name,
                is_bot=is_bot,
                at=when,
            )
        if kind not in MESSAGE_KINDS:
            return None
        text = check_text(raw.get("content") or "", where)
        ref = raw.get("reference")
        forwarded = forwarded_text(raw)
        if forwarded is not None:
            text = check_text("\n".join(t for t in (text, forwarded) if t), where)
        addressees: list[str] = []
        for mention in raw.get("mentions") or []:
            if isinstance(mention, dict) and isinstance(mention.get("id"), str):
                addressees.append(mention["id"])
        reply_to = None
        if isinstance(ref, dict) and forwarded is None and ref.get("type", "Default") != "Forward":
            ref_channel = ref.get("channelId")
            ref_id = ref.get("messageId")
            if isinstance(ref_id, str) and ref_channel in (None, self.channel.id):
                reply_to = ref_id
                if ref_id in authors:
                    addressees.append(authors[ref_id])
        authors[message_id] = author_id
        return build(
            MessageEvent,
            where,
            scope=scope,
            message_id=message_id,
            speaker_id=author_id,
            speaker_name=name,
            text=text,
            ts=when,
            thread_id=self.channel.thread_id,
            reply_to=reply_to,
            addressees=tuple(a for a in dict.fromkeys(addressees) if a != author_id),
            speaker_is_bot=is_bot,
        )


def _snapshot(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The forwarded message's copy: the exporter's ``forwardedMessage`` (2026 builds and
    the 2025 builds that wrote it without ``"type": "Forward"``), or Discord's own
    ``message_snapshots[0].message`` as some builds pass it through."""
    for key in ("forwardedMessage", "forwarded_message"):
        if isinstance(raw.get(key), dict):
            return raw[key]
    for key in ("messageSnapshots", "message_snapshots"):
        snaps = raw.get(key)
        if isinstance(snaps, list) and snaps and isinstance(snaps[0], dict):
            inner = snaps[0].get("message")
            return inner if isinstance(inner, dict) else snaps[0]
    return None


def forwarded_text(raw: dict[str, Any]) -> str | None:
    """``[forwarded from NAME]`` (or ``[forwarded]``) and the forwarded words, for a forward;
    None for any other message. The forwarder stays the speaker: they posted it here."""
    snap = _snapshot(raw)
    ref = raw.get("reference")
    if snap is None and not (isinstance(ref, dict) and ref.get("type") == "Forward"):
        return None
    snap = snap or {}
    author = snap.get("author")
    name = _name(author) if isinstance(author, dict) else None
    label = f"[forwarded from {name}]" if name else "[forwarded]"
    words = snap.get("content") if isinstance(snap.get("content"), str) else ""
    files: list[str] = []
    for a in snap.get("attachments") or []:
        file_name = (a.get("fileName") or a.get("filename")) if isinstance(a, dict) else None
        if isinstance(file_name, str) and file_name:
            files.append(file_name)
    if files:
        words = "\n".join(w for w in (words, "[attached: " + ", ".join(files) + "]") if w)
    return f"{label} {words}".strip()


def _id_of(raw: Any) -> str:
    return str(raw.get("id")) if isinstance(raw, dict) else "?"


def _name(author: dict[str, Any]) -> str | None:
    for candidate in (author.get("nickname"), author.get("name")):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()[:256]
    return None


def read_discord_export(
    path: str | Path, *, strict: bool = False, parent_channel_id: str | None = None
) -> DiscordExport:
    """Parse one DiscordChatExporter JSON file.

    Raises PayloadError when the file is not JSON or lacks ``guild``,
    ``channel`` or ``messages``.
    """
    path = Path(path)
    where = f"discord export {path.name}"
    header = _read_header(path, where)
    guild = req_dict(header.top, "guild", where)
    channel = req_dict(header.top, "channel", where)
    if not header.messages_is_list:
        raise PayloadError(f"{where}: field 'messages' must be a list")
    guild_id = req_str(guild, "id", where)
    channel_id = req_str(channel, "id", where)
    kind = channel.get("type", "GuildTextChat")
    scope_channel, thread_id = channel_id, None
    if kind in THREAD_KINDS:
        parent = parent_channel_id or channel.get("categoryId")
        if isinstance(parent, str) and parent:
            scope_channel, thread_id = parent, channel_id
        else:
            log.warning("%s: thread without a parent id; scoped as its own channel", where)
    direct = kind in DIRECT_KINDS
    if direct:
        log.warning("%s: direct-message export; not imported", where)
    return DiscordExport(
        path=path,
        guild_id=guild_id,
        guild_name=str(guild.get("name") or guild_id),
        channel=DiscordExportChannel(
            id=channel_id,
            name=str(channel.get("name") or channel_id),
            kind=str(kind),
            channel=scope_channel,
            thread_id=thread_id,
        ),
        count=0 if direct else header.count,
        strict=strict,
        category_id=_opt_id(channel.get("categoryId")),
        _direct=direct,
    )


def _opt_id(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


@dataclass
class _Header:
    top: dict[str, Any] = field(default_factory=dict)
    """Top-level fields other than ``messages`` (guild, channel, dateRange, …)."""
    messages_is_list: bool = False
    count: int = 0


def _read_header(path: Path, where: str) -> _Header:
    """One streaming pass: build every top-level value except ``messages``, count those.

    It reads the parser's basic events (no path prefixes, so cost stays linear however
    deep a hostile file nests before `_Depth` stops it) and tracks the level itself.
    Memory stays bounded by the largest single top-level value that is not the message list.
    """
    header = _Header()
    builder: Any = None
    key: str | None = None
    depth = 0
    try:
        for event, value in _parse(path):
            opens = event in ("start_map", "start_array")
            closes = event in ("end_map", "end_array")
            level = depth - 1 if closes else depth  # containers open around this event
            depth += 1 if opens else -1 if closes else 0
            if level == 0 or (level == 1 and event == "map_key"):
                if event == "map_key":
                    key = value
                elif event == "end_map":
                    break
                elif event != "start_map":
                    raise PayloadError(f"{where}: expected a JSON object")
                continue
            if key == "messages":
                if level == 1:
                    header.messages_is_list = event in ("start_array", "end_array")
                elif level == 2 and event not in ("map_key", "end_map", "end_array"):
                    header.count += 1
                continue
            if builder is None:
                builder = ijson.ObjectBuilder()
            builder.event(event, value)
            if level == 1 and not opens:
                header.top[key or ""] = builder.value
                builder = None
    except ijson.JSONError as exc:
        if b"UTF8" in _raw(exc) or b"invalid char" in _raw(exc):
            raise PayloadError(f"{where}: not valid UTF-8 JSON ({_brief(exc)})") from exc
        raise PayloadError(f"{where}: not valid JSON ({_brief(exc)})") from exc
    except OSError as exc:
        raise PayloadError(f"{where}: cannot read ({exc})") from exc
    return header


def _parse(path: Path) -> Iterator[tuple[str, Any]]:
    """ijson's basic parse events for `path` (``(event, value)`` pairs), checked by `_Depth`."""
    depth = _Depth(path)
    for item in _c_then_python(path, lambda backend, fh: backend.basic_parse(fh, use_float=True)):
        depth.see(item[0])
        yield item


def _items(path: Path, prefix: str) -> Iterator[Any]:
    """The values at `prefix`, built by ijson from the file straight (no parse event passes
    through Python: an import reads its file twice as fast). The nesting depth is not checked
    here: `read_discord_export`'s header pass has read the whole file through `_Depth` before
    any message is."""
    return _c_then_python(path, lambda backend, fh: backend.items(fh, prefix, use_float=True))


def _c_then_python(path: Path, read: Callable[[Any, BinaryIO], Iterator[Any]]) -> Iterator[Any]:
    """`read(backend, file)` with ijson's C backend, and with the pure-Python one from where
    the C one fails on an escaped lone surrogate (it decodes those as UTF-8 and raises), so
    that one odd message is skipped as malformed instead of ending the file."""
    done = 0
    try:
        with path.open("rb") as fh:
            for item in read(ijson, fh):
                yield item
                done += 1
        return
    except UnicodeDecodeError:
        log.info("%s: switching to the pure-Python JSON parser at item %d", path.name, done)
    slow = ijson.get_backend("python")
    with path.open("rb") as fh:
        for n, item in enumerate(read(slow, fh)):
            if n >= done:
                yield item


class _Depth:
    """Refuses nesting past `MAX_JSON_DEPTH`: the parser keeps a prefix string per level, so
    a hostile file nested a few thousand deep would otherwise cost gigabytes before any
    error (and a recursive reader would end in RecursionError)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.level = 0

    def see(self, event: str) -> None:
        if event in ("start_map", "start_array"):
            self.level += 1
            if self.level > MAX_JSON_DEPTH:
                raise PayloadError(
                    f"discord export {self.path.name}: JSON nested deeper than "
                    f"{MAX_JSON_DEPTH} levels; not a DiscordChatExporter file"
                )
        elif event in ("end_map", "end_array"):
            self.level -= 1


def _raw(exc: BaseException) -> bytes:
    arg = exc.args[0] if exc.args else b""
    return arg if isinstance(arg, bytes) else str(arg).encode()


def _brief(exc: BaseException) -> str:
    return _raw(exc).decode("utf-8", "replace").splitlines()[0][:120] if exc.args else repr(exc)
