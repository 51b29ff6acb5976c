"""Files that hold members' text are readable by their owner only, whatever the umask.

The SQLite file (and its -wal/-shm, which SQLite creates with the database file's mode),
backups and `export-user --out` files hold the same text as the spill plus the tombstone
key: each is created 0600, and a directory made for one is created 0700. A file left
readable by an older version is tightened when it is opened again. Directories that
already exist are left as they are (the working directory is the operator's).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def readable_by_others(path: Path) -> bool:
    """The file exists and its group or others may read or write it."""
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:  # missing, or a path through a file: nothing there to read
        return False


def make_private_dir(path: Path) -> None:
    """Create `path` and its missing parents, each 0700 (mkdir's mode passes the umask,
    so each is set explicitly)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=DIR_MODE)
            os.chmod(directory, DIR_MODE)


def tighten(path: Path) -> bool:
    """Make an existing file 0600 when its group or others have any access; False when
    that was needed and not allowed (another user's file: `doctor` run as root)."""
    if not readable_by_others(path):
        return True
    try:
        os.chmod(path, FILE_MODE)
    except PermissionError:
        return False
    return True


def sidecars(db: Path) -> list[Path]:
    """The SQLite file and the -wal, -shm and -journal files beside it."""
    return [db, *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


def ensure_private_file(path: Path) -> None:
    """`path` exists and is 0600: created empty (its directory 0700) when missing, never
    truncated; an existing one is tightened."""
    if path.exists():
        tighten(path)
        return
    make_private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def write_private_text(path: Path, text: str) -> None:
    """Write `text` to `path` (replacing it) as a 0600 file in a 0700 directory if new."""
    make_private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), FILE_MODE)
        fh.write(text)
