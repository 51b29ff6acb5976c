"""What a PostgreSQL database needs after a bulk write, done by the store itself.

A table filled by an import, a backlog of vectors or a catch-up of the interaction graph
has no planner statistics for its new rows (or none at all: a fresh database) and an empty
visibility map, so index-only scans read the heap for every row. Autovacuum repairs both,
but only after its next nap (a minute or more), and then in the middle of the first
questions: on a small machine its VACUUM competes with them for the cores. So the engine
asks the store to settle right after such a write (`PgStore.settle`): every table of the
schema whose size outgrew what its statistics describe, or whose visibility map lags its
pages, gets `VACUUM (ANALYZE)` at once. The decision is a pure function of the catalog
(`needs_settling`), tested on its own; a catalog read is all a call costs when nothing
changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from speakermem.memory.store.pg.database import PgDatabase

log = logging.getLogger(__name__)

MIN_PAGES = 16
"""Tables smaller than this (128 kB) are left to autovacuum: the planner reads them whole
whatever it believes, and a VACUUM would only cost time."""
GROWTH = 0.10
"""A table grown by more than this share of the pages its statistics were taken on is
analysed again (autovacuum's own analyse threshold is the same 10 % of the rows)."""
VISIBLE_LAG = 0.10
"""A table with more than this share of its pages not marked all-visible is vacuumed, so
index-only scans stop visiting the heap."""


@dataclass(frozen=True)
class TableState:
    """One table's size now and what its last VACUUM or ANALYZE recorded (pg_class)."""

    name: str
    pages: int
    """Pages on disk now."""
    relpages: int
    """Pages when the statistics were last taken (0 if never)."""
    reltuples: float
    """Rows estimated then; -1 for a table never vacuumed nor analysed."""
    allvisible: int
    """Pages the visibility map marks all-visible."""


def needs_settling(t: TableState) -> bool:
    """Whether `t` should be vacuumed and analysed now (see the module's docstring)."""
    if t.pages < MIN_PAGES:
        return False
    if t.reltuples < 0 or t.pages > t.relpages * (1 + GROWTH):
        return True
    return t.allvisible < t.pages * (1 - VISIBLE_LAG)


async def table_states(db: PgDatabase) -> list[TableState]:
    """The ordinary tables of the store's schema, with their sizes and statistics."""
    rows = await db.read(
        "SELECT c.relname, pg_relation_size(c.oid) / current_setting('block_size')::int,"
        " c.relpages, c.reltuples, c.relallvisible FROM pg_class c"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        " ORDER BY c.relname"
    )
    return [TableState(str(r[0]), int(r[1]), int(r[2]), float(r[3]), int(r[4])) for r in rows]


async def settle(db: PgDatabase) -> list[str]:
    """VACUUM (ANALYZE) every table that needs it; returns their names. VACUUM cannot run
    in a transaction: each runs on a pooled autocommit connection."""
    stale = [t.name for t in await table_states(db) if needs_settling(t)]
    for name in stale:
        quoted = '"' + name.replace('"', '""') + '"'
        async with db.reader() as conn:
            await conn.execute(f"VACUUM (ANALYZE) {quoted}")  # type: ignore[arg-type]
    if stale:
        log.info("vacuumed and analysed after a bulk write: %s", ", ".join(stale))
    return stale
