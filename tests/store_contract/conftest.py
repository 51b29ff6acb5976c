"""The store contract: every test in this folder runs once per backend, [sqlite] and
[postgres], against the `Store` protocol only (memory/store/protocol.py), as APScheduler's
data-store tests run over every data store.

`store` is the backend of the run: a SQLite file in the test's tmp dir, or a fresh copy of a
migrated PostgreSQL database from the session's server (tests/pg_fixtures.py; the
[postgres] run skips, saying why, where pgserver or psycopg is missing). A check of one
backend's own internals does not belong here: SQLite's live in tests/test_store.py, the
PostgreSQL backend's in tests/test_pg_*.py. A test here that cannot hold on a backend says
why with `@pytest.mark.sqlite_only("reason")`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from speakermem.memory.models import Layer, NewRecord, RecordScope, Scope
from speakermem.memory.store import Store, make_store
from tests.conftest import BACKENDS, T0, make_config
from tests.fakes import HashEmbedder

GAP_SECONDS = 30 * 60.0
WINDOW = 5
"""Messages per Writer segment in the contract's stores (small, so segments close)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test here on every backend (tests/conftest.py's `_store_backend` gives the
    [postgres] run its database, and skips `sqlite_only` tests there)."""
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
async def store(backend: str, tmp_path: Path) -> AsyncIterator[Store]:
    """An open, empty store on this run's backend."""
    config = make_config(tmp_path)
    opened = make_store(config.store, gap_seconds=GAP_SECONDS, window=WINDOW)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def embed_pending(store: Store, embedder: HashEmbedder) -> int:
    """What the engine's embedding worker does: vectors for every message without one."""
    done = 0
    while items := await store.messages.pending_embeddings(100):
        stored = await store.messages.store_vectors(
            items, embedder.embed_sync([t for _, _, t in items])
        )
        done += stored
        if stored == 0:
            break
    return done


async def pks_of(store: Store, *scopes: Scope) -> list[int]:
    return [pk for s in scopes if (pk := await store.channels.lookup(s)) is not None]


def record(content: str, owner: str = "alice", **kw: object) -> NewRecord:
    base: dict[str, object] = dict(
        layer=Layer.CORE,
        record_scope=RecordScope.PERSON,
        content=content,
        source=owner,
        owner=owner,
        event="diet",
        time=T0,
        session_id=1,
        from_ids=("m1",),
        writer_model="test",
        prompt_version="writer-v1",
    )
    base.update(kw)
    return NewRecord(**base)  # type: ignore[arg-type]


def at(minutes: float) -> float:
    return (T0 + timedelta(minutes=minutes)).timestamp()


def vector(embedder: HashEmbedder, text: str) -> np.ndarray:
    return embedder.embed_sync([text])[0]
