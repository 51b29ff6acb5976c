"""PostgreSQL settles itself after a bulk write (memory/store/pg/upkeep.py): an import into a
fresh database leaves `messages` analysed and its visibility map set, without waiting for
autovacuum; live-sized writes never pay for it.

Skips without pgserver (tests/pg_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

import speakermem.memory.engine as engine_module
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.store.pg.upkeep import MIN_PAGES, TableState, needs_settling
from tests.conftest import msg

A = Scope(platform="test", workspace="w1", channel="general")


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (TableState("tiny", MIN_PAGES - 1, 0, -1, 0), False),
        (TableState("fresh", 100, 0, -1, 0), True),
        (TableState("grown", 120, 100, 5_000, 120), True),
        (TableState("a little", 105, 100, 5_000, 105), False),
        (TableState("rewritten", 100, 100, 5_000, 0), True),
        (TableState("settled", 100, 100, 5_000, 100), False),
    ],
)
def test_which_tables_need_settling(state: TableState, expected: bool) -> None:
    assert needs_settling(state) is expected


async def messages_stats(engine: MemoryEngine) -> tuple[float, int, int]:
    """(reltuples, relpages, relallvisible) of `messages`: the rows and pages its planner
    statistics describe, and the pages its visibility map marks all-visible."""
    rows = await engine.store.db.read(
        "SELECT reltuples, relpages, relallvisible FROM pg_class WHERE relname = 'messages'"
    )
    return float(rows[0][0]), int(rows[0][1]), int(rows[0][2])


@pytest.mark.slow
async def test_a_bulk_ingest_leaves_a_fresh_database_analysed_and_vacuumed(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "BULK_SETTLE_ROWS", 1_000)
    # The tests' server commits asynchronously (tests/pg_fixtures.py); VACUUM marks a page
    # all-visible only once the inserting commit is on disk, so this database commits
    # synchronously, as PostgreSQL does by default.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on',"
            " current_database()); END $$"
        )
    engine = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db", db_url=pg_url))
    )
    try:
        # autovacuum off on the table, so only the store can have analysed it
        async with engine.store.db.transaction() as tx:
            await tx.execute("ALTER TABLE messages SET (autovacuum_enabled = off)")
        text = "a status update on the quarterly report and the garden party plans"
        # a live-sized write: below the threshold, nothing is settled
        await engine.ingest_many([msg(A, f"live{i}", "Ann", text, i) for i in range(999)])
        # (the statistics still describe the empty table the migrations analysed)
        assert await messages_stats(engine) == (0, 0, 0)
        # an import: the store settles `messages` before ingest_many returns
        events = [msg(A, f"m{i}", "Bob", f"{text} {i}", 1_000 + i) for i in range(1_000)]
        await engine.ingest_many(events)
        tuples, pages, visible = await messages_stats(engine)
        assert tuples == pytest.approx(1_999, rel=0.05)
        assert pages >= MIN_PAGES and visible == pages
    finally:
        await engine.close()
