"""Cluster-wide job locks on SQLite: a SQLite file has one bot process, so every periodic
job may always run (the PostgreSQL store holds an advisory lock: memory/store/pg/locks.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator


class SqliteJobLocks:
    """SQLite: one process owns the file, so every job may always run."""

    @contextlib.asynccontextmanager
    async def try_job(self, name: str) -> AsyncIterator[bool]:
        yield True
