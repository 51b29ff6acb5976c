"""Files holding members' text are the bot's own, whatever the umask (issue #40, item 3):
the SQLite file with its -wal and -shm, backups on both backends, `export user --out`;
directories made for them are 0700; `doctor` warns on a readable database."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.main import main
from speakermem.integrations.doctor import store_checks
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.maintenance import backup
from speakermem.memory.models import Scope
from tests.conftest import msg
from tests.pg_fixtures import PgDatabases

ROOT = Path(__file__).resolve().parents[1]
GENERAL = Scope(platform="slack", workspace="T1", channel="C1")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The common default: without the fix every file here comes out 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def seeded(config: MemoryConfig) -> MemoryEngine:
    engine = await MemoryEngine.open(config)
    await engine.ingest_many([msg(GENERAL, "1.1", "Alice", "the kumquat order is late", 0)])
    return engine


async def test_sqlite_file_wal_shm_and_new_directories_are_private(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    os.chmod(base, 0o755)
    db = base / "made" / "here" / "m.db"
    engine = await seeded(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        wal, shm = db.with_name("m.db-wal"), db.with_name("m.db-shm")
        assert wal.exists() and shm.exists()  # open in WAL mode, with a write behind it
        assert (mode(db), mode(wal), mode(shm)) == (0o600, 0o600, 0o600)
        assert mode(db.parent) == 0o700 and mode(db.parent.parent) == 0o700
        assert mode(base) == 0o755  # a directory that was there is left alone
    finally:
        await engine.close()


async def test_a_readable_database_from_an_older_version_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    engine = await seeded(MemoryConfig(store=StoreConfig(db_path=db)))
    await engine.close()
    os.chmod(db, 0o644)
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        assert mode(db) == 0o600
    finally:
        await engine.close()


async def test_sqlite_backup_is_private(tmp_path: Path) -> None:
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "m.db"))
    engine = await seeded(config)
    await engine.close()
    dest = tmp_path / "backups" / "b.db"
    await backup(config.store, dest)
    assert mode(dest) == 0o600 and mode(dest.parent) == 0o700


@pytest.mark.e2e
async def test_postgres_backup_is_private(
    tmp_path: Path, pg_store_databases: PgDatabases, pg_bin: Path
) -> None:
    url = pg_store_databases.url_for("modes")
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "unused.db", db_url=url))  # type: ignore[arg-type]
    engine = await seeded(config)
    await engine.close()
    dest = tmp_path / "backups" / "b.dump"
    await backup(config.store, dest)
    assert mode(dest) == 0o600 and mode(dest.parent) == 0o700


def test_export_out_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    db = tmp_path / "g.db"
    engine = asyncio.run(seeded(MemoryConfig(store=StoreConfig(db_path=db))))
    asyncio.run(engine.close())
    out = tmp_path / "exports" / "alice.json"
    assert main(["--db", str(db), "export", "user", "alice", "--out", str(out)]) == 0
    assert "kumquat" in out.read_text()
    assert mode(out) == 0o600 and mode(out.parent) == 0o700


async def test_doctor_warns_on_a_readable_database(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    settings = Settings(_env_file=None, db_path=db, embedder="none")  # type: ignore[call-arg]
    engine = await seeded(MemoryConfig(store=StoreConfig(db_path=db)))
    await engine.close()
    checks = {c.name: c for c in await store_checks(settings)}
    assert checks["file mode"].status == "ok"
    os.chmod(db, 0o644)
    check = {c.name: c for c in await store_checks(settings)}["file mode"]
    assert check.status == "warn" and str(db) in (check.detail or "")
    assert "UMask=0077" in (check.fix or "")


def test_deploy_files_set_umask_0077() -> None:
    unit = (ROOT / "deploy" / "speakermem.service").read_text()
    assert "\nUMask=0077\n" in unit
    compose = (ROOT / "deploy" / "compose.yml").read_text()
    assert "umask 0077 && exec speakermem" in compose
