"""The PostgreSQL backend's database layer (memory.store.pg.database) against a real
PostgreSQL started by the tests: placeholders, rows, transactions, error types, migrations
(also two processes migrating one empty database at once) and schema parity with SQLite."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from speakermem.memory.config import StoreConfig
from speakermem.memory.store import StoreBusy, StoreError, StoreFull, make_store
from speakermem.memory.store.pg.database import PgDatabase, map_error, masked_url
from speakermem.memory.store.pg.dialect import translate
from speakermem.memory.store.pg.schema import migrations
from speakermem.memory.store.pg.store import PgStore
from speakermem.memory.store.sqlite.store import SqliteStore

ROOT = Path(__file__).resolve().parents[1]


# ---- pure: SQL text ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ? + ?", "SELECT %s + %s"),
        (
            "SELECT * FROM t WHERE a LIKE '%x%' AND b = ?",
            "SELECT * FROM t WHERE a LIKE '%%x%%' AND b = %s",
        ),
        ("SELECT 'what?' , ?", "SELECT 'what?' , %s"),
        ("SELECT 'it''s ?', ?", "SELECT 'it''s ?', %s"),
        ('SELECT "odd?col" FROM t WHERE x = ?', 'SELECT "odd?col" FROM t WHERE x = %s'),
        ("SELECT 1 -- why?\n, ?", "SELECT 1 -- why?\n, %s"),
        ("SELECT /* a? 5% */ ?", "SELECT /* a? 5%% */ %s"),
        ("SELECT $$ a ? b $$, $f$ ? $f$, ?", "SELECT $$ a ? b $$, $f$ ? $f$, %s"),
        ("SELECT 10 % 3, ?", "SELECT 10 %% 3, %s"),
        ("SELECT $1", "SELECT $1"),
    ],
)
def test_translate_turns_placeholders_and_escapes_percent(sql: str, expected: str) -> None:
    assert translate(sql) == expected


def test_masked_url_hides_only_the_password() -> None:
    assert masked_url("postgresql://bot:s3cr%21t@db.example:5432/mem") == (
        "postgresql://bot:***@db.example:5432/mem"
    )
    assert masked_url("postgresql:///mem?host=/tmp") == "postgresql:///mem?host=/tmp"


def test_errors_map_to_store_types() -> None:
    busy = map_error(psycopg.errors.LockNotAvailable("lock timeout"), where="db", lock_wait_s=2)
    assert isinstance(busy, StoreBusy)
    assert "SPEAKERMEM_DB_LOCK_WAIT_S" in str(busy)
    assert isinstance(
        map_error(psycopg.errors.SerializationFailure("x"), where="db", lock_wait_s=1), StoreBusy
    )
    assert isinstance(
        map_error(psycopg.errors.DeadlockDetected("x"), where="db", lock_wait_s=1), StoreBusy
    )
    assert isinstance(map_error(psycopg.errors.DiskFull("x"), where="db", lock_wait_s=1), StoreFull)
    unique = psycopg.errors.UniqueViolation("dup")
    assert map_error(unique, where="db", lock_wait_s=1) is unique  # stays catchable as itself


# ---- against PostgreSQL ------------------------------------------------------------------


def config(url: str, **extra: object) -> StoreConfig:
    return StoreConfig(db_url=url, readers=2, **extra)  # type: ignore[arg-type]


async def opened(url: str, **extra: object) -> PgDatabase:
    db = PgDatabase(config(url, **extra))
    await db.open()
    return db


async def test_rows_answer_by_index_and_by_name(pg_url: str) -> None:
    db = await opened(pg_url)
    try:
        (row,) = await db.read("SELECT 1 AS a, 'x' AS b, ?::text AS c", ("?%",))
        assert row[0] == 1 and row["a"] == 1 and row["b"] == "x" and row["c"] == "?%"
        a, b, c = row
        assert (a, b, c) == (1, "x", "?%")
        assert row.keys() == ["a", "b", "c"]
        with pytest.raises(IndexError):
            row["missing"]
        # sums of BIGINT and averages come back as int / float, as SQLite's do
        (agg,) = await db.read(
            "SELECT sum(v), avg(v) FROM (VALUES (1::bigint), (2::bigint)) AS t(v)"
        )
        assert agg[0] == 3 and isinstance(agg[0], int)
        assert agg[1] == 1.5 and isinstance(agg[1], float)
        async with db.reader() as conn:  # a pooled connection, for a backend's own SQL
            cur = await conn.execute(translate("SELECT ? + 1 AS n"), (41,))
            assert (await cur.fetchone())["n"] == 42
    finally:
        await db.close()


async def test_a_transaction_is_rolled_back_on_error(pg_url: str) -> None:
    db = await opened(pg_url)
    try:
        with pytest.raises(RuntimeError):
            async with db.transaction() as tx:
                await tx.execute(
                    "INSERT INTO channels (platform, workspace, channel, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    ("t", "w", "c", 1.0),
                )
                raise RuntimeError("boom")
        assert await db.read("SELECT count(*) FROM channels") == [(0,)]
        # the pool's connection is usable again, and a committed insert returns its id
        async with db.transaction() as tx:
            pk = await tx.insert(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES (?, ?, ?, ?)",
                ("t", "w", "c", 1.0),
            )
            cur = await tx.execute("UPDATE channels SET name = ? WHERE id = ?", ("n", pk))
            assert cur.rowcount == 1
        assert await db.read("SELECT id, name FROM channels") == [(pk, "n")]
        # a unique key violated raises the driver's IntegrityError, as on SQLite
        with pytest.raises(db.driver.integrity_error):
            async with db.transaction() as tx:
                await tx.execute(
                    "INSERT INTO channels (platform, workspace, channel, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    ("t", "w", "c", 2.0),
                )
        # an insert that inserted nothing has no id to give
        with pytest.raises(StoreError):
            async with db.transaction() as tx:
                await tx.insert(
                    "INSERT INTO channels (platform, workspace, channel, created_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    ("t", "w", "c", 2.0),
                )
    finally:
        await db.close()


async def test_a_lock_held_elsewhere_past_the_wait_is_store_busy(pg_url: str) -> None:
    db = await opened(pg_url, lock_wait_s=0.3)
    try:
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES ('t', 'w', 'c', 1)"
            )
        other = await psycopg.AsyncConnection.connect(pg_url)  # another process's writer
        try:
            await other.execute("SELECT * FROM channels FOR UPDATE")
            with pytest.raises(StoreBusy, match="SPEAKERMEM_DB_LOCK_WAIT_S"):
                async with db.transaction() as tx:
                    await tx.execute("UPDATE channels SET name = 'x'")
        finally:
            await other.rollback()
            await other.close()
        async with db.transaction() as tx:  # once released, the same write goes through
            await tx.execute("UPDATE channels SET name = 'x'")
        assert await db.read("SELECT name FROM channels") == [("x",)]
    finally:
        await db.close()


async def test_reopening_applies_no_migration_twice(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="speakermem.memory.store.pg.database")
    db = await opened(pg_url)
    await db.close()
    db = await opened(pg_url)
    try:
        expected = [m.version for m in migrations(db.config)]
        rows = await db.read("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == expected
        assert await db.schema_version() == max(expected)
        applied = [r.message for r in caplog.records if r.message.startswith("applied migration")]
        assert len(applied) == len(expected)
    finally:
        await db.close()


async def test_two_openers_of_an_empty_database_migrate_once(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="speakermem.memory.store.pg.database")
    first, second = PgDatabase(config(pg_url)), PgDatabase(config(pg_url))
    await asyncio.gather(first.open(), second.open())  # two pools: two sessions at once
    try:
        expected = [m.version for m in migrations(first.config)]
        rows = await first.read("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == expected
        applied = [r.message for r in caplog.records if r.message.startswith("applied migration")]
        assert sorted(applied) == sorted(
            f"applied migration {m.version}: {m.name}" for m in migrations(first.config)
        )
    finally:
        await first.close()
        await second.close()


@pytest.mark.e2e
def test_two_processes_opening_an_empty_database_both_succeed(pg_url: str) -> None:
    script = (
        "import asyncio, sys\n"
        "from speakermem.memory.config import StoreConfig\n"
        "from speakermem.memory.store.pg.database import PgDatabase\n"
        "async def main():\n"
        "    db = PgDatabase(StoreConfig(db_url=sys.argv[1], readers=1))\n"
        "    await db.open()\n"
        "    print(await db.schema_version())\n"
        "    await db.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, pg_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    latest = max(m.version for m in migrations(config(pg_url)))
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == str(latest)

    async def versions() -> list[int]:
        db = await opened(pg_url)
        try:
            return [r[0] for r in await db.read("SELECT version FROM schema_migrations")]
        finally:
            await db.close()

    got = asyncio.run(versions())
    assert sorted(got) == sorted(set(got))  # each recorded once


async def test_every_sqlite_table_and_column_exists_on_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    lite = SqliteStore(StoreConfig(db_path=tmp_path / "parity.db"), gap_seconds=60, window=5)
    await lite.open()
    try:
        tables = [
            r[0]
            for r in await lite.db.read(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND sql NOT LIKE 'CREATE VIRTUAL%' AND name NOT LIKE 'sqlite_%'"
                " AND name NOT LIKE '%_fts_%' AND name NOT LIKE '%_vec_%'"
            )
        ]
        sqlite_cols = {
            t: {r[1] for r in await lite.db.read(f"PRAGMA table_info({t})")} for t in tables
        }
    finally:
        await lite.close()
    db = await opened(pg_url)
    try:
        rows = await db.read(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        )
    finally:
        await db.close()
    pg_cols: dict[str, set[str]] = {}
    for table, column in rows:
        pg_cols.setdefault(table, set()).add(column)
    assert "messages" in sqlite_cols and "roster" in sqlite_cols  # the query found tables
    for table, cols in sqlite_cols.items():
        assert table in pg_cols, f"{table} missing on PostgreSQL"
        assert cols <= pg_cols[table], f"{table}: missing columns {cols - pg_cols[table]}"


async def test_triggers_keep_roster_revisions_and_the_graph(pg_url: str) -> None:
    db = await opened(pg_url)
    try:
        async with db.transaction() as tx:
            pk = await tx.insert(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES ('t', 'w', 'c', 1)"
            )

        async def rev() -> int:
            return int((await db.read("SELECT roster_rev FROM channels WHERE id = ?", (pk,)))[0][0])

        before = await rev()
        async with db.transaction() as tx:
            for uid in ("u1", "u2", "u3"):
                await tx.execute(
                    "INSERT INTO users (platform, workspace, user_id, display_name, updated_at)"
                    " VALUES ('t', 'w', ?, ?, 1)",
                    (uid, uid.upper()),
                )
                await tx.execute(
                    "INSERT INTO roster (channel_pk, platform, workspace, channel, user_id)"
                    " VALUES (?, 't', 'w', 'c', ?)",
                    (pk, uid),
                )
        joined = await rev()
        assert joined > before
        async with db.transaction() as tx:  # a member's rename moves their channels
            await tx.execute("UPDATE users SET display_name = 'Renamed' WHERE user_id = 'u2'")
        renamed = await rev()
        assert renamed > joined
        async with db.transaction() as tx:  # an alias too
            await tx.execute(
                "INSERT INTO user_aliases (platform, workspace, user_id, alias, alias_norm)"
                " VALUES ('t', 'w', 'u3', 'Tre', 'tre')"
            )
        assert await rev() > renamed

        # deleting a message removes its addressees and the links to and from it
        async with db.transaction() as tx:
            ids = [
                await tx.insert(
                    "INSERT INTO messages (channel_pk, platform, workspace, channel, message_id,"
                    " speaker_id, speaker_name, text, ts, session_id, turn_index)"
                    " VALUES (?, 't', 'w', 'c', ?, 'u1', 'U1', 'hi', ?, 1, ?)",
                    (pk, f"m{i}", float(i), i),
                )
                for i in range(3)
            ]
            await tx.execute(
                "INSERT INTO message_addressees (message_pk, addressee, how)"
                " VALUES (?, 'u2', 'reply')",
                (ids[1],),
            )
            await tx.executemany(
                "INSERT INTO message_links (message_pk, parent_pk, how) VALUES (?, ?, 'previous')",
                [(ids[1], ids[0]), (ids[2], ids[1])],
            )
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM messages WHERE id = ?", (ids[1],))
        assert await db.read("SELECT count(*) FROM message_addressees") == [(0,)]
        assert await db.read("SELECT count(*) FROM message_links") == [(0,)]
    finally:
        await db.close()


async def test_record_checks_refuse_bad_json_as_integrity_errors(pg_url: str) -> None:
    db = await opened(pg_url)
    try:
        async with db.transaction() as tx:
            pk = await tx.insert(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES ('t', 'w', 'c', 1)"
            )
        insert = (
            "INSERT INTO records (channel_pk, platform, workspace, channel, layer, record_scope,"
            " content, source, owner, time, from_ids, chain_root, writer_model, prompt_version,"
            " created_at) VALUES (?, 't', 'w', 'c', 'core', 'GROUP', 'x', 's', 'o', 1, ?, 0,"
            " 'm', 'p', 1)"
        )
        for bad in ("[]", "not json", '{"a": 1}'):
            with pytest.raises(psycopg.errors.CheckViolation):
                async with db.transaction() as tx:
                    await tx.execute(insert, (pk, bad))
        async with db.transaction() as tx:
            await tx.execute(insert, (pk, '["m1"]'))
        assert await db.read("SELECT count(*) FROM records") == [(1,)]
    finally:
        await db.close()


async def test_make_store_picks_the_backend_from_the_url(pg_url: str, tmp_path: Path) -> None:
    lite = make_store(StoreConfig(db_path=tmp_path / "x.db"), gap_seconds=60, window=5)
    assert type(lite) is SqliteStore
    with pytest.raises(StoreError, match="postgresql://"):
        make_store(StoreConfig(db_url="mysql://x/y"), gap_seconds=60, window=5)  # type: ignore[arg-type]
    store = make_store(config(pg_url), gap_seconds=60, window=5)
    assert isinstance(store, PgStore)
    await store.open()
    try:
        assert store.driver_name == "postgres"
        assert await store.db_size_bytes() > 0
        assert not (tmp_path / "speakermem.db").exists()
    finally:
        await store.close()


@pytest.mark.slow  # waits out the store's connection retries (~5 s)
async def test_an_unreachable_server_is_a_store_error(tmp_path: Path) -> None:
    url = f"postgresql://nobody@/none?host={tmp_path}&connect_timeout=1"
    db = PgDatabase(config(url, lock_wait_s=1))
    with pytest.raises(StoreError, match="cannot open database"):
        await db.open()


async def test_connections_the_server_dropped_are_replaced(pg_url: str) -> None:
    db = await opened(pg_url)
    try:
        assert await db.read("SELECT 1") == [(1,)]
        with psycopg.connect(pg_url, autocommit=True) as admin:  # a restart, a failover
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )
        assert await db.read("SELECT 2") == [(2,)]
        async with db.transaction() as tx:
            assert (await tx.fetchone("SELECT 3"))[0] == 3
    finally:
        await db.close()


async def test_the_interaction_cursor_never_moves_back(pg_url: str) -> None:
    """Two processes' passes over one channel can overlap; the one that read less commits
    its cursor last here, and the cursor keeps the other's further position."""
    store = make_store(config(pg_url), gap_seconds=60, window=5)
    await store.open()
    try:
        async with store.db.transaction() as tx:
            pk = await tx.insert(
                "INSERT INTO channels (platform, workspace, channel, created_at)"
                " VALUES ('t', 'w', 'c', 1)"
            )
            await tx.execute(store.interactions._cursor_upsert, (pk, 30))
            await tx.execute(store.interactions._cursor_upsert, (pk, 10))
        rows = await store.db.read(
            "SELECT last_pk FROM interaction_cursor WHERE channel_pk = ?", (pk,)
        )
        assert rows == [(30,)]
    finally:
        await store.close()


