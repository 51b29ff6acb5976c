"""Slack workspace export (a ZIP or the folder it unzips to) → events, for backfilling history.

Slack's live history API is rate-limited for distributed apps (SPEC §6), so
history comes from the admin's export. It holds ``users.json``,
``channels.json`` (public), optionally ``groups.json`` (private) and
``mpims.json``, and one folder per conversation with day files
``<folder>/<YYYY-MM-DD>.json``, each a list of message objects.

What comes out:

1. `rosters()`: one membership snapshot per conversation, the ``members`` listed for it
   less those who join inside the export, applied in one transaction each
   (`MemoryEngine.sync_members`), so an import's cost grows with its messages, not with
   members × channels;
2. `events()`, per conversation and in ``ts`` order (day files are read in date order and
   each is sorted, so memory stays bounded by one day): messages translated as the live
   feed does (`translate.message_event`), thread replies included, bots flagged from
   users.json (a person posting through an app, such as ``/giphy``, stays a person);
   ``channel_join`` / ``channel_leave`` (and the older ``group_*``) as RosterEvents;
   other subtypes skipped. Bot posts whose words sit in blocks, attachments or files
   keep them (`message_text`).

Not imported, and listed so the CLI can say so: direct messages (folders without a
conversation entry) and canvases (``FC_<id>_<name>`` folders or files: the export gives
them no member list, so no one could be allowed to read them). Edits are not flagged
(the export already holds the edited text); deleted messages are absent from exports;
``count`` counts candidate records before validation, so it is an upper bound when some
are malformed. Malformed records are skipped and listed in ``errors`` unless
``strict=True``, which raises PayloadError instead; an export without
channels.json/groups.json, or whose users.json or channel lists are unreadable, raises
PayloadError naming the file.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speakermem.bot.events import Event, RosterAction, RosterEvent, Scope
from speakermem.integrations.payload import PayloadError, build
from speakermem.integrations.slack.export_source import (
    DEFAULT_LIMITS,
    ExportSource,
    ZipLimits,
    check_zip_limits,
    load_json,
    open_source,
)
from speakermem.integrations.slack.translate import (
    MESSAGE_SUBTYPES,
    PLATFORM,
    display_name,
    message_event,
    parse_ts,
)

__all__ = [
    "DEFAULT_LIMITS",
    "ChannelRoster",
    "SkippedFolder",
    "SlackChannel",
    "SlackExport",
    "ZipLimits",
    "check_zip_limits",
    "read_slack_export",
]

log = logging.getLogger(__name__)

_DAY_FILE = re.compile(r"^(?P<folder>.+)/(?P<day>\d{4}-\d{2}-\d{2})\.json$")
_CANVAS = re.compile(r"^FC_(?P<id>[A-Z0-9]+)_(?P<name>.*?)(?:\.json)?$")
_JOIN_SUBTYPES = {"channel_join": RosterAction.JOIN, "group_join": RosterAction.JOIN}
_LEAVE_SUBTYPES = {"channel_leave": RosterAction.LEAVE, "group_leave": RosterAction.LEAVE}
_ROSTER_SUBTYPES = {**_JOIN_SUBTYPES, **_LEAVE_SUBTYPES}


@dataclass(frozen=True)
class SlackChannel:
    """One exported conversation: id, folder name, current members, privacy."""

    id: str
    name: str
    members: tuple[str, ...] = ()
    is_private: bool = False
    created: datetime | None = None


@dataclass(frozen=True)
class ChannelRoster:
    """Who was in a conversation before the export starts: one snapshot to apply at once."""

    scope: Scope
    members: list[tuple[str, str | None, bool]]
    """(user id, display name or None, is_bot), as `MemoryEngine.sync_members` takes them."""
    at: datetime | None


@dataclass(frozen=True)
class SkippedFolder:
    """Part of the export that is not imported, and why (reported by the CLI)."""

    name: str
    kind: str
    """"canvas" or "direct message"."""
    files: int


@dataclass
class SlackExport:
    """A parsed export: metadata up front, events streamed from the export on demand."""

    path: Path
    team_id: str
    users: dict[str, str]
    """user id → display name (bots included, also under their ``B…`` bot id)."""
    bots: frozenset[str]
    channels: list[SlackChannel]
    count: int
    """Records `events()` will try to yield (upper bound when some are malformed)."""
    strict: bool = False
    errors: list[str] = field(default_factory=list)
    """Skipped malformed records, 'file: reason', filled while iterating."""
    skipped: list[SkippedFolder] = field(default_factory=list)
    """Canvases and direct messages found in the export and not imported."""
    _prefix: str = ""
    _days: dict[str, list[str]] = field(default_factory=dict)
    _joined_in_export: dict[str, set[str]] = field(default_factory=dict)
    _limits: ZipLimits = DEFAULT_LIMITS

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def _scope(self, channel: SlackChannel) -> Scope:
        return build(
            Scope, "slack export", platform=PLATFORM, workspace=self.team_id, channel=channel.id
        )

    def rosters(self) -> list[ChannelRoster]:
        """Each conversation's members from before the export (those who join inside it
        come from their join messages), dated at the channel's creation, else its first
        day file."""
        out = []
        for channel in self.channels:
            later = self._joined_in_export.get(channel.name, set())
            days = self._days.get(channel.name)
            at = channel.created or (_day_start(days[0]) if days else None)
            members = [
                (m, self.users.get(m), m in self.bots) for m in channel.members if m not in later
            ]
            out.append(ChannelRoster(scope=self._scope(channel), members=members, at=at))
        return out

    def events(self) -> Iterator[Event]:
        """Messages and in-export joins and leaves, conversation by conversation, in ts order."""
        source = open_source(self.path, self._limits)
        try:
            for channel in self.channels:
                yield from self._channel_events(source, channel)
        finally:
            source.close()

    def _fail(self, where: str, exc: Exception) -> None:
        message = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
        if self.strict:
            raise PayloadError(message) from exc
        log.warning("skipping %s", message)
        self.errors.append(message)

    def _channel_events(self, source: ExportSource, channel: SlackChannel) -> Iterator[Event]:
        scope = self._scope(channel)
        parent_authors: dict[str, str] = {}
        for day_file in self._days.get(channel.name, []):
            try:
                records = load_json(source, self._prefix + day_file, self._limits)
            except PayloadError as exc:
                self._fail(day_file, exc)
                continue
            if not isinstance(records, list):
                self._fail(day_file, PayloadError("day file is not a list"))
                continue
            for msg in sorted(
                (r for r in records if isinstance(r, dict)), key=lambda r: _ts_key(r.get("ts"))
            ):
                event = self._record(msg, channel, scope, parent_authors, day_file)
                if event is not None:
                    yield event

    def _record(
        self,
        msg: dict[str, Any],
        channel: SlackChannel,
        scope: Scope,
        parent_authors: dict[str, str],
        where: str,
    ) -> Event | None:
        if msg.get("type", "message") != "message":
            return None
        subtype = msg.get("subtype")
        try:
            if subtype in _ROSTER_SUBTYPES:
                user = msg.get("user")
                if not isinstance(user, str) or not user:
                    raise PayloadError(f"{subtype} without a user")
                action = _ROSTER_SUBTYPES[subtype]
                return RosterEvent(
                    scope=scope,
                    action=action,
                    user_id=user,
                    name=self.users.get(user) if action == RosterAction.JOIN else None,
                    is_bot=user in self.bots,
                    at=parse_ts(msg.get("ts"), where),
                )
            if subtype not in MESSAGE_SUBTYPES:
                return None
            event = message_event(
                msg,
                team=self.team_id,
                channel=channel.id,
                user_names=self.users,
                parent_authors=parent_authors,
                user_bots=self.bots,
            )
        except (PayloadError, ValueError) as exc:
            self._fail(f"{where} ts={msg.get('ts')!r}", exc)
            return None
        if event.speaker_id in self.bots and not event.speaker_is_bot:
            event = event.model_copy(update={"speaker_is_bot": True})
        parent_authors.setdefault(event.message_id, event.speaker_id)
        return event


def _ts_key(ts: Any) -> tuple[float, str]:
    try:
        return (float(ts), str(ts))
    except (TypeError, ValueError):
        return (float("inf"), str(ts))


def _day_start(day_file: str) -> datetime | None:
    m = _DAY_FILE.match(day_file)
    try:
        return datetime.strptime(m["day"], "%Y-%m-%d").replace(tzinfo=UTC) if m else None
    except ValueError:
        return None


def _created(value: Any) -> datetime | None:
    """A channel's ``created``: seconds since the epoch, a number or (old exports) a string."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _optional_list(
    source: ExportSource, names: set[str], name: str, limits: ZipLimits
) -> list[dict[str, Any]] | None:
    if name not in names:
        return None
    data = load_json(source, name, limits)
    if not isinstance(data, list):
        raise PayloadError(f"{name}: expected a list")
    return [d for d in data if isinstance(d, dict)]


