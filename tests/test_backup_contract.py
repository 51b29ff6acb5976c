"""Backups in the contract suite: `speakermem backup` and the documented restore answer the
same on both store backends.

The assertions are shared; only the restore differs, in `restore_copy`:
- SQLite: the backup is a database file (VACUUM INTO); restoring is copying it into place
  (with no `-wal`/`-shm` beside it) and opening it.
- PostgreSQL: the backup is a pg_dump custom-format archive; restoring is `pg_restore --clean
  --if-exists --no-owner` into an empty database of the same server (pgserver's own client
  programs, which match the server's version) and opening that database.

What is compared: message counts and live rows, lexical, dense and hybrid search hits with
their scores, records with their update chains, sources and vectors, the forget receipt in
the audit log and the re-derivation queue it left, segments and Writer runs, the
interaction graph, and the schema version. A backup taken while another task keeps
ingesting holds whole transactions only.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.interactions import interaction_names
from speakermem.memory.models import Scope
from speakermem.memory.store import pick_driver
from speakermem.memory.store.backup import backup_store
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.test_governance_forget import GENERAL, SECRET, seed

pytestmark = pytest.mark.contract

QUERIES = ("zorblatt garden", "dravenox fixed together", "launch", "practice tonight")
BATCH = 10


# ---- the backend-specific steps ----------------------------------------------------------


@pytest.fixture
def pg_client(backend: str, request: pytest.FixtureRequest) -> Path | None:
    """On PostgreSQL, pgserver's pg_dump/pg_restore first on PATH (the server's version);
    None on SQLite."""
    if backend != "postgres":
        return None
    return Path(request.getfixturevalue("pg_bin"))


def run_backup_cli(config: MemoryConfig, dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`speakermem backup DEST` as an operator runs it, against the store `config` selects
    (on PostgreSQL the contract fixture has set SPEAKERMEM_DB_URL already)."""
    monkeypatch.setenv("SPEAKERMEM_DB_PATH", str(config.store.db_path))
    assert main(["backup", str(dest)]) == 0


async def restore_copy(
    backup: Path, tmp_path: Path, request: pytest.FixtureRequest, pg_client: Path | None
) -> MemoryConfig:
    """Restore `backup` as the README documents for the backend; the restored store's
    configuration."""
    home = tmp_path / "restored"
    home.mkdir(exist_ok=True)
    if pg_client is None:  # SQLite: copy the file into place, no -wal/-shm beside it
        target = home / "speakermem.db"
        await asyncio.to_thread(shutil.copyfile, backup, target)
        assert not list(home.glob("*-wal")) and not list(home.glob("*-shm"))
        return MemoryConfig(store=StoreConfig(db_path=target))
    # PostgreSQL: pg_restore into an empty database of the same server
    url = request.getfixturevalue("pg_databases").url_for(str(home))
    await asyncio.to_thread(
        subprocess.run,
        [
            str(pg_client / "pg_restore"),
            "--clean",
            "--if-exists",
            "--no-owner",
            "--dbname",
            url,
            str(backup),
        ],
        check=True,
        capture_output=True,
    )
    return MemoryConfig(store=StoreConfig(db_path=home / "unused.db", db_url=url))


# ---- what a store answers ----------------------------------------------------------------


async def answers(engine: MemoryEngine, embedder: HashEmbedder) -> dict[str, Any]:
    """Everything the comparison covers, read through the engine and its repositories."""
    scopes = [GENERAL, SECRET]
    pks = await engine.channel_pks(scopes)
    out: dict[str, Any] = {"counts": await engine.store.messages.counts()}
    for q in QUERIES:
        for mode in ("lexical", "dense", "hybrid"):
            hits = await engine.search(q, scopes, mode=mode, limit=5)
            out[f"{mode}:{q}"] = [(h.message.message_id, round(h.score, 6)) for h in hits]
        vec = embedder.embed_sync([q])[0]
        out[f"records-dense:{q}"] = [
            (rid, round(score, 6)) for rid, score in await engine.store.records.dense(vec, pks, 5)
        ]
    out["records"] = [
        tuple(r)
        for r in await engine.store.db.read(
            "SELECT id, owner, source, content, state, supersedes, superseded_by, chain_root,"
            " from_ids FROM records ORDER BY id"
        )
    ]
    out["heads"] = sorted(r.id for r in await engine.store.records.heads(pks))
    out["record_sources"] = [
        tuple(r)
        for r in await engine.store.db.read(
            "SELECT record_id, message_pk FROM record_sources ORDER BY record_id, message_pk"
        )
    ]
    out["record_counts"] = await engine.store.records.counts()
    out["audit"] = await Governance(engine).audit(20)
    out["rederive"] = [
        tuple(r)
        for r in await engine.store.db.read(
            "SELECT owner, source, from_ids FROM rederive_queue ORDER BY id"
        )
    ]
    out["segments"] = [
        tuple(r)
        for r in await engine.store.db.read(
            "SELECT id, state, n_messages FROM segments ORDER BY id"
        )
    ]
    out["live"] = sorted(
        r[0]
        for r in await engine.store.db.read(
            "SELECT message_id FROM messages WHERE deleted_at IS NULL"
        )
    )
    message_pks = [r[0] for r in await engine.store.db.read("SELECT id FROM messages ORDER BY id")]
    out["addressees"] = await engine.store.interactions.addressees(message_pks)
    out["parents"] = await engine.store.interactions.parents(message_pks)
    out["schema"] = await engine.store.db.schema_version()
    return out


