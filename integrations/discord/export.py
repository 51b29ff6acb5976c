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
- "GuildMemberJoin" system messages → JOIN in the guild scope (channel "*");
  other system kinds are skipped.

Limits: edits are not flagged (MessageEvent has no edit field; the exported
content is the edited one); attachments, embeds and stickers are not turned into
text; direct-message exports are not imported; a thread export from old exporter
versions, whose ``categoryId`` is the category rather than the parent channel,
gets the wrong parent — pass `parent_channel_id` to override. Malformed messages
are skipped and listed in ``errors`` unless ``strict=True``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.events import Event, MessageEvent, RosterAction, RosterEvent, Scope
from integrations.discord.translate import GUILD_CHANNEL, PLATFORM
from integrations.payload import (
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
    "read_discord_export",
    "read_discord_export_dir",
]

log = logging.getLogger(__name__)

THREAD_KINDS = frozenset({"GuildPublicThread", "GuildPrivateThread", "GuildNewsThread", 10, 11, 12})
DIRECT_KINDS = frozenset({"DirectTextChat", "DirectGroupTextChat", 1, 3})
MESSAGE_KINDS = frozenset(
    {"Default", "Reply", "ChatInputCommand", "ContextMenuCommand", 0, 19, 20, 23}
)
JOIN_KINDS = frozenset({"GuildMemberJoin", 7})


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
    _messages: list[Any] = field(default_factory=list, repr=False)
    _direct: bool = False

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """Messages and joins in timestamp order (the exporter writes them oldest first)."""
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
        parsed: list[tuple[datetime, int, MessageEvent | RosterEvent]] = []
        for index, raw in enumerate(self._messages):
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
                parsed.append((when, index, event))
        parsed.sort(key=lambda item: (item[0], item[1]))
        for _when, _index, event in parsed:
            yield event

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
        addressees: list[str] = []
        for mention in raw.get("mentions") or []:
            if isinstance(mention, dict) and isinstance(mention.get("id"), str):
                addressees.append(mention["id"])
        reply_to = None
        ref = raw.get("reference")
        if isinstance(ref, dict) and ref.get("type", "Default") != "Forward":
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
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{where}: not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    guild = req_dict(data, "guild", where)
    channel = req_dict(data, "channel", where)
    messages = data.get("messages")
    if not isinstance(messages, list):
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
        count=0 if direct else len(messages),
        strict=strict,
        _messages=messages,
        _direct=direct,
    )


def read_discord_export_dir(path: str | Path, *, strict: bool = False) -> list[DiscordExport]:
    """Every ``*.json`` export in a folder (one per channel/thread), by file name."""
    return [read_discord_export(p, strict=strict) for p in sorted(Path(path).glob("*.json"))]
