"""A bounded on-disk spill for events the store could not take (its disk is full).

Plain file I/O, no SQLite: one JSON object per line, appended and fsynced before the event
counts as kept. The dispatcher replays the spill into the store, oldest first, once space
returns (on start, periodically and on the next event), then drops what it applied; the
store's writes are idempotent, so a crash between applying and dropping only replays
events that change nothing the second time. The file is capped in bytes: an event that
would pass the cap is refused with `SpillFull` (the caller logs and counts it), never
dropped silently. A line torn by a crash mid-append is skipped with a warning.

The methods block (file I/O, fsync): call them from a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from memory.models import DeleteEvent, EditEvent, MessageEvent, RosterEvent

log = logging.getLogger(__name__)

DEFAULT_CAP_BYTES = 64 * 1024 * 1024
"""The spill's default cap: about 200,000 short chat messages (about 300 bytes each)."""
SUFFIX = ".spill.jsonl"

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


class Spill:
    def __init__(self, path: Path, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.path = Path(path)
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()  # append vs. drop_first from different threads
        self._count, self._bytes = self._scan()

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
        return whole.count(b"\n"), len(whole)

    @property
    def count(self) -> int:
        """Events waiting (complete lines)."""
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def append(self, event: StorableEvent) -> None:
        """Keep one event (durably) or raise SpillFull."""
        line = (
            json.dumps(
                {"kind": _KIND[type(event)], "event": event.model_dump(mode="json")},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            + "\n"
        ).encode()
        with self._lock:
            if self._bytes + len(line) > self.cap_bytes:
                raise SpillFull(
                    f"spill {self.path} is at {self._bytes} of {self.cap_bytes} bytes; "
                    "this event was NOT kept"
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            self._count += 1
            self._bytes += len(line)

    def read(self) -> list[StorableEvent | None]:
        """Every kept event, oldest first; None for a line that cannot be read (logged), so
        positions still match `drop_first`."""
        with self._lock:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                return []
        out: list[StorableEvent | None] = []
        for n, raw in enumerate(data.split(b"\n")[: data.count(b"\n")], start=1):
            try:
                item: dict[str, Any] = json.loads(raw)
                event = STORABLE[item["kind"]].model_validate(item["event"])
                out.append(cast(StorableEvent, event))
            except (ValueError, KeyError, TypeError, ValidationError) as exc:
                log.error("spill %s line %d unreadable, skipped: %s", self.path, n, exc)
                out.append(None)
        return out

    def drop_first(self, n: int) -> None:
        """Remove the first `n` events (applied to the store); atomic by rename."""
        if n <= 0:
            return
        with self._lock:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                return
            lines = data.split(b"\n")[: data.count(b"\n")]
            rest = b"".join(line + b"\n" for line in lines[n:])
            if not rest:
                self.path.unlink()
            else:
                tmp = self.path.with_name(self.path.name + ".tmp")
                with tmp.open("wb") as fh:
                    fh.write(rest)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            self._count, self._bytes = len(lines) - min(n, len(lines)), len(rest)
