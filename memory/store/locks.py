"""Cluster-wide job locks: a periodic job (retention, the embedding safety net, idle
closing, re-derivation) runs in one process at a time, however many share the store.

`try_job(name)` is an async context manager yielding True when this process may run the job
now and False when another process is running it (the caller skips this run). A SQLite file
has one bot process, so on SQLite the job always runs; the PostgreSQL store
(memory/store/pg/locks.py) holds an advisory lock for the job's duration.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator


class JobLocks:
    """SQLite: one process owns the file, so every job may always run."""

    @contextlib.asynccontextmanager
    async def try_job(self, name: str) -> AsyncIterator[bool]:
        yield True