# ---- the tests ---------------------------------------------------------------------------


async def test_a_restored_backup_answers_the_same(
    engine: MemoryEngine,
    embedder: HashEmbedder,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    pg_client: Path | None,
) -> None:
    ids = await seed(engine, embedder)
    gov = Governance(engine)
    receipt = await gov.forget_message(GENERAL, "b1", actor="cli")
    assert receipt.counts["messages"] == 1 and receipt.counts["records"] >= 1
    (pk,) = await engine.channel_pks([GENERAL])
    await engine.store.interactions.update(pk, interaction_names(await engine.members(GENERAL)))
    before = await answers(engine, embedder)
    # the things compared are really there: hits, a chain, a receipt, a queued re-derivation
    assert before["lexical:zorblatt garden"] and before["dense:launch"]
    assert any(r[5] == ids["alice_v1"] for r in before["records"])
    assert [e["action"] for e in before["audit"]] == ["forget-message"]
    assert before["audit"][0]["receipt"] == receipt.counts
    assert before["rederive"] and before["parents"]

    dest = tmp_path / "backups" / "speakermem.backup"
    await asyncio.to_thread(run_backup_cli, engine.config, dest, monkeypatch)
    assert dest.stat().st_size > 0 and not list(dest.parent.glob(".*partial"))
    # the source goes on after the backup; the restored copy must not see that
    await engine.ingest(msg(GENERAL, "late", "Carol", "zorblatt garden party after the backup", 9))

    restored = await MemoryEngine.open(
        await restore_copy(dest, tmp_path, request, pg_client), HashEmbedder()
    )
    try:
        assert await answers(restored, embedder) == before
        # the restored store is a working store: it ingests and finds what it ingested
        (got,) = await restored.ingest_many([msg(GENERAL, "new", "Dan", "a quillisk arrived", 10)])
        assert got.status.value == "stored"
        hits = await restored.search("quillisk", [GENERAL], mode="lexical", limit=3)
        assert [h.message.message_id for h in hits] == ["new"]
    finally:
        await restored.close()


async def test_a_backup_during_ingestion_holds_whole_transactions(
    engine: MemoryEngine,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    pg_client: Path | None,
) -> None:
    """Another task ingests batches of BATCH messages (one transaction each) before, during
    and after the backup: the copy holds each batch whole or not at all, its segments count
    exactly its messages, and the counts the backup reports are the copy's."""
    scope = Scope(platform="test", workspace="w1", channel="busy")
    stop = asyncio.Event()
    committed: list[int] = []
    progress = asyncio.Condition()

    async def ingest() -> None:
        n = 0
        while not stop.is_set():
            await engine.ingest_many(
                msg(scope, f"b{n}-{i}", ["Ann", "Bob"][i % 2], f"batch {n} note {i}", n + i / 100)
                for i in range(BATCH)
            )
            async with progress:
                committed.append(n)
                progress.notify_all()
            n += 1
            await asyncio.sleep(0)

    async def wait_for(batches: int) -> None:
        async with progress:
            await progress.wait_for(lambda: len(committed) >= batches)

    writer = asyncio.create_task(ingest())
    try:
        await asyncio.wait_for(wait_for(20), 60.0)  # a store worth a backup's while
        driver = None if pg_client is not None else pick_driver("auto")
        for attempt in range(5):  # a backup that happened to fit between two batches: again
            started_with = len(committed)
            target = tmp_path / f"live{attempt}.backup"
            result = await backup_store(engine.config.store, target, driver)
            finished_with = len(committed)
            if finished_with > started_with:
                break
        await asyncio.wait_for(wait_for(finished_with + 2), 30.0)
    finally:
        stop.set()
        await writer
    assert finished_with > started_with  # ingestion really ran while the backup did

    restored = await MemoryEngine.open(
        await restore_copy(target, tmp_path, request, pg_client),
        HashEmbedder(),
    )
    try:
        rows = await restored.store.db.read("SELECT message_id FROM messages")
        per_batch: dict[str, int] = {}
        for (mid,) in rows:
            batch = mid.split("-")[0]
            per_batch[batch] = per_batch.get(batch, 0) + 1
        assert set(per_batch.values()) == {BATCH}  # no batch cut in half
        assert started_with * BATCH <= len(rows) <= finished_with * BATCH
        assert result.messages == len(rows)  # the counts reported are the copy's
        (in_segments,) = (await restored.store.db.read("SELECT sum(n_messages) FROM segments"))[0]
        assert in_segments == len(rows)
        counts = await restored.store.messages.counts()
        assert counts["messages"] == len(rows)
        # the batches present are the first ones, in order: a prefix of what was committed
        assert sorted(int(b[1:]) for b in per_batch) == list(range(len(per_batch)))
    finally:
        await restored.close()