def test_the_path_of_a_postgres_store_prints_masked_and_is_no_file(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = pg_url.replace("postgres:@", "postgres:hunter2@", 1)
    assert "hunter2" in url
    db = PgDatabase(config(url))
    assert "hunter2" not in str(db.path) and str(db.path).startswith("postgresql://")
    with pytest.raises(StoreError, match="not a file"):
        db.path.exists()
    with pytest.raises(StoreError, match="not a file"):
        sqlite3.connect(db.path)  # what SQLite-only code (a file backup) would do
    assert list(tmp_path.iterdir()) == []  # nothing was created


async def test_the_db_url_setting_opens_the_engine_on_postgres(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speakermem.bot.settings import Settings
    from speakermem.memory.engine import MemoryEngine

    monkeypatch.setenv("SPEAKERMEM_DB_URL", pg_url)
    monkeypatch.setenv("SPEAKERMEM_DB_PATH", str(tmp_path / "unused.db"))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert pg_url not in repr(settings)  # a secret: masked
    engine = await MemoryEngine.open(settings.memory_config())
    try:
        assert isinstance(engine.store, PgStore)
        stats = await engine.stats()
        assert stats["driver"] == "postgres"
        assert stats["schema_version"] == max(m.version for m in migrations(engine.store.db.config))
    finally:
        await engine.close()
    assert not (tmp_path / "unused.db").exists()
