"""A store keeps the name of the model that wrote its vectors: a process embedding with
another model is refused at start, with the command that re-embeds; `reembed` moves the
store to the new model (messages and records)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.store.errors import EmbedderMismatch
from tests.conftest import msg
from tests.fakes import HashEmbedder
from tests.store_contract.conftest import record

SCOPE = Scope(platform="test", workspace="w1", channel="general")


class OtherEmbedder(HashEmbedder):
    name = "other-model"


class QuantisedHash(HashEmbedder):
    name = "hash-test:int8"


def config(tmp_path: Path) -> MemoryConfig:
    return MemoryConfig(store=StoreConfig(db_path=tmp_path / "s.db"))


async def test_another_model_is_refused_until_the_store_is_re_embedded(tmp_path: Path) -> None:
    first = await MemoryEngine.open(config(tmp_path), HashEmbedder())
    try:
        await first.ingest_many([msg(SCOPE, f"m{i}", "Al", f"text {i}", i) for i in range(4)])
        assert await first.embed_pending() == 4
        await first.store.records.add_records(
            SCOPE,
            [record("Al likes tea", owner="al")],
            HashEmbedder().embed_sync(["Al likes tea"]),
        )
        assert await first.store.messages.vectors_written_by() == "hash-test"
    finally:
        await first.close()

    with pytest.raises(EmbedderMismatch, match="speakermem reembed"):
        await MemoryEngine.open(config(tmp_path), OtherEmbedder())
    again = await MemoryEngine.open(config(tmp_path), QuantisedHash())
    await again.close()  # the same model quantised is the same model

    moving = await MemoryEngine.open(config(tmp_path), OtherEmbedder(), check_embedder=False)
    try:
        assert await moving.reembed() == 5  # four messages, one record
        assert await moving.store.messages.count_pending_embeddings() == 0
    finally:
        await moving.close()
    moved = await MemoryEngine.open(config(tmp_path), OtherEmbedder())
    try:
        assert await moved.store.messages.vectors_written_by() == "other-model"
    finally:
        await moved.close()
    with pytest.raises(EmbedderMismatch, match="'other-model'"):
        await MemoryEngine.open(config(tmp_path), HashEmbedder())


async def test_a_store_without_vectors_takes_the_new_models_name(tmp_path: Path) -> None:
    await (await MemoryEngine.open(config(tmp_path), HashEmbedder())).close()
    eng = await MemoryEngine.open(config(tmp_path), OtherEmbedder())
    try:
        assert await eng.store.messages.vectors_written_by() == "other-model"
    finally:
        await eng.close()


@pytest.mark.e2e
async def test_speakermem_reembed_moves_a_store_to_a_local_model(tmp_path: Path) -> None:
    from tests.test_local_embedder import write_tiny_bert

    eng = await MemoryEngine.open(config(tmp_path), HashEmbedder())
    try:
        await eng.ingest_many([msg(SCOPE, f"m{i}", "Al", f"release plan {i}", i) for i in range(3)])
        await eng.embed_pending()
    finally:
        await eng.close()
    model = tmp_path / "tiny"
    write_tiny_bert(model)

    def cli(*args: str, embedder: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "SPEAKERMEM_EMBEDDER": embedder,
            "SPEAKERMEM_LLM_BASE_URL": "",
            "SPEAKERMEM_MODEL_CACHE_DIR": str(tmp_path / "cache"),
        }
        db = str(tmp_path / "s.db")
        return subprocess.run(
            [sys.executable, "-m", "speakermem.integrations.cli.main", "--db", db, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=tmp_path,
        )

    search = ("search", "--channel", "general", "--mode", "dense", "--json", "release")
    refused = cli(*search, embedder=f"onnx:{model}")
    assert refused.returncode != 0 and "speakermem reembed" in refused.stderr + refused.stdout
    done = cli("reembed", embedder=f"onnx:{model}")
    assert done.returncode == 0, done.stderr
    assert "re-embedded 3 messages and records with onnx:tiny@" in done.stderr
    assert cli(*search, embedder=f"onnx:{model}").returncode == 0
    assert cli("reembed", embedder="none").returncode == 2
