"""The engine is the only door into memory: no module of bot/ or integrations/ reaches the
store behind it (`engine.store.<repo>`), whatever name the engine goes by there.

import-linter forbids importing `memory.store` outside the composition root
(pyproject.toml); attribute reach-throughs do not show in imports, so this reads the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "speakermem"
COMPOSITION_ROOT = PKG / "integrations" / "app.py"

PARTS = {
    "bot": [PKG / "bot"],
    "integrations (top level)": sorted((PKG / "integrations").glob("*.py")),
    "integrations/cli": [PKG / "integrations" / "cli"],
    "integrations/ops": [PKG / "integrations" / "ops"],
    "integrations/web": [PKG / "integrations" / "web"],
    "integrations/llm": [PKG / "integrations" / "llm"],
    "integrations/discord": [PKG / "integrations" / "discord"],
    "integrations/slack": [PKG / "integrations" / "slack"],
    "integrations/shell": [PKG / "integrations" / "shell"],
    "integrations/embeddings": [PKG / "integrations" / "embeddings"],
}


def reach_throughs(path: Path) -> list[str]:
    """Reads of an engine's `store` attribute (`engine.store`, `self.engine.store`,
    `bot.engine.store`...) in a module, as `file:line expression`. A config's `store`
    section (`settings.memory_config().store`) is not the store."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [
        f"{name}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "store"
        and ast.unparse(node.value).lower().endswith("engine")
    ]


def modules(part: str) -> list[Path]:
    out: list[Path] = []
    for where in PARTS[part]:
        out.extend(sorted(where.rglob("*.py")) if where.is_dir() else [where])
    return [p for p in out if p != COMPOSITION_ROOT]


def test_the_check_finds_a_reach_through(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "async def f(engine, bot):\n"
        "    await bot.engine.store.messages.counts()\n"
        "    return engine.admin.channels(), 'engine.store', settings.memory_config().store\n"
    )
    assert reach_throughs(sample) == ["sample.py:2 bot.engine.store"]


@pytest.mark.parametrize("part", list(PARTS))
def test_no_module_reaches_the_store_behind_the_engine(part: str) -> None:
    found = [hit for path in modules(part) for hit in reach_throughs(path)]
    assert not found, "call an engine method instead:\n" + "\n".join(found)
