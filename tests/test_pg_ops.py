"""Operations on a PostgreSQL store: `speakermem backup` (pg_dump) and its documented restore,
`speakermem doctor`'s PostgreSQL diagnosis, and CLI commands that need no database file.

Runs against the session's pgserver (tests/pg_fixtures.py); pgserver also ships pg_dump and
pg_restore, whose directory each test puts first on PATH.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.main import main
from speakermem.integrations.doctor import settings_checks, store_checks
from speakermem.memory.admin import StoreHealth
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.store import StoreError
from speakermem.memory.store.backup import backup_store
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.pg_fixtures import PgDatabases
from tests.test_governance_forget import rec

GENERAL = Scope(platform="slack", workspace="T1", channel="C1")
OTHER = Scope(platform="slack", workspace="T1", channel="C2")
QUERIES = ("kumquat supplier", "rocket launch", "quarterly budget")


def config(tmp_path: Path, url: str) -> MemoryConfig:
    return MemoryConfig(store=StoreConfig(db_path=tmp_path / "unused.db", db_url=url))


async def open_engine(tmp_path: Path, url: str) -> MemoryEngine:
    return await MemoryEngine.open(config(tmp_path, url), HashEmbedder())


async def seed(engine: MemoryEngine) -> None:
    await engine.ingest_many(
        [
            msg(GENERAL, "1.1", "Alice", "the kumquat order is late again", 0),
            msg(GENERAL, "1.2", "Bob", "I will chase the supplier about it", 1),
            msg(GENERAL, "1.3", "Carol", "the rocket launch moved to friday", 2),
            msg(OTHER, "2.1", "Bob", "quarterly budget review is on monday", 3),
            msg(OTHER, "2.2", "Alice", "bring the budget spreadsheet 50% done", 4),
        ]
    )
    await engine.embed_pending()
    await engine.store.records.add_records(
        GENERAL,
        [
            rec(
                "Alice orders kumquats from a late supplier",
                ("1.1",),
                owner="alice",
                source="alice",
            ),
            rec("Carol follows the rocket launch", ("1.3",), owner="carol", source="carol"),
        ],
        None,
    )


async def snapshot(engine: MemoryEngine) -> dict[str, object]:
    """What the engine answers: search hits per query, records per owner, counts."""
    found: dict[str, object] = {}
    for q in QUERIES:
        hits = await engine.search(q, [GENERAL, OTHER], limit=5)
        found[q] = [(h.message.message_id, h.message.text, round(h.score, 9)) for h in hits]
    for owner in ("alice", "carol"):
        found[owner] = sorted(r.content for r in await engine.store.records.by_owner_name(owner))
    found["records"] = await engine.store.records.counts()
    found["schema"] = await engine.store.db.schema_version()
    return found


@pytest.fixture
async def seeded(tmp_path: Path, pg_store_databases: PgDatabases) -> AsyncIterator[str]:
    url = pg_store_databases.url_for("source")
    engine = await open_engine(tmp_path, url)
    try:
        await seed(engine)
    finally:
        await engine.close()
    yield url


@pytest.mark.e2e
async def test_backup_and_restore_answers_the_same(
    tmp_path: Path,
    seeded: str,
    pg_databases: PgDatabases,
    pg_bin: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    engine = await open_engine(tmp_path, seeded)
    try:
        before = await snapshot(engine)
    finally:
        await engine.close()
    assert before["kumquat supplier"] and before["alice"] and before["carol"]

    dest = tmp_path / "backups" / "speakermem.dump"
    monkeypatch.setenv("SPEAKERMEM_DB_URL", seeded)
    assert await asyncio.to_thread(main, ["backup", str(dest)]) == 0
    out = capsys.readouterr().err
    assert "5 messages, 2 records" in out and "pg_dump archive listed ok" in out
    assert dest.stat().st_size > 0
    assert not list(dest.parent.glob(".*partial"))

    # the documented restore, into an empty database
    target = pg_databases.url_for("restored")
    await asyncio.to_thread(
        subprocess.run,
        [
            str(pg_bin / "pg_restore"),
            "--clean",
            "--if-exists",
            "--no-owner",
            "--dbname",
            target,
            str(dest),
        ],
        check=True,
        capture_output=True,
    )
    engine = await open_engine(tmp_path, target)
    try:
        assert await snapshot(engine) == before
    finally:
        await engine.close()


async def test_backup_never_overwrites(tmp_path: Path, seeded: str, pg_bin: Path):
    dest = tmp_path / "taken.dump"
    dest.write_bytes(b"keep me")
    with pytest.raises(StoreError, match="exists"):
        await backup_store(config(tmp_path, seeded).store, dest)
    assert dest.read_bytes() == b"keep me"


async def test_backup_without_pg_dump_names_the_package(
    tmp_path: Path, seeded: str, monkeypatch: pytest.MonkeyPatch
):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(StoreError, match="postgresql-client"):
        await backup_store(config(tmp_path, seeded).store, tmp_path / "x.dump")
    assert not (tmp_path / "x.dump").exists()


async def test_backup_messages_never_show_the_password(tmp_path: Path, pg_bin: Path):
    url = f"postgresql://speakermem:s3cr3t-pw@/nowhere?host={tmp_path / 'no-socket'}"
    with pytest.raises(StoreError) as caught:
        await backup_store(config(tmp_path, url).store, tmp_path / "x.dump")
    assert "s3cr3t-pw" not in str(caught.value)
    assert "***" in str(caught.value)
    assert not (tmp_path / "x.dump").exists()


# ---- speakermem doctor ----------------------------------------------------------------------


SERVER_SETTINGS = ("shared_buffers", "work_mem", "connections")


def pg_settings(tmp_path: Path, url: str, **extra: object) -> Settings:
    values: dict[str, object] = {"db_path": tmp_path / "unused.db", "db_url": url}
    values.update(extra)
    return Settings(_env_file=None, embedder="none", **values)  # type: ignore[call-arg, arg-type]


async def test_doctor_reports_the_postgres_store(tmp_path: Path, pg_store_databases: PgDatabases):
    url = pg_store_databases.url_for("doctor")
    checks = {c.name: c for c in await store_checks(pg_settings(tmp_path, url, db_readers=3))}
    assert set(checks) == {
        "driver",
        "migrations",
        "pgvector",
        "text search",
        "shared_buffers",
        "work_mem",
        "connections",
    }
    # the server settings are the test server's own: only warnings, never failures
    assert all(c.status == "ok" for n, c in checks.items() if n not in SERVER_SETTINGS), checks
    assert all(checks[n].status in ("ok", "warn") for n in SERVER_SETTINGS), checks
    assert "pool of 4 per process (readers + 1)" in checks["connections"].detail
    driver = checks["driver"].detail
    assert driver.startswith("PostgreSQL ") and "of 4 connections" in driver  # readers + 1
    assert "sqlite" not in driver.lower() and not (tmp_path / "unused.db").exists()
    of = checks["migrations"].detail.split()  # "schema N of N"
    assert of[1] == of[3] and int(of[1]) >= 1
    assert checks["pgvector"].detail[0].isdigit()  # the extension's version, e.g. 0.8.2


async def test_doctor_says_what_to_set_when_queries_spill_to_disk(
    tmp_path: Path, pg_store_databases: PgDatabases
):
    """A sort larger than work_mem writes a temporary file: the work_mem check then warns
    and names a work_mem above the one set."""
    import psycopg

    url = pg_store_databases.url_for("spill")
    settings = pg_settings(tmp_path, url)
    before = {c.name: c for c in await store_checks(settings)}
    assert before["work_mem"].status == "ok" and "no query spilled" in before["work_mem"].detail
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET work_mem = '64kB'")
        conn.execute("SELECT g FROM generate_series(1, 200000) AS g ORDER BY random()").fetchall()
        conn.execute("SELECT pg_stat_force_next_flush()")
    after = {c.name: c for c in await store_checks(settings)}
    check = after["work_mem"]
    assert check.status == "warn" and "temporary files" in check.detail
    assert check.fix is not None
    wanted_mb = int(check.fix.split("work_mem = '")[1].split("MB'")[0])
    set_mb = float(check.detail.split(" MB")[0].replace(",", ""))
    assert wanted_mb > set_mb


async def test_doctor_flags_an_old_pgvector_small_buffers_and_no_room(
    tmp_path: Path, pg_store_databases: PgDatabases
):
    """The verdicts over a real diagnosis with one fact changed at a time: each names what
    to set."""
    from dataclasses import replace

    from speakermem.integrations.doctor import pg_server_checks
    from speakermem.memory.store.pg.diagnostics import version_tuple

    url = pg_store_databases.url_for("verdicts")
    engine = await open_engine(tmp_path, url)
    try:
        health = await engine.admin.health()
    finally:
        await engine.close()
    assert not isinstance(health, StoreHealth)
    assert health.vector_supported and health.shared_buffers > 0 and health.work_mem > 0
    assert version_tuple("0.6.2") < version_tuple("0.7.0-dev") == (0, 7, 0)
    assert not replace(health, vector_version="0.6.2").vector_supported

    big = replace(health, shared_buffers=128 << 20, dense_scan_bytes=300 << 20)
    (buffers,) = [c for c in pg_server_checks(big) if c.name == "shared_buffers"]
    assert buffers.status == "warn" and "shared_buffers = 320MB" in (buffers.fix or "")
    small = replace(health, shared_buffers=128 << 20, dense_scan_bytes=10 << 20)
    assert [c.status for c in pg_server_checks(small) if c.name == "shared_buffers"] == ["ok"]

    full = replace(health, max_connections=health.connections_used + health.pool_max - 1)
    (room,) = [c for c in pg_server_checks(full) if c.name == "connections"]
    assert room.status == "warn" and "max_connections" in (room.fix or "")
    assert "room for 0 more" in room.detail


async def test_doctor_names_a_missing_text_search_configuration(
    tmp_path: Path, pg_store_databases: PgDatabases
):
    url = pg_store_databases.url_for("broken")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TEXT SEARCH CONFIGURATION speakermem RENAME TO speakermem_gone")
    checks = {c.name: c for c in await store_checks(pg_settings(tmp_path, url))}
    assert checks["text search"].status == "fail"
    assert "configuration missing" in checks["text search"].detail
    assert checks["text search"].fix and "backup" in checks["text search"].fix
    assert checks["pgvector"].status == "ok"


@pytest.mark.slow  # waits out the store's connection retries (~5 s)
async def test_doctor_unreachable_server_masks_the_password(tmp_path: Path) -> None:
    url = f"postgresql://speakermem:s3cr3t-pw@/nowhere?host={tmp_path / 'no-socket'}"
    settings = pg_settings(tmp_path, url, db_lock_wait_s=0.2)
    (check,) = await store_checks(settings)
    assert check.status == "fail" and "SPEAKERMEM_DB_URL" in (check.fix or "")
    assert "s3cr3t-pw" not in check.detail and "***" in check.detail
    parsed = settings_checks(settings)[0].detail
    assert "s3cr3t-pw" not in parsed and parsed.startswith("db postgresql://speakermem:***@")


# ---- CLI commands on a PostgreSQL-only configuration ----------------------------------------


async def test_cli_reads_a_postgres_store_without_a_file(
    tmp_path: Path,
    seeded: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    missing = tmp_path / "never-created.db"
    monkeypatch.setenv("SPEAKERMEM_DB_PATH", str(missing))
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    # the SQLite configuration refuses: no file there
    assert await asyncio.to_thread(main, ["stats", "--json"]) != 0
    assert "no database yet" in capsys.readouterr().err

    monkeypatch.setenv("SPEAKERMEM_DB_URL", seeded)
    assert await asyncio.to_thread(main, ["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["messages"] == 5
    assert {c["channel"] for c in stats["channel_list"]} == {str(GENERAL), str(OTHER)}
    assert await asyncio.to_thread(main, ["records", "--owner", "alice"]) == 0
    assert "late supplier" in capsys.readouterr().out
    assert not missing.exists()
