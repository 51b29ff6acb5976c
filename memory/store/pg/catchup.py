"""CatchupRepo on PostgreSQL: its SQL (a correlated LIMIT 1 subquery, an ON CONFLICT
upsert) is portable, so nothing is overridden; the class names the port explicitly."""

from __future__ import annotations

from memory.store.catchup import CatchupRepo


class PgCatchupRepo(CatchupRepo):
    pass
