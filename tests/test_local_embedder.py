"""`SPEAKERMEM_EMBEDDER=onnx:<folder>`: a sentence-embedding model from a local folder, here
a tiny random-weight BERT the test writes (safetensors + config + tokenizer.json), and the
ONNX graph built from it given as `model.onnx`; missing files are a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_embedder
from speakermem.integrations.embeddings.local_model import LocalModelEmbedder
from speakermem.integrations.embeddings.minilm import EmbedderUnavailable

HIDDEN, HEADS, INTER, LAYERS, POSITIONS = 384, 4, 32, 1, 64
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "release",
    "plan",
    "lunch",
    "发",
    "布",
    "リ",
    "ー",
    "ス",
]


def write_tiny_bert(folder: Path, *, hidden: int = HIDDEN) -> None:
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    rng = np.random.default_rng(0)

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = {
        "embeddings.word_embeddings.weight": r(len(VOCAB), hidden),
        "embeddings.position_embeddings.weight": r(POSITIONS, hidden),
        "embeddings.token_type_embeddings.weight": r(2, hidden),
        "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32),
    }
    for i in range(LAYERS):
        p, a = f"encoder.layer.{i}", f"encoder.layer.{i}.attention"
        for n in ("query", "key", "value"):
            w[f"{a}.self.{n}.weight"], w[f"{a}.self.{n}.bias"] = r(hidden, hidden), r(hidden)
        w[f"{a}.output.dense.weight"], w[f"{a}.output.dense.bias"] = r(hidden, hidden), r(hidden)
        w[f"{a}.output.LayerNorm.weight"] = np.ones(hidden, np.float32)
        w[f"{a}.output.LayerNorm.bias"] = np.zeros(hidden, np.float32)
        w[f"{p}.intermediate.dense.weight"], w[f"{p}.intermediate.dense.bias"] = (
            r(INTER, hidden),
            r(INTER),
        )
        w[f"{p}.output.dense.weight"], w[f"{p}.output.dense.bias"] = r(hidden, INTER), r(hidden)
        w[f"{p}.output.LayerNorm.weight"] = np.ones(hidden, np.float32)
        w[f"{p}.output.LayerNorm.bias"] = np.zeros(hidden, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(w, str(folder / "model.safetensors"))
    config = {
        "model_type": "bert",
        "hidden_size": hidden,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "intermediate_size": INTER,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(folder / "tokenizer.json"))


def settings(tmp_path: Path, folder: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        embedder=f"onnx:{folder}",
        model_cache_dir=tmp_path / "cache",
        embed_threads=1,
    )


def test_a_local_safetensors_model_embeds_unit_vectors(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-multilingual"
    write_tiny_bert(folder)
    emb = build_embedder(settings(tmp_path, folder))
    assert isinstance(emb, LocalModelEmbedder)
    try:
        vecs = emb.embed_sync(["release plan", "发布", "リリース", "lunch"])
        assert vecs.shape == (4, 384) and vecs.dtype == np.float32
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
        assert not np.allclose(vecs[0], vecs[3])  # different texts, different vectors
        assert emb.name.startswith("onnx:tiny-multilingual@")
        assert emb.onnx_path is not None and emb.onnx_path.parent == tmp_path / "cache"
        built = emb.onnx_path
    finally:
        emb.close()
    # the built graph given as model.onnx (no weights, no config) embeds the same
    onnx_folder = tmp_path / "as-onnx"
    onnx_folder.mkdir()
    shutil.copy(built, onnx_folder / "model.onnx")
    shutil.copy(folder / "tokenizer.json", onnx_folder / "tokenizer.json")
    again = build_embedder(settings(tmp_path, onnx_folder))
    try:
        assert np.allclose(again.embed_sync(["release plan"])[0], vecs[0], atol=1e-5)  # type: ignore[union-attr]
    finally:
        again.close()  # type: ignore[union-attr]


def test_missing_files_and_wrong_widths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailable, match="no such folder"):
        build_embedder(settings(tmp_path, tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EmbedderUnavailable, match=r"lacks tokenizer\.json, model\.onnx"):
        build_embedder(settings(tmp_path, empty))
    folder = tmp_path / "no-config"
    write_tiny_bert(folder)
    (folder / "config.json").unlink()
    with pytest.raises(EmbedderUnavailable, match=r"config\.json"):
        build_embedder(settings(tmp_path, folder))
    wide = tmp_path / "wide"
    write_tiny_bert(wide, hidden=32)
    emb = build_embedder(settings(tmp_path, wide))
    try:
        with pytest.raises(EmbedderUnavailable, match="32-dimensional"):
            emb.embed_sync(["release"])  # type: ignore[union-attr]
    finally:
        emb.close()  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="embedder"):
        Settings(_env_file=None, embedder="onnx:")  # type: ignore[call-arg]
