"""A folder of DiscordChatExporter files: every good file read, every bad one reported.

The exporter writes one JSON file per channel or thread, where its output template puts
them: all in one folder by default, threads in subfolders when the template names the
parent (``%T``) or when a wrapper collects them under ``_threads/``. So the folder is read
recursively (the exporter's ``…_Files`` media folders excepted), and one unreadable file
(cut off mid-message, not JSON, not an export) is listed with its reason instead of failing
the others.

A thread file is scoped to its parent channel. The exporter has written the parent's id
in ``categoryId`` since mid-2023 ("category actually refers to the parent channel");
where that id is not one of the folder's channels but is the category of some of them
(an older build), the folders the thread file sits in are matched against the channels'
names and ``[id]`` suffixes instead.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from speakermem.integrations.discord.export import THREAD_KINDS, DiscordExport, read_discord_export
from speakermem.integrations.payload import PayloadError

__all__ = ["BadFile", "DiscordFolder", "read_discord_export_dir", "read_discord_export_folder"]

log = logging.getLogger(__name__)

_ID_SUFFIX = re.compile(r"\[(\d{15,22})\]")
_THREAD_DIR_MARKS = ("_threads", "threads", "_thread")
_THREADS = frozenset(str(kind) for kind in THREAD_KINDS)


@dataclass(frozen=True)
class BadFile:
    """A file that could not be imported, and why."""

    path: Path
    reason: str


@dataclass
class DiscordFolder:
    """The readable exports in a folder (sorted by path) and the files that were not."""

    exports: list[DiscordExport] = field(default_factory=list)
    bad: list[BadFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Threads whose parent could not be told, scoped as channels of their own."""


def _json_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith("_Files"))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".json") and not path.is_symlink():
                out.append(path)
    return out


def _folder_keys(name: str) -> set[str]:
    """What a folder name may call its channel: the name itself, without a ``_threads``
    mark, and an ``[id]`` suffix."""
    keys = {name.strip()}
    low = name.strip()
    for mark in _THREAD_DIR_MARKS:
        if low.endswith(mark):
            keys.add(low[: -len(mark)].rstrip(" -_"))
        if low.startswith(mark):
            keys.add(low[len(mark) :].lstrip(" -_"))
    keys.update(_ID_SUFFIX.findall(name))
    return {k for k in keys if k}


def _resolve_threads(root: Path, folder: DiscordFolder) -> None:
    channels = {e.channel.id: e for e in folder.exports if e.channel.thread_id is None}
    categories = {
        e.category_id for e in folder.exports if e.channel.thread_id is None and e.category_id
    }
    by_key: dict[str, str] = {}
    for cid, e in channels.items():
        by_key.setdefault(cid, cid)
        by_key.setdefault(e.channel.name, cid)
        by_key.setdefault(e.path.stem, cid)
    for i, export in enumerate(folder.exports):
        if export.channel.thread_id is None and export.channel.kind not in _THREADS:
            continue
        named = export.category_id
        if named in channels:
            continue  # the parent is in the folder: already scoped to it
        parent = None
        for ancestor in export.path.relative_to(root).parents:
            if ancestor == Path("."):
                break
            hits = {by_key[k] for k in _folder_keys(ancestor.name) if k in by_key}
            if len(hits) == 1:
                parent = hits.pop()
                break
        if parent is not None:
            folder.exports[i] = export.rescoped(parent)
        elif named and named in categories:
            folder.exports[i] = export.rescoped(None)
            folder.notes.append(
                f"{export.path.name}: thread's parent channel unknown (its categoryId is a "
                "category); imported as a channel of its own"
            )


def read_discord_export_folder(path: str | Path, *, strict: bool = False) -> DiscordFolder:
    """Every DiscordChatExporter file under `path`; with `strict`, the first bad file raises."""
    root = Path(path)
    folder = DiscordFolder()
    for file in _json_files(root):
        try:
            folder.exports.append(read_discord_export(file, strict=strict))
        except PayloadError as exc:
            if strict:
                raise
            log.warning("skipping %s: %s", file, exc)
            folder.bad.append(BadFile(file, str(exc)))
    _resolve_threads(root, folder)
    return folder


def read_discord_export_dir(path: str | Path, *, strict: bool = False) -> list[DiscordExport]:
    """The readable exports under `path` (see `read_discord_export_folder` for the rest)."""
    return read_discord_export_folder(path, strict=strict).exports
