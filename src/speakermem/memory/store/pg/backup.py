"""Online backups of a PostgreSQL store (`speakermem backup PATH` with SPEAKERMEM_DB_URL set).

`pg_dump --format=custom` writes the archive. It reads inside a transaction whose snapshot
this module exports and holds open (`pg_export_snapshot()`, `pg_dump --snapshot`), so the
message and record counts reported are those of the very snapshot dumped, while the bot keeps
writing. The archive goes to a partial file beside PATH, is listed once with `pg_restore
--list` (a truncated or corrupt archive fails there), then renamed into place: a failed backup
never leaves a file at PATH.

The password never reaches a command line or a message: pg_dump gets the connection without
it and reads it from PGPASSWORD; anything printed from pg_dump is passed through `masked_url`
and has the password itself replaced.

Restore (documented in docs/guides/operators.md): into an empty database,
    pg_restore --clean --if-exists --no-owner --dbname URL PATH
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from speakermem.memory.private_files import ensure_private_file
from speakermem.memory.store.backup_result import BackupResult
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.pg.database import masked_url, scrub_error, scrub_password

INSTALL_HINT = (
    "install the PostgreSQL client tools of the server's major version or newer "
    "(Debian/Ubuntu: apt install postgresql-client; macOS: brew install libpq) "
    "and put pg_dump on PATH"
)


def split_password(url: str) -> tuple[str, str | None]:
    """(connection string without the password, the password or None)."""
    params = conninfo_to_dict(url)
    password = params.pop("password", None)
    return make_conninfo("", **params), None if password is None else str(password)


def _scrub(text: str, url: str, password: str | None) -> str:
    return scrub_password(scrub_error(text, url), password)


def _partial_beside(dest: Path) -> Path:
    """The partial file the dump is written to (PATH must not exist yet)."""
    if dest.exists():
        raise StoreError(f"{dest} exists; choose a new file name (backups never overwrite)")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    ensure_private_file(tmp)  # pg_dump truncates and fills it, keeping its 0600
    return tmp


def _publish(tmp: Path, dest: Path) -> int:
    os.replace(tmp, dest)
    return dest.stat().st_size


async def _run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    return int(proc.returncode or 0), err.decode("utf-8", "replace")


async def backup_postgres(url: str, dest: Path) -> BackupResult:
    """Dump the database at `url` into `dest` (custom format) consistently, online."""
    started = time.perf_counter()
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        raise StoreError(f"pg_dump not found: {INSTALL_HINT}")
    pg_restore = shutil.which("pg_restore", path=str(Path(pg_dump).parent)) or shutil.which(
        "pg_restore"
    )
    conninfo, password = split_password(url)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    tmp = await asyncio.to_thread(_partial_beside, dest)
    try:
        conn = await psycopg.AsyncConnection.connect(url)
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to {masked_url(url)}: {_scrub(str(exc), url, password)}"
        ) from exc
    try:
        async with conn.transaction():
            cur = await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur = await conn.execute(
                "SELECT pg_export_snapshot(), (SELECT count(*) FROM messages),"
                " (SELECT count(*) FROM records)"
            )
            row = await cur.fetchone()
            assert row is not None
            snapshot, messages, records = str(row[0]), int(row[1]), int(row[2])
            # the exported snapshot lives as long as this transaction: dump while it is open
            code, err = await _run(
                [
                    pg_dump,
                    "--format=custom",
                    f"--snapshot={snapshot}",
                    f"--file={tmp}",
                    f"--dbname={conninfo}",
                ],
                env,
            )
    except psycopg.Error as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise StoreError(
            f"backup of {masked_url(url)} failed: {_scrub(str(exc), url, password)}"
        ) from exc
    finally:
        await conn.close()
    if code != 0:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise StoreError(
            f"pg_dump of {masked_url(url)} failed (exit {code}): {_scrub(err, url, password)}"
        )
    if pg_restore is not None:
        code, err = await _run([pg_restore, "--list", str(tmp)], env)
        if code != 0:
            tmp.unlink()
            raise StoreError(
                f"the archive failed pg_restore --list ({err.strip()}); nothing written"
            )
    size = await asyncio.to_thread(_publish, tmp, dest)
    return BackupResult(
        path=dest,
        bytes=size,
        messages=messages,
        records=records,
        seconds=time.perf_counter() - started,
    )
