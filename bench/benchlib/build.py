"""Building a benchmark database: where it lives (a SQLite file or a PostgreSQL database,
built once and reused while its marker says it is complete), ingesting generated chat in
batches, and giving every message a random vector."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import SecretStr

from benchlib.cli import Progress
from benchlib.host import own_rss_mb
from benchlib.pg import connect, with_database
from benchlib.vectors import DIM, unit_vectors
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import LAYER_SCOPE, Layer, MessageEvent, NewRecord


@dataclass
class Target:
    """Where a benchmark database lives: a SQLite file, or a PostgreSQL database
    (`dbname` on the server of `admin_url`; `path` then only names it in messages).

    A complete build leaves its statistics as a marker: for SQLite a file beside the
    database, for PostgreSQL the database's COMMENT (written last), so an interrupted build
    is never taken for a complete one."""

    path: Path
    admin_url: str | None = None
    dbname: str | None = None

    @property
    def url(self) -> str | None:
        if self.admin_url is None or self.dbname is None:
            return None
        return with_database(self.admin_url, self.dbname)

    @property
    def label(self) -> str:
        return f"PostgreSQL database {self.dbname}" if self.dbname else str(self.path)

    @property
    def marker_file(self) -> Path:
        return self.path.with_name(self.path.name + ".done.json")

    def config(self, **store: Any) -> MemoryConfig:
        url = self.url
        return MemoryConfig(
            store=StoreConfig(db_path=self.path, db_url=SecretStr(url) if url else None, **store)
        )

    def built(self) -> dict[str, Any] | None:
        """The statistics of a complete earlier build; None when there is none."""
        if self.admin_url is None:
            if not (self.path.exists() and self.marker_file.exists()):
                return None
            stats: dict[str, Any] = json.loads(self.marker_file.read_text())
            return stats
        with connect(self.admin_url) as conn:
            row = conn.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                (self.dbname,),
            ).fetchone()
        if row is None or not row[0]:
            return None
        try:
            stats = json.loads(row[0])
        except ValueError:
            return None
        return stats

    def drop(self) -> None:
        """Delete the database (files, or the PostgreSQL database) if it exists."""
        if self.admin_url is None:
            for suffix in ("", "-wal", "-shm", ".done.json"):
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
            return
        from psycopg import sql

        with connect(self.admin_url) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(str(self.dbname))
                )
            )

    def create(self) -> None:
        """An empty database to build into (the store creates its schema when it opens)."""
        self.drop()
        if self.admin_url is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return
        from psycopg import sql

        with connect(self.admin_url) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(self.dbname))))

    def mark_built(self, stats: dict[str, Any]) -> None:
        text = json.dumps(stats, indent=2)
        if self.admin_url is None:
            self.marker_file.write_text(text)
            return
        from psycopg import sql

        with connect(self.admin_url) as conn:
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(str(self.dbname)), sql.Literal(text)
                )
            )


async def settle(engine: MemoryEngine) -> list[str]:
    """Leave the built database as the store leaves one after a bulk write, through the
    store's own `settle` (SQLite: planner statistics, `PRAGMA optimize`; PostgreSQL: VACUUM
    (ANALYZE) of the tables the build outgrew), not a settling of the benchmark's; SQLite's
    WAL is then folded into the file. Returns the tables settled."""
    settled = await engine.store.settle()
    if engine.store.driver_name != "postgres":
        await engine.store.db.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return settled


async def ingest_timed(
    engine: MemoryEngine,
    events: Callable[[int], list[MessageEvent]],
    total: int,
    *,
    gen_batch: int = 20_000,
    progress: str = "",
) -> dict[str, float]:
    """Ingest `total` messages made `gen_batch` at a time by `events(n)` (never all at
    once); only `ingest_many` is timed."""
    done, ingest_s, gen_s = 0, 0.0, 0.0
    report = Progress(progress)
    while done < total:
        n = min(gen_batch, total - done)
        t0 = time.perf_counter()
        batch = events(n)
        t1 = time.perf_counter()
        outcomes = await engine.ingest_many(batch)
        t2 = time.perf_counter()
        assert len(outcomes) == n
        gen_s += t1 - t0
        ingest_s += t2 - t1
        done += n
        del batch, outcomes
        report(f"{done:,}/{total:,} ingested ({done / ingest_s:,.0f}/s), RSS {own_rss_mb():.0f} MB")
    return {
        "messages": total,
        "ingest_s": round(ingest_s, 2),
        "msgs_per_s": round(total / ingest_s, 1),
        "generate_s": round(gen_s, 2),
    }


async def store_random_vectors(
    engine: MemoryEngine,
    rng: np.random.Generator,
    *,
    batch: int = 2_000,
    grouped: bool = False,
    keep: bool = False,
    progress: str = "",
) -> dict[str, Any]:
    """Give every pending message a random unit vector through `store_vectors`, `batch` at
    a time.

    `grouped` sorts each fetched window of pending rows by channel before inserting (the order
    an importer of one channel at a time would produce); otherwise rows go in id order, i.e.
    interleaved across channels like live traffic. Returns timings (and the vectors if `keep`).
    """
    repo = engine.store.messages
    store_s, n_done = 0.0, 0
    kept_ids: list[np.ndarray] = []
    kept_vecs: list[np.ndarray] = []
    report = Progress(progress)
    while items := await repo.pending_embeddings(20_000):
        if grouped:
            items.sort(key=lambda it: (it[1], it[0]))
        vecs = unit_vectors(rng, len(items))
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            t0 = time.perf_counter()
            stored = await repo.store_vectors(chunk, vecs[start : start + batch])
            store_s += time.perf_counter() - t0
            assert stored == len(chunk), (stored, len(chunk))
        n_done += len(items)
        if keep:
            kept_ids.append(np.array([it[0] for it in items], dtype=np.int64))
            kept_vecs.append(vecs)
        report(f"{n_done:,} vectors stored ({n_done / store_s:,.0f}/s), RSS {own_rss_mb():.0f} MB")
    out: dict[str, Any] = {
        "vectors": n_done,
        "store_s": round(store_s, 2),
        "vectors_per_s": round(n_done / store_s, 1) if store_s else None,
        "batch": batch,
        "order": "grouped by channel" if grouped else "interleaved (id order)",
    }
    if keep:
        out["_ids"] = np.concatenate(kept_ids) if kept_ids else np.zeros(0, np.int64)
        out["_vecs"] = np.concatenate(kept_vecs) if kept_vecs else np.zeros((0, DIM), np.float32)
    return out


def derived_record(
    layer: Layer,
    content: str,
    *,
    owner: str,
    source: str,
    event: str,
    cites: Sequence[tuple[str, float]],
    supersedes: int | None = None,
) -> NewRecord:
    """A System 2 record as a Writer would commit it from the cited (message id, time)
    pairs: supported by those messages, dated by the newest of them."""
    return NewRecord(
        layer=layer,
        record_scope=LAYER_SCOPE[layer],
        content=content,
        source=source,
        owner=owner,
        event=event,
        time=datetime.fromtimestamp(max(t for _, t in cites), UTC),
        session_id=None,
        from_ids=tuple(dict.fromkeys(m for m, _ in cites)),
        supersedes=supersedes,
        writer_model="bench",
        prompt_version="bench-v1",
    )
