"""Shared fixtures: a real SQLite store in a temp dir, a test embedder, the LLM test server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory.config import IngestConfig, MemoryConfig, StoreConfig
from memory.engine import MemoryEngine
from memory.models import MessageEvent, Scope
from tests.fakes import HashEmbedder
from tests.llm_fixtures import llm_server  # noqa: F401 - re-exported fixture

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test cleanly where it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not present (evaluation data lives outside the project)")
    return path


def make_config(tmp_path: Path, **ingest: object) -> MemoryConfig:
    return MemoryConfig(
        store=StoreConfig(db_path=tmp_path / "test.db"),
        ingest=IngestConfig(**ingest),  # type: ignore[arg-type]
    )


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