def _channels(entries: list[dict[str, Any]], private: bool) -> list[SlackChannel]:
    out = []
    for c in entries:
        cid, name = c.get("id"), c.get("name")
        if not isinstance(cid, str) or not isinstance(name, str) or not cid or not name:
            log.warning("skipping channel entry without id/name: %r", c.get("id"))
            continue
        members = c.get("members") or []
        out.append(
            SlackChannel(
                id=cid,
                name=name,
                members=tuple(dict.fromkeys(m for m in members if isinstance(m, str) and m)),
                is_private=private,
                created=_created(c.get("created")),
            )
        )
    return out


def _users(
    users_raw: list[dict[str, Any]],
) -> tuple[dict[str, str], set[str], Counter[str]]:
    """Names (bots also under their bot id), the bots' ids, and the users' teams."""
    users: dict[str, str] = {}
    bots: set[str] = set()
    user_teams: Counter[str] = Counter()
    for u in users_raw:
        uid = u.get("id")
        if not isinstance(uid, str) or not uid:
            continue
        name = display_name(u)
        if name:
            users[uid] = name
        if u.get("is_bot") or uid == "USLACKBOT":
            bots.add(uid)
            profile = u.get("profile")
            if isinstance(profile, dict) and isinstance(profile.get("bot_id"), str):
                bots.add(profile["bot_id"])
                if name:
                    users.setdefault(profile["bot_id"], name)
        if isinstance(u.get("team_id"), str):
            user_teams[u["team_id"]] += 1
    return users, bots, user_teams


