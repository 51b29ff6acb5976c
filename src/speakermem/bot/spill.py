"""A bounded on-disk spill for events the store could not take (its disk is full, it is
locked or unreachable).

Plain file I/O, no SQLite: one JSON object per line, appended and fsynced before the event
counts as kept. The dispatcher replays the spill into the store, oldest first, once the
store takes writes again (on start, periodically and on the next event), then drops what it
applied; the store's writes are idempotent, so a crash between applying and dropping only
replays events that change nothing the second time. The file is capped in bytes: an event
that would pass the cap is refused with `SpillFull` (the caller logs and counts it), never
dropped silently.

What keeps it safe:
- an append is one write of a whole line; if it fails part-way (ENOSPC) the file is cut
  back to where it was, so no torn line stays (a line torn by a crash is skipped on open);
- every rewrite (dropping what was replayed, removing what was forgotten) goes to a new
  file that replaces the old one by rename: the spill is whole before or after, never half;
- the file and its rewrites are created mode 0600 (it holds message text);
- a forget removes the forgotten events (`forget`), so no plaintext of them waits here;
- another process (the CLI's `forget`) may rewrite it: every change takes an exclusive
  `flock` on a lock file beside it, and dropping replayed events matches their lines
  (not their positions), so a removal in between drops nothing else.

It should live on another disk than the database (`SPEAKERMEM_SPILL_PATH`): a spill beside
the database fills up with it; `speakermem doctor` warns about that.

The methods block (file I/O, fsync, flock): call them from a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from speakermem.memory.governance.policy import Forgotten
from speakermem.memory.models import DeleteEvent, EditEvent, MessageEvent, RosterEvent

log = logging.getLogger(__name__)

DEFAULT_CAP_BYTES = 64 * 1024 * 1024
"""The spill's default cap: about 200,000 short chat messages (about 300 bytes each)."""
RETRY_S = 10.0
"""How often the dispatcher retries the spill by default (SPEAKERMEM_SPILL_RETRY_S)."""
SUFFIX = ".spill.jsonl"
MODE = 0o600
"""The spill holds message text: readable by the bot's user only."""

StorableEvent = MessageEvent | EditEvent | DeleteEvent | RosterEvent
STORABLE: dict[str, type[BaseModel]] = {
    "message": MessageEvent,
    "edit": EditEvent,
    "delete": DeleteEvent,
    "roster": RosterEvent,
}
_KIND = {cls: kind for kind, cls in STORABLE.items()}


def default_path(db_path: Path) -> Path:
    """Beside the database: `speakermem.db` -> `speakermem.db.spill.jsonl`."""
    return db_path.with_name(db_path.name + SUFFIX)


class SpillFull(RuntimeError):
    """The spill reached its cap: the event was not kept."""


def _parse(raw: bytes) -> StorableEvent:
    item: dict[str, Any] = json.loads(raw)
    return cast(StorableEvent, STORABLE[item["kind"]].model_validate(item["event"]))


class Spill:
    def __init__(self, path: Path, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.path = Path(path)
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()  # append vs. drop_first from different threads
        self._last_read: list[bytes] | None = None
        with self._locked():
            self._count, self._bytes = self._scan()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's threads, then other processes (an exclusive flock)."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = self.path.with_name(self.path.name + ".lock")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def _lines(self) -> list[bytes]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return data.split(b"\n")[: data.count(b"\n")]

    def _scan(self) -> tuple[int, int]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0, 0
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) < len(data):  # a crash mid-append: that event was never kept
            log.warning("spill %s: dropping a torn last line (%d bytes)", self.path, len(data))
            with self.path.open("r+b") as fh:
                fh.truncate(len(whole))
                os.fsync(fh.fileno())
        if data:
            os.chmod(self.path, MODE)  # a spill written by an older version
        return whole.count(b"\n"), len(whole)

    @property
    def count(self) -> int:
        """Events waiting (complete lines)."""
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def append(self, event: StorableEvent) -> None:
        """Keep one event (durably) or raise SpillFull (or the OSError of a full disk, with
        the file as it was)."""
        line = (
            json.dumps(
                {"kind": _KIND[type(event)], "event": event.model_dump(mode="json")},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            + "\n"
        ).encode()
        with self._locked():
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)
            try:
                size = os.fstat(fd).st_size
                if size + len(line) > self.cap_bytes:
                    raise SpillFull(
                        f"spill {self.path} is at {size} of {self.cap_bytes} bytes; "
                        "this event was NOT kept"
                    )
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, size)  # no torn line: the spill is as it was
                    with contextlib.suppress(OSError):
                        os.fsync(fd)
                    raise
            finally:
                os.close(fd)
            self._count = self._count + 1 if size == self._bytes else self._scan()[0]
            self._bytes = size + len(line)

    def read(self) -> list[StorableEvent | None]:
        """Every kept event, oldest first; None for a line that cannot be read (logged), so
        positions still match `drop_first`."""
        with self._locked():
            lines = self._lines()
            self._last_read = lines
            self._count, self._bytes = len(lines), sum(len(x) + 1 for x in lines)
        out: list[StorableEvent | None] = []
        for n, raw in enumerate(lines, start=1):
            try:
                out.append(_parse(raw))
            except (ValueError, KeyError, TypeError, ValidationError) as exc:
                log.error("spill %s line %d unreadable, skipped: %s", self.path, n, exc)
                out.append(None)
        return out

    def drop_first(self, n: int) -> None:
        """Remove the first `n` events of the last `read` (applied to the store). They are
        found by their lines, so events removed or added meanwhile (a forget, an append)
        do not shift what is dropped."""
        if n <= 0:
            return
        with self._locked():
            lines = self._lines()
            applied = Counter((self._last_read if self._last_read is not None else lines)[:n])
            rest: list[bytes] = []
            for line in lines:
                if applied[line] > 0:
                    applied[line] -= 1
                else:
                    rest.append(line)
            self._rewrite(rest)
            self._last_read = None

    def forget(self, forgotten: Forgotten) -> int:
        """Remove every event carrying words `forgotten` covers (and edits of the messages it
        removed); returns how many left. Deletes stay: they hold ids only."""
        with self._locked():
            lines = self._lines()
            if not lines:
                return 0
            rest: list[bytes] = []
            gone: set[tuple[str, str, str, str]] = set()
            parsed: list[tuple[bytes, StorableEvent | None]] = []
            for line in lines:
                try:
                    event: StorableEvent | None = _parse(line)
                except (ValueError, KeyError, TypeError, ValidationError):
                    event = None
                parsed.append((line, event))
                if isinstance(event, MessageEvent) and forgotten.covers(event):
                    gone.add((*event.scope.key(), event.message_id))
            for line, event in parsed:
                if event is not None and (
                    forgotten.covers(event)
                    or (
                        isinstance(event, EditEvent)
                        and (*event.scope.key(), event.message_id) in gone
                    )
                ):
                    continue
                rest.append(line)
            removed = len(lines) - len(rest)
            if removed:
                self._rewrite(rest)
            return removed

    def _rewrite(self, lines: list[bytes]) -> None:
        """Replace the file with `lines` atomically (a new 0600 file, fsynced, renamed)."""
        data = b"".join(line + b"\n" for line in lines)
        if not data:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        else:
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, MODE)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
            os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._count, self._bytes = len(lines), len(data)
