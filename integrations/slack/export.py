"""Slack workspace export (ZIP) → events, for backfilling history.

Slack's live history API is rate-limited for distributed apps (SPEC §6), so
history comes from the admin's export. The ZIP holds ``users.json``,
``channels.json`` (public), optionally ``groups.json`` (private) and
``mpims.json``, and one folder per conversation with day files
``<folder>/<YYYY-MM-DD>.json``, each a list of message objects.

What comes out, per conversation and in ``ts`` order (day files are read in date
order and each is sorted, so memory stays bounded by one day):

1. JOIN for each member listed in the channel's ``members`` who has no
   ``channel_join`` message in the export (they were there before it starts),
   dated at the channel's ``created`` time;
2. messages translated exactly as the live feed does (`translate.message_event`),
   thread replies included, bot messages flagged; ``channel_join`` /
   ``channel_leave`` (and the older ``group_*``) as RosterEvents; other subtypes
   skipped.

Limits: direct messages (``dms.json``, folders named by id) are not imported;
edits are not flagged (the export already holds the edited text and
MessageEvent has no edit field); deleted messages are absent from exports;
``count`` counts candidate records before validation, so it is an upper bound
when some are malformed. Malformed records are skipped and listed in
``errors`` unless ``strict=True``, which raises PayloadError instead; a ZIP
without channels.json/groups.json raises PayloadError.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.events import Event, RosterAction, RosterEvent, Scope
from integrations.payload import PayloadError, build
from integrations.slack.translate import (
    MESSAGE_SUBTYPES,
    PLATFORM,
    display_name,
    message_event,
    parse_ts,
)

__all__ = ["DEFAULT_LIMITS", "SlackChannel", "SlackExport", "ZipLimits", "read_slack_export"]

log = logging.getLogger(__name__)

_DAY_FILE = re.compile(r"^(?P<folder>.+)/(?P<day>\d{4}-\d{2}-\d{2})\.json$")
_JOIN_SUBTYPES = {"channel_join": RosterAction.JOIN, "group_join": RosterAction.JOIN}
_LEAVE_SUBTYPES = {"channel_leave": RosterAction.LEAVE, "group_leave": RosterAction.LEAVE}
_ROSTER_SUBTYPES = {**_JOIN_SUBTYPES, **_LEAVE_SUBTYPES}


@dataclass(frozen=True)
class ZipLimits:
    """What an export ZIP may hold before we refuse it (checked from the central directory
    before anything is decompressed; zipfile then enforces each entry's declared size).

    A real export is one small day file per channel per day: a ten-year, 1,000-channel
    workspace is under 4 million entries of a few kB to a few MB each."""

    max_entries: int = 5_000_000
    max_entry_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 32 * 1024**3


DEFAULT_LIMITS = ZipLimits()


@dataclass(frozen=True)
class SlackChannel:
    """One exported conversation: id, folder name, current members, privacy."""

    id: str
    name: str
    members: tuple[str, ...] = ()
    is_private: bool = False
    created: datetime | None = None


@dataclass
class SlackExport:
    """A parsed export: metadata up front, events streamed from the ZIP on demand."""

    path: Path
    team_id: str
    users: dict[str, str]
    """user id → display name (bots included)."""
    bots: frozenset[str]
    channels: list[SlackChannel]
    count: int
    """Records `events()` will try to yield (upper bound when some are malformed)."""
    strict: bool = False
    errors: list[str] = field(default_factory=list)
    """Skipped malformed records, 'file: reason', filled while iterating."""
    _prefix: str = ""
    _days: dict[str, list[str]] = field(default_factory=dict)
    _joined_in_export: dict[str, set[str]] = field(default_factory=dict)
    _limits: ZipLimits = DEFAULT_LIMITS

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """All events, conversation by conversation, each in ts order."""
        with zipfile.ZipFile(self.path) as zf:
            for channel in self.channels:
                yield from self._channel_events(zf, channel)

    def _fail(self, where: str, exc: Exception) -> None:
        message = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
        if self.strict:
            raise PayloadError(message) from exc
        log.warning("skipping %s", message)
        self.errors.append(message)

    def _channel_events(self, zf: zipfile.ZipFile, channel: SlackChannel) -> Iterator[Event]:
        scope = build(
            Scope, "slack export", platform=PLATFORM, workspace=self.team_id, channel=channel.id
        )
        joined_later = self._joined_in_export.get(channel.name, set())
        start = channel.created or datetime.fromtimestamp(0, tz=UTC)
        for member in channel.members:
            if member not in joined_later:
                yield RosterEvent(
                    scope=scope,
                    action=RosterAction.JOIN,
                    user_id=member,
                    name=self.users.get(member),
                    is_bot=member in self.bots,
                    at=start,
                )
        parent_authors: dict[str, str] = {}
        for day_file in self._days.get(channel.name, []):
            try:
                records = _load_json(zf, self._prefix + day_file, self._limits)
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


def _load_json(zf: zipfile.ZipFile, name: str, limits: ZipLimits = DEFAULT_LIMITS) -> Any:
    info = zf.getinfo(name)
    if info.file_size > limits.max_entry_bytes:
        raise PayloadError(
            f"{name}: {info.file_size:,} bytes uncompressed is over the per-file limit of "
            f"{limits.max_entry_bytes:,} (no real export file is that large)"
        )
    raw = zf.read(info)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{name}: not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def _optional_list(
    zf: zipfile.ZipFile, name: str, limits: ZipLimits
) -> list[dict[str, Any]] | None:
    try:
        zf.getinfo(name)
    except KeyError:
        return None
    data = _load_json(zf, name, limits)
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
        created = c.get("created")
        out.append(
            SlackChannel(
                id=cid,
                name=name,
                members=tuple(dict.fromkeys(m for m in members if isinstance(m, str) and m)),
                is_private=private,
                created=datetime.fromtimestamp(created, tz=UTC)
                if isinstance(created, int | float) and not isinstance(created, bool)
                else None,
            )
        )
    return out


def check_zip_limits(path: Path, zf: zipfile.ZipFile, limits: ZipLimits) -> None:
    """Refuse a ZIP over `limits` (entry count, any entry's size, the total), naming which."""
    infos = zf.infolist()
    if len(infos) > limits.max_entries:
        raise PayloadError(
            f"{path.name}: {len(infos):,} entries is over the limit of {limits.max_entries:,}"
        )
    total = 0
    for info in infos:
        if info.file_size > limits.max_entry_bytes:
            raise PayloadError(
                f"{path.name}: entry {info.filename} is {info.file_size:,} bytes uncompressed, "
                f"over the per-file limit of {limits.max_entry_bytes:,}"
            )
        total += info.file_size
    if total > limits.max_total_bytes:
        raise PayloadError(
            f"{path.name}: {total:,} bytes uncompressed in all, over the limit of "
            f"{limits.max_total_bytes:,}"
        )


def read_slack_export(
    path: str | Path,
    *,
    workspace: str = "export",
    strict: bool = False,
    limits: ZipLimits = DEFAULT_LIMITS,
) -> SlackExport:
    """Open an export ZIP and index it; iterate the result for events.

    The team id comes from the messages' ``team`` field (the most common one),
    else the users' ``team_id``, else `workspace`.
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise PayloadError(f"{path}: not a readable ZIP file ({exc})") from exc
    with zf:
        check_zip_limits(path, zf, limits)
        names = zf.namelist()
        anchors = [n for n in names if n.endswith(("channels.json", "groups.json"))]
        anchors = [n for n in anchors if n.count("/") <= 1]
        if not anchors:
            raise PayloadError(f"{path}: no channels.json or groups.json: not a Slack export")
        prefix = min(anchors, key=len).rpartition("/")[0]
        prefix = prefix + "/" if prefix else ""

        users_raw = _optional_list(zf, prefix + "users.json", limits) or []
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
            if isinstance(u.get("team_id"), str):
                user_teams[u["team_id"]] += 1

        channels = _channels(
            _optional_list(zf, prefix + "channels.json", limits) or [], private=False
        )
        channels += _channels(
            _optional_list(zf, prefix + "groups.json", limits) or [], private=True
        )
        channels += _channels(_optional_list(zf, prefix + "mpims.json", limits) or [], private=True)

        days: dict[str, list[str]] = {}
        for n in names:
            m = _DAY_FILE.match(n[len(prefix) :]) if n.startswith(prefix) else None
            if m:
                days.setdefault(m["folder"], []).append(n[len(prefix) :])
        for files in days.values():
            files.sort()

        known = {c.name for c in channels}
        for folder in sorted(set(days) - known):
            log.info("export folder %s has no channel entry (a DM?); not imported", folder)

        # Pre-pass: count candidate records, find the team, and who joins inside the export.
        count = 0
        teams: Counter[str] = Counter()
        joined: dict[str, set[str]] = {}
        for channel in channels:
            count += len(channel.members)
            for day_file in days.get(channel.name, []):
                try:
                    records = _load_json(zf, prefix + day_file, limits)
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
        # Members who join within the export get their JOIN from the message, not up front.
        for channel in channels:
            count -= len(set(channel.members) & joined.get(channel.name, set()))

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
        _prefix=prefix,
        _days=days,
        _joined_in_export=joined,
        _limits=limits,
    )
