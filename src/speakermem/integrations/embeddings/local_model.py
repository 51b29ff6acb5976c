"""A sentence-embedding model from a local folder (`SPEAKERMEM_EMBEDDER=onnx:<dir>`).

For a model other than all-MiniLM-L6-v2, such as a multilingual one, installed and loaded
offline. The folder holds `tokenizer.json` (the Hugging Face tokenizers format) and either
`model.onnx` whose outputs are `sentence_embedding` and `token_embeddings` (inputs
`input_ids`, `attention_mask`), or a BERT-family `model.safetensors` with its `config.json`,
rebuilt once as such a graph (integrations/embeddings/onnx_graph.py: mean pooling and L2
normalisation included) and cached. Vectors must have the store's width (384).

Everything else (threads, priorities, batching) is MiniLMEmbedder's.
"""

from __future__ import annotations

import json
from pathlib import Path

from speakermem.integrations.embeddings.minilm import (
    DIM,
    THREADS,
    EmbedderUnavailable,
    MiniLMEmbedder,
    ModelFiles,
    ensure_onnx,
    sha256_file,
)

PREFIX = "onnx:"
OUTPUTS = ("sentence_embedding", "token_embeddings")


def model_dir_of(setting: str) -> Path:
    """The folder of an `onnx:<dir>` setting."""
    if not setting.startswith(PREFIX) or not setting[len(PREFIX) :].strip():
        raise ValueError(f"expected {PREFIX}<folder>, got {setting!r}")
    return Path(setting[len(PREFIX) :].strip()).expanduser()


def check_folder(folder: Path) -> ModelFiles:
    """The folder's model files, or a clear error naming what is missing."""
    if not folder.is_dir():
        raise EmbedderUnavailable(f"SPEAKERMEM_EMBEDDER=onnx:{folder}: no such folder")
    files = ModelFiles(folder)
    missing = [] if files.tokenizer.is_file() else ["tokenizer.json"]
    if not (folder / "model.onnx").is_file():
        if not files.safetensors.is_file():
            missing.append("model.onnx (or model.safetensors with config.json)")
        elif not files.config.is_file():
            missing.append("config.json (beside model.safetensors)")
    if missing:
        raise EmbedderUnavailable(
            f"SPEAKERMEM_EMBEDDER=onnx:{folder}: the folder lacks {', '.join(missing)}"
        )
    return files


class LocalModelEmbedder(MiniLMEmbedder):
    """A local folder's sentence-embedding model via ONNX Runtime; loads lazily."""

    def __init__(
        self,
        folder: Path,
        *,
        cache_dir: Path | None = None,
        quantize: bool = False,
        threads: int = THREADS,
    ) -> None:
        self.files = check_folder(folder)
        super().__init__(model_dir=folder, cache_dir=cache_dir, quantize=quantize, threads=threads)
        weights = folder / "model.onnx"
        if not weights.is_file():
            weights = self.files.safetensors
        self.name = f"onnx:{folder.name}@{sha256_file(weights)[:12]}"
        """Which model wrote a vector: the folder's name and its weights' hash."""

    def _onnx_path(self, files: ModelFiles) -> Path:
        given = files.model_dir / "model.onnx"
        if given.is_file():
            import onnx

            names = {o.name for o in onnx.load(str(given), load_external_data=False).graph.output}
            if not set(OUTPUTS) <= names:
                raise EmbedderUnavailable(
                    f"{given}: the graph's outputs are {sorted(names)}; SpeakerMem needs "
                    f"{', '.join(OUTPUTS)} (or give model.safetensors and config.json instead)"
                )
            return given
        config = json.loads(files.config.read_text(encoding="utf-8"))
        width = int(config.get("hidden_size", 0))
        if width != DIM:
            raise EmbedderUnavailable(
                f"{files.config}: the model gives {width}-dimensional vectors; the store holds "
                f"{DIM}-dimensional ones"
            )
        return ensure_onnx(
            files,
            self.cache_dir,
            quantize=self.quantize,
            fused=self.fused,
            expected_sha=None,
            label=f"local-{files.model_dir.name}",
        )

    def load(self) -> None:
        super().load()
        out = next(o for o in self._session.get_outputs() if o.name == OUTPUTS[0])
        width = out.shape[-1]
        if isinstance(width, int) and width != DIM:
            raise EmbedderUnavailable(
                f"{self.files.model_dir}: the model gives {width}-dimensional vectors; the "
                f"store holds {DIM}-dimensional ones"
            )