def _not_imported(folders: dict[str, int], top_files: list[str]) -> list[SkippedFolder]:
    """Canvases (``FC_…`` folders or files) and the other unlisted folders (direct
    messages), with how many files each holds."""
    out = [
        SkippedFolder(name, "canvas" if _CANVAS.match(name) else "direct message", files)
        for name, files in sorted(folders.items())
    ]
    out += [SkippedFolder(name, "canvas", 1) for name in sorted(top_files) if _CANVAS.match(name)]
    for item in out:
        log.info("export %s %s (%d files) not imported", item.kind, item.name, item.files)
    return out


def read_slack_export(
    path: str | Path,
    *,
    workspace: str = "export",
    strict: bool = False,
    limits: ZipLimits = DEFAULT_LIMITS,
) -> SlackExport:
    """Open an export ZIP or folder and index it; iterate the result for events.

    The team id comes from the messages' ``team`` field (the most common one),
    else the users' ``team_id``, else `workspace`.
    """
    path = Path(path)
    source = open_source(path, limits)
    try:
        return _index(source, path, workspace, strict, limits)
    finally:
        source.close()


def _index(
    source: ExportSource, path: Path, workspace: str, strict: bool, limits: ZipLimits
) -> SlackExport:
    names = source.names()
    anchors = [n for n in names if n.endswith(("channels.json", "groups.json"))]
    anchors = [n for n in anchors if n.count("/") <= 1]
    if not anchors:
        raise PayloadError(f"{path}: no channels.json or groups.json: not a Slack export")
    prefix = min(anchors, key=len).rpartition("/")[0]
    prefix = prefix + "/" if prefix else ""
    present = set(names)

    users, bots, user_teams = _users(
        _optional_list(source, present, prefix + "users.json", limits) or []
    )
    channels: list[SlackChannel] = []
    for listing, private in (("channels.json", False), ("groups.json", True), ("mpims.json", True)):
        channels += _channels(
            _optional_list(source, present, prefix + listing, limits) or [], private=private
        )

    days: dict[str, list[str]] = {}
    top_files: list[str] = []
    for n in names:
        if not n.startswith(prefix):
            continue
        rel = n[len(prefix) :]
        m = _DAY_FILE.match(rel)
        if m:
            days.setdefault(m["folder"], []).append(rel)
        elif "/" not in rel:
            top_files.append(rel)
        elif _CANVAS.match(rel.partition("/")[0]):
            days.setdefault(rel.partition("/")[0], []).append(rel)
    for files in days.values():
        files.sort()

    known = {c.name for c in channels}
    skipped = _not_imported(
        {name: len(files) for name, files in days.items() if name not in known}, top_files
    )

    # Pre-pass: count candidate records, find the team, and who joins inside the export.
    count = 0
    teams: Counter[str] = Counter()
    joined: dict[str, set[str]] = {}
    for channel in channels:
        for day_file in days.get(channel.name, []):
            try:
                records = load_json(source, prefix + day_file, limits)
            except PayloadError:
                if strict:
                    raise
                continue  # reported again, with context, while iterating
            if not isinstance(records, list):
                continue
            for r in records:
                if not isinstance(r, dict):
                    continue
                subtype = r.get("subtype")
                if subtype in _JOIN_SUBTYPES and isinstance(r.get("user"), str):
                    joined.setdefault(channel.name, set()).add(r["user"])
                if subtype in _ROSTER_SUBTYPES or subtype in MESSAGE_SUBTYPES:
                    count += 1
                if isinstance(r.get("team"), str) and r["team"]:
                    teams[r["team"]] += 1

    team_id = (teams or user_teams or Counter({workspace: 1})).most_common(1)[0][0]
    log.info(
        "slack export %s: team %s, %d users, %d conversations, about %d records",
        path.name,
        team_id,
        len(users),
        len(channels),
        count,
    )
    return SlackExport(
        path=path,
        team_id=team_id,
        users=users,
        bots=frozenset(bots),
        channels=channels,
        count=count,
        strict=strict,
        skipped=skipped,
        _prefix=prefix,
        _days=days,
        _joined_in_export=joined,
        _limits=limits,
    )
