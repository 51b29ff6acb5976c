"""One import package, `speakermem`, in a src layout; the version written once; no source file
past 600 lines. The wheel itself is built, installed and run by deploy/wheel.sh in CI."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import speakermem

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def test_src_holds_one_package_and_its_layers() -> None:
    assert sorted(p.name for p in (ROOT / "src").iterdir() if not p.name.endswith("egg-info")) == [
        "speakermem"
    ]
    layers = {p.name for p in (ROOT / "src" / "speakermem").iterdir() if p.is_dir()}
    assert {"memory", "bot", "integrations"} <= layers
    for generic in ("memory", "bot", "integrations"):
        assert not (ROOT / generic).exists(), f"a top-level {generic}/ is back"


def test_the_build_finds_only_the_speakermem_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    assert find == {"where": ["src"], "include": ["speakermem*"]}
    assert pyproject["project"]["scripts"]["speakermem"].startswith("speakermem.")
    contracts = pyproject["tool"]["importlinter"]
    assert contracts["root_packages"] == ["speakermem"]


def test_the_version_is_written_once() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "speakermem.__version__"
    }
    out = subprocess.run(
        [sys.executable, "-m", "speakermem", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == f"speakermem {speakermem.__version__}"


def test_no_source_file_grows_past_600_lines() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.sh", "*.md", "*.html", "*.js", "*.css"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not tracked:  # not a git checkout (an unpacked sdist): walk the tree instead
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ".venv" not in p.parts]
    long = {
        name: n
        for name in tracked
        if (ROOT / name).is_file()
        and (n := len((ROOT / name).read_text(errors="replace").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_cli_starts_without_the_platform_and_model_clients() -> None:
    """`speakermem --version`, `--help` and every command's start load the parser, not the
    modules a command runs: the OpenAI client, discord.py, Bolt, ONNX Runtime, the runtime,
    the store, the recall pipeline, the web server and the embedder are imported by the
    commands that use them."""
    heavy = [
        "openai",
        "discord",
        "slack_bolt",
        "slack_sdk",
        "onnxruntime",
        "aiohttp",
        "aiosqlite",
        "numpy",
        "speakermem.integrations.runtime",
        "speakermem.integrations.shell.session",
        "speakermem.integrations.web.server",
        "speakermem.integrations.embeddings.minilm",
        "speakermem.memory.engine",
        "speakermem.memory.store",
        "speakermem.memory.query.pipeline",
        "speakermem.memory.eval.harness",
    ]
    code = (
        "import sys, speakermem.integrations.cli.main as m; m.build_parser(); "
        f"print(','.join(n for n in {heavy!r} if n in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
