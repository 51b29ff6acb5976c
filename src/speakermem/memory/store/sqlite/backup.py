"""Online backups of the SQLite file (`speakermem backup PATH`).

`VACUUM INTO` runs inside one read transaction on its own connection, so the copy is a
consistent snapshot even while the bot keeps writing (WAL readers never block the
writer, nor it them), and it comes out compacted, with no -wal file to carry along. The
copy is written next to the target and renamed into place only after it passes SQLite's
integrity check, so a failed or interrupted backup never leaves a half file at PATH.

Restore: stop the bot, replace the database file with the backup and delete any
`-wal`/`-shm` files beside it, then start the bot (see docs/guides/operators.md).

`memory.store.backup.backup_store` picks this or the PostgreSQL dump (memory/store/pg/
backup.py), as the configuration selects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from speakermem.memory.config import StoreConfig
from speakermem.memory.private_files import ensure_private_file
from speakermem.memory.store.backup_result import BackupResult
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.sqlite.driver import Driver, connect_sync


def _backup(source: Path, dest: Path, driver: Driver, busy_timeout_ms: int) -> BackupResult:
    started = time.perf_counter()
    if not source.exists():
        raise StoreError(f"no database at {source}")
    if dest.exists():
        raise StoreError(f"{dest} exists; choose a new file name (backups never overwrite)")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    ensure_private_file(tmp)  # VACUUM INTO fills an empty file, keeping its 0600
    src = connect_sync(source, driver)
    try:
        src.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        src.execute("VACUUM INTO ?", (str(tmp),))
    except driver.error as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise StoreError(f"backup of {source} failed: {exc}") from exc
    finally:
        src.close()
    copy = connect_sync(tmp, driver)
    try:
        check = copy.execute("PRAGMA integrity_check").fetchone()[0]
        messages = copy.execute("SELECT count(*) FROM messages").fetchone()[0]
        records = copy.execute("SELECT count(*) FROM records").fetchone()[0]
    finally:
        copy.close()
    if check != "ok":
        tmp.unlink()
        raise StoreError(f"backup failed its integrity check ({check}); nothing written")
    os.replace(tmp, dest)
    return BackupResult(
        path=dest,
        bytes=dest.stat().st_size,
        messages=int(messages),
        records=int(records),
        seconds=time.perf_counter() - started,
    )


BUSY_TIMEOUT_MS: int = StoreConfig.model_fields["busy_timeout_ms"].default


async def backup_database(
    source: Path, dest: Path, driver: Driver, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS
) -> BackupResult:
    """Copy `source` to `dest` consistently while other processes may be writing."""
    return await asyncio.to_thread(_backup, source, dest, driver, busy_timeout_ms)
