"""Where a Slack export's files come from: the ZIP Slack hands out, or the folder it unzips to.

Admins and migration tools pass both on, so the importer reads either through one small
interface (`ExportSource`: names, size, bytes). Both refuse what no real export holds: a ZIP
over `ZipLimits` (checked from the central directory before anything is decompressed), a
file over the per-file limit, and JSON nested deeper than the parser recurses (a hostile
file would otherwise end the import in a RecursionError instead of an error naming it).
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from speakermem.integrations.payload import PayloadError

__all__ = [
    "DEFAULT_LIMITS",
    "ExportSource",
    "ZipLimits",
    "check_zip_limits",
    "load_json",
    "open_source",
]


@dataclass(frozen=True)
class ZipLimits:
    """What an export may hold before we refuse it.

    A real export is one small day file per channel per day: a ten-year, 1,000-channel
    workspace is under 4 million entries of a few kB to a few MB each."""

    max_entries: int = 5_000_000
    max_entry_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 32 * 1024**3


DEFAULT_LIMITS = ZipLimits()


class ExportSource(Protocol):
    """The files of one export, named by their '/'-separated path inside it."""

    label: str

    def names(self) -> list[str]: ...
    def size(self, name: str) -> int: ...
    def read(self, name: str) -> bytes: ...
    def close(self) -> None: ...


class ZipSource:
    """An export ZIP (entries read one at a time; zipfile enforces each declared size)."""

    def __init__(self, path: Path, limits: ZipLimits) -> None:
        self.label = path.name
        try:
            self._zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise PayloadError(f"{path}: not a readable ZIP file or export folder ({exc})") from exc
        try:
            check_zip_limits(path, self._zf, limits)
        except PayloadError:
            self._zf.close()
            raise

    def names(self) -> list[str]:
        return self._zf.namelist()

    def size(self, name: str) -> int:
        return self._zf.getinfo(name).file_size

    def read(self, name: str) -> bytes:
        return self._zf.read(name)

    def close(self) -> None:
        self._zf.close()


class FolderSource:
    """An unzipped export folder (symbolic links are not followed out of it)."""

    def __init__(self, path: Path, limits: ZipLimits) -> None:
        self.label = path.name
        self._root = path
        self._names: list[str] = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.endswith(".json"):
                    full = Path(dirpath) / filename
                    if not full.is_symlink():
                        self._names.append(full.relative_to(path).as_posix())
            if len(self._names) > limits.max_entries:
                raise PayloadError(
                    f"{path.name}: over {limits.max_entries:,} JSON files is over the limit"
                )

    def names(self) -> list[str]:
        return list(self._names)

    def size(self, name: str) -> int:
        return (self._root / name).stat().st_size

    def read(self, name: str) -> bytes:
        return (self._root / name).read_bytes()

    def close(self) -> None:
        return None


def open_source(path: Path, limits: ZipLimits = DEFAULT_LIMITS) -> ExportSource:
    """The ZIP at `path`, or the folder at `path`; PayloadError when it is neither."""
    if path.is_dir():
        return FolderSource(path, limits)
    return ZipSource(path, limits)


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


def load_json(source: ExportSource, name: str, limits: ZipLimits = DEFAULT_LIMITS) -> Any:
    """One export file as JSON; PayloadError naming the file when it is not readable JSON."""
    size = source.size(name)
    if size > limits.max_entry_bytes:
        raise PayloadError(
            f"{name}: {size:,} bytes uncompressed is over the per-file limit of "
            f"{limits.max_entry_bytes:,} (no real export file is that large)"
        )
    try:
        text = source.read(name).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{name}: not valid UTF-8") from exc
    except OSError as exc:
        raise PayloadError(f"{name}: cannot read ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except RecursionError as exc:
        raise PayloadError(f"{name}: JSON nested too deeply to be a Slack export file") from exc
