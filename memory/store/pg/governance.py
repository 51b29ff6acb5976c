"""Governance on PostgreSQL: the SQLite GovernanceRepo with its SQLite-only SQL replaced.

Each cascade batch stays one transaction (PgDatabase.transaction), so a crash leaves a batch
applied or untouched, as on SQLite. The forgetting SQL that reads vec0 tables runs
unchanged: the pgvector tables keep vec0's `rowid` column name.
"""

from __future__ import annotations

from memory.store.database import Transaction
from memory.store.governance import GovernanceRepo


class PgGovernanceRepo(GovernanceRepo):
    _FOR_UPDATE = " FOR UPDATE"

    @staticmethod
    def _records_naming_sql(n: int) -> str:
        return (
            "SELECT DISTINCT r.id FROM records r,"
            " json_array_elements_text(r.from_ids::json) AS j(value)"
            f" WHERE r.channel_pk = ? AND j.value IN ({','.join('?' * n)})"
        )

    @staticmethod
    async def _has_table(tx: Transaction, name: str) -> bool:
        row = await tx.fetchone("SELECT to_regclass(?) IS NOT NULL", (name,))
        return bool(row[0])
