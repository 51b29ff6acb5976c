"""Cluster-wide job locks on PostgreSQL: `pg_try_advisory_lock`, held for the job.

Each job name maps to one advisory lock key (a fixed class id plus the name's CRC-32), taken
with the non-blocking try form: the process that gets it runs the job, every other process
skips that run instead of queueing behind it. The lock is session-level and lives on a
connection of its own, not a pooled one: the job's own queries use the pool, and a pool of
two connections must not lose one to a lock for the job's whole run. When the process dies
its session ends and PostgreSQL releases the lock, so a crashed job never blocks the others.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg

from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.pg.database import PgDatabase, crc_key

log = logging.getLogger(__name__)

JOB_LOCK_CLASS = 0x53504A  # "SPJ": the first key of every job lock (migrations use another id)


class PgJobLocks:
    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    @contextlib.asynccontextmanager
    async def try_job(self, name: str) -> AsyncIterator[bool]:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.db.url,
                autocommit=True,
                connect_timeout=max(1, int(self.db.config.lock_wait_s)),
            )
        except psycopg.Error as exc:
            raise StoreError(f"{self.db.where}: cannot take the job lock {name!r}: {exc}") from exc
        async with conn:
            key = (JOB_LOCK_CLASS, crc_key(name))
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
            row = await cur.fetchone()
            got = bool(row and row[0])
            if not got:
                log.debug("job %s: running in another process; skipped here", name)
            try:
                yield got
            finally:
                if got and not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)
