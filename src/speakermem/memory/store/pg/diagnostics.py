"""Read-only facts about an open PostgreSQL store, for `speakermem doctor`.

The counterpart of memory/store/sqlite/diagnostics.diagnose (SQLite versions and PRAGMAs):
the server's version, pgvector's, whether the `speakermem` text search configuration the
full-text columns are built with exists and answers, the schema version against this
release's latest, the connection pool's size against the server's connection limit, and
the two server settings search speed depends on: `shared_buffers` (does the set dense
search scans on every query fit?) and `work_mem` (have queries spilled to disk?).
"""

from __future__ import annotations

from dataclasses import dataclass

from speakermem.memory.store.pg.database import PgDatabase, pool_max_size
from speakermem.memory.store.pg.schema import migrations

MIN_VECTOR = (0, 7, 0)
"""The oldest pgvector the schema runs on: `binary_quantize` and `bit` vectors, the dense
search's sign bits (memory/store/pg/messages_schema.py), came in 0.7.0."""

MIB = 1 << 20


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.8.2' -> (0, 8, 2); a suffix after the digits ('0.7.0-dev') is ignored."""
    parts: list[int] = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@dataclass(frozen=True)
class PgHealth:
    location: str
    """The database URL with the password masked."""
    driver: str
    server_version: str
    vector_version: str | None
    """pgvector's extension version, None when the extension is not installed here."""
    text_search: bool
    """The `speakermem` text search configuration exists and stems text."""
    schema_version: int
    latest_version: int
    pool_size: int
    """Connections open in the pool now."""
    pool_max: int
    """Connections the pool may open (`pool_max_size`: readers + 1)."""
    shared_buffers: int
    """The server's `shared_buffers`, in bytes."""
    dense_scan_bytes: int
    """The sign bits table and its indexes: what every dense search reads (all of it at
    the largest channel sizes), so what should stay in `shared_buffers`."""
    work_mem: int
    """`work_mem` of this database's sessions, in bytes."""
    temp_files: int
    """Temporary files this database's queries wrote since its statistics were reset: a
    sort or hash over `work_mem` spills to one."""
    temp_bytes: int
    max_connections: int
    """Connections the server takes from non-superusers (max_connections less the reserved
    ones)."""
    connections_used: int
    """Connections open to the server now, this pool's included."""

    @property
    def migrated(self) -> bool:
        return self.schema_version >= self.latest_version

    @property
    def vector_supported(self) -> bool:
        return self.vector_version is not None and (
            version_tuple(self.vector_version) >= MIN_VECTOR
        )

    @property
    def vector_needed(self) -> str:
        return ".".join(map(str, MIN_VECTOR))

    @property
    def shared_buffers_wanted(self) -> int:
        """At least the dense scan's set, rounded up to a whole 64 MiB, and never below
        PostgreSQL's own default (128 MiB)."""
        step = 64 * MIB
        return max(128 * MIB, -(-self.dense_scan_bytes // step) * step)

    @property
    def work_mem_wanted(self) -> int:
        """Enough for the average spill on top of what is set, rounded up to a whole MiB
        (what is set when nothing spilled)."""
        if not self.temp_files:
            return self.work_mem
        spill = self.temp_bytes // self.temp_files
        return -(-(self.work_mem + spill) // MIB) * MIB

    @property
    def processes_fit(self) -> int:
        """How many more processes with this pool the server can take now."""
        return max(0, self.max_connections - self.connections_used) // max(1, self.pool_max)


async def diagnose_pg(db: PgDatabase, driver: str = "postgres") -> PgHealth:
    """Versions, extension, text search, settings and pool of `db`; every query here only
    reads."""
    (server_version,) = (await db.read("SELECT current_setting('server_version')"))[0]
    rows = await db.read("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    vector_version = str(rows[0][0]) if rows else None
    rows = await db.read("SELECT count(*) FROM pg_ts_config WHERE cfgname = 'speakermem'")
    text_search = bool(rows[0][0])
    if text_search:
        # the configuration answers: a word comes back as a stemmed lexeme
        rows = await db.read("SELECT to_tsvector('speakermem', 'doctors')::text")
        text_search = "doctor" in str(rows[0][0])
    (settings,) = await db.read(
        "SELECT pg_size_bytes(current_setting('shared_buffers')),"
        " pg_size_bytes(current_setting('work_mem')),"
        " current_setting('max_connections')::int"
        " - current_setting('superuser_reserved_connections')::int,"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),"
        " coalesce((SELECT pg_total_relation_size(to_regclass('messages_bits'))), 0),"
        " (SELECT coalesce(temp_files, 0) FROM pg_stat_database"
        "  WHERE datname = current_database()),"
        " (SELECT coalesce(temp_bytes, 0) FROM pg_stat_database"
        "  WHERE datname = current_database())"
    )
    latest = max(m.version for m in migrations(db.config))
    stats = db.pool.get_stats()
    return PgHealth(
        location=db.where,
        driver=driver,
        server_version=str(server_version),
        vector_version=vector_version,
        text_search=text_search,
        schema_version=await db.schema_version(),
        latest_version=latest,
        pool_size=int(stats.get("pool_size", 0)),
        pool_max=pool_max_size(db.config),
        shared_buffers=int(settings[0]),
        work_mem=int(settings[1]),
        max_connections=int(settings[2]),
        connections_used=int(settings[3]),
        dense_scan_bytes=int(settings[4]),
        temp_files=int(settings[5] or 0),
        temp_bytes=int(settings[6] or 0),
    )
