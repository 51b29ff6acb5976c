"""Shared fixtures: a real SQLite store in a temp dir, a test embedder, the LLM test server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from speakermem.memory.config import IngestConfig, MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from tests.fakes import HashEmbedder
from tests.llm_fixtures import llm_server  # noqa: F401 - re-exported fixture
from tests.pg_fixtures import (  # noqa: F401 - re-exported fixtures
    current_db_url,
    pg_bin,
    pg_databases,
    pg_server,
    pg_store_databases,
    pg_template,
    pg_url,
    use_db_url,
)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test cleanly where it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not present (evaluation data lives outside the project)")
    return path


def make_config(tmp_path: Path, **ingest: object) -> MemoryConfig:
    """A store in tmp_path, or the test's PostgreSQL database on the contract suite's
    "postgres" run (see `backend`)."""
    url = current_db_url(str(tmp_path))
    return MemoryConfig(
        store=StoreConfig(db_path=tmp_path / "test.db", db_url=url),
        ingest=IngestConfig(**ingest),  # type: ignore[arg-type]
    )


BACKENDS = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules marked `pytestmark = pytest.mark.contract` run every test over both store
    backends (ids [sqlite] and [postgres]: select one with -k); other modules use SQLite."""
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("contract"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


def on_postgres(item: pytest.Item) -> bool:
    """The test runs on the session's PostgreSQL: the [postgres] half of a contract module,
    or a test that asks for the server itself."""
    params = getattr(item, "callspec", None)
    if params is not None and params.params.get("backend") == "postgres":
        return True
    return "pg_server" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on PostgreSQL count as `slow` (each makes a database on a server and pays its
    round trips: several times its SQLite twin), so the fast tier runs SQLite only and
    `-k postgres` or the full suite runs them.

    Tests marked `live` (a real model endpoint) run only when `-m` names them: another
    marker expression, such as the fast tier's `-m "not slow and not e2e"`, leaves them out
    as the default `-m 'not live'` does."""
    for item in items:
        if on_postgres(item):
            item.add_marker(pytest.mark.slow)
    if "live" in (config.getoption("markexpr") or ""):
        return
    live = [item for item in items if item.get_closest_marker("live") is not None]
    if live:
        config.hook.pytest_deselected(items=live)
        items[:] = [item for item in items if item.get_closest_marker("live") is None]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(autouse=True)
def _store_backend(request: pytest.FixtureRequest, backend: str) -> Iterator[None]:
    """On the "postgres" run, a fresh database that `make_config` (and so `engine`) uses, and
    SPEAKERMEM_DB_URL for code that reads the settings (the CLI, the adapters); a test
    marked `sqlite_only` skips there."""
    if backend != "postgres":
        yield None
        return
    marker = request.node.get_closest_marker("sqlite_only")
    if marker is not None:
        pytest.skip(f"SQLite only: {marker.args[0] if marker.args else 'SQLite detail'}")
    dbs = request.getfixturevalue("pg_store_databases")
    # settings-based code (CLI, adapters) shares the database of make_config(tmp_path)
    tmp_path = request.getfixturevalue("tmp_path")
    request.getfixturevalue("monkeypatch").setenv("SPEAKERMEM_DB_URL", dbs.url_for(str(tmp_path)))
    use_db_url(dbs.url_for)
    try:
        yield None
    finally:
        use_db_url(None)


@pytest.fixture
def scope() -> Scope:
    return Scope(platform="test", workspace="w1", channel="general")


@pytest.fixture
def embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
async def engine(tmp_path: Path, embedder: HashEmbedder) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        yield eng
    finally:
        await eng.close()


def msg(
    scope: Scope,
    mid: str,
    speaker: str,
    text: str,
    minutes: float,
    **extra: object,
) -> MessageEvent:
    return MessageEvent(
        scope=scope,
        message_id=mid,
        speaker_id=speaker.lower(),
        speaker_name=speaker,
        text=text,
        ts=T0 + timedelta(minutes=minutes),
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(autouse=True)
def _wide_cli_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's rich consoles read COLUMNS once, when first imported, so an in-process CLI
    table's width would depend on which test imported them first (in a parallel run, on a
    worker's order of tests). Every test gets them 400 columns wide: no wrapped cell."""
    from speakermem.integrations.cli import render

    for console in (render.console, render.err_console):
        monkeypatch.setattr(console, "width", 400)
