"""The state a benchmark measured its database in, written into its JSON beside the figures:
a fresh build or a reused one, whether planner statistics and the visibility map were up to
date (ANALYZE, VACUUM: by whom and how far behind), and whether the server's cache started
cold. A figure that does not reproduce is first compared on these."""

from __future__ import annotations

from typing import Any

from speakermem.memory.engine import MemoryEngine

_PG_TABLES = (
    "SELECT s.relname, s.n_live_tup, s.n_mod_since_analyze, s.n_ins_since_vacuum,"
    " s.last_analyze IS NOT NULL, s.last_autoanalyze IS NOT NULL,"
    " s.last_vacuum IS NOT NULL, s.last_autovacuum IS NOT NULL,"
    " c.relpages, c.relallvisible"
    " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    " WHERE c.relpages >= 16 ORDER BY s.relname"
)


async def db_state(engine: MemoryEngine, *, build: str, cache: str) -> dict[str, Any]:
    """`build`: 'fresh' (made by this run) or 'reused'; `cache`: how the server's cache
    started ('warm: ...' or 'cold: ...'). On PostgreSQL also, for every table of 16 pages
    or more: whether it was analysed and vacuumed (manually, i.e. by the store's
    `settle`, or by autovacuum), rows changed since its last ANALYZE, and the share of its
    pages marked all-visible."""
    state: dict[str, Any] = {"build": build, "cache": cache}
    if engine.store.driver_name != "postgres":
        state["statistics"] = "none kept (SQLite)"
        return state
    tables: dict[str, Any] = {}
    for r in await engine.store.db.read(_PG_TABLES):
        pages, visible = int(r[8]), int(r[9])
        tables[str(r[0])] = {
            "rows": int(r[1]),
            "changed_since_analyze": int(r[2]),
            "inserted_since_vacuum": int(r[3]),
            "analyzed": "manual" if r[4] else "autovacuum" if r[5] else "never",
            "vacuumed": "manual" if r[6] else "autovacuum" if r[7] else "never",
            "all_visible_share": round(visible / pages, 3) if pages else None,
        }
    state["tables"] = tables
    state["all_analyzed"] = all(t["analyzed"] != "never" for t in tables.values())
    state["all_vacuumed"] = all(t["vacuumed"] != "never" for t in tables.values())
    return state
