"""SQLite settles itself after a bulk write, as PostgreSQL does: an import in a running
process left the planner without statistics until the store was closed; `Store.settle`
runs ANALYZE where a table has none or has outgrown them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlean

import speakermem.memory.engine as engine_module
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg

A = Scope(platform="test", workspace="w1", channel="general")
TEXT = "a status update on the quarterly report and the garden party plans"


def analysed(path: Path) -> bool:
    """Whether the planner has statistics for `messages`, read from a second connection."""
    conn = sqlean.connect(f"file:{path}?mode=ro", uri=True)
    try:
        has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'")
        if has_table.fetchone() is None:
            return False
        row = conn.execute("SELECT 1 FROM sqlite_stat1 WHERE tbl = 'messages'").fetchone()
        return row is not None
    finally:
        conn.close()


async def test_an_import_leaves_the_planner_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "BULK_SETTLE_ROWS", 300)
    db = tmp_path / "x.db"
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        # live-sized writes, each below the threshold: no ANALYZE
        for batch in range(3):
            await engine.ingest_many(
                [msg(A, f"live{batch}-{i}", "Ann", TEXT, batch * 100 + i) for i in range(100)]
            )
        assert not analysed(db)
        # an import: settled before ingest_many returns
        await engine.ingest_many(
            [msg(A, f"m{i}", "Bob", f"{TEXT} {i}", 400 + i) for i in range(300)]
        )
        assert analysed(db)
        assert "messages" in await engine.store.settle()
    finally:
        await engine.close()
