"""Docs that cannot drift: every setting in .env.example with its default and meaning, every
CLI command with --help text and a line in the README, defaults written once."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, TypeAdapter

from bot.settings import Settings
from integrations.cli.main import build_parser
from memory.config import IngestConfig, RecallConfig, SearchConfig, StoreConfig, WriterConfig

ROOT = Path(__file__).resolve().parents[1]
ENV_EXAMPLE = ROOT / ".env.example"
README = ROOT / "README.md"
LINE = re.compile(r"^(#\s*)?SPEAKERMEM_([A-Z0-9_]+)=(.*)$")


def env_example() -> dict[str, tuple[bool, str, str]]:
    """NAME -> (active, value, the comment lines just above it)."""
    out: dict[str, tuple[bool, str, str]] = {}
    comment: list[str] = []
    for raw in ENV_EXAMPLE.read_text().splitlines():
        line = raw.strip()
        m = LINE.match(line)
        if m:
            name = m.group(2)
            assert name not in out, f"SPEAKERMEM_{name} appears twice in .env.example"
            out[name] = (m.group(1) is None, m.group(3).strip(), " ".join(comment))
            comment = [] if m.group(1) is None else comment
        elif line.startswith("#") and not line.startswith("# ---"):
            comment.append(line.lstrip("# ").strip())
        else:
            comment = []
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return value.expanduser()
    return value


def test_every_setting_is_in_env_example_with_its_default_and_meaning() -> None:
    documented = env_example()
    fields = {name.upper(): f for name, f in Settings.model_fields.items()}
    missing = sorted(f"SPEAKERMEM_{n}" for n in fields.keys() - documented.keys())
    assert not missing, f"add to .env.example (default + one-line meaning): {missing}"
    unknown = sorted(f"SPEAKERMEM_{n}" for n in documented.keys() - fields.keys())
    assert not unknown, f".env.example names settings that do not exist: {unknown}"
    for name, (active, value, meaning) in documented.items():
        assert len(meaning) >= 8, f"SPEAKERMEM_{name} needs a comment line saying what it does"
        field = fields[name]
        default = _plain(field.get_default(call_default_factory=True))
        if value == "":
            assert default in (None, "", False) or (active and default == ""), name
            continue
        parsed = _plain(TypeAdapter(field.annotation).validate_python(value, strict=False))
        if isinstance(default, Path):
            parsed = Path(str(value)).expanduser()
        if isinstance(default, bool):
            parsed = value.lower() in ("1", "true", "yes", "on")
        assert parsed == default, f"SPEAKERMEM_{name}={value} but the default is {default!r}"


def test_env_example_loads_as_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(__import__("os").environ):
        if key.startswith("SPEAKERMEM_"):
            monkeypatch.delenv(key)
    from_file = Settings(_env_file=ENV_EXAMPLE)  # type: ignore[call-arg]
    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    for name in Settings.model_fields:
        a, b = _plain(getattr(from_file, name)), _plain(getattr(defaults, name))
        assert a == b or (a in ("", None) and b in ("", None)), name


# ---- defaults written once ------------------------------------------------------------------

INHERITED: dict[str, tuple[type[BaseModel], str]] = {
    "db_path": (StoreConfig, "db_path"),
    "sqlite_driver": (StoreConfig, "sqlite_driver"),
    "db_readers": (StoreConfig, "readers"),
    "session_gap_minutes": (IngestConfig, "session_gap_minutes"),
    "writer_window": (IngestConfig, "segment_window"),
    "writer_concurrency": (WriterConfig, "concurrency"),
    "writer_max_concurrency": (WriterConfig, "max_concurrency"),
    "llm_prompt_price_per_mtok": (WriterConfig, "prompt_price_per_mtok"),
    "writer_heads_tokens": (WriterConfig, "heads_token_budget"),
    "gate_lexical_threshold": (WriterConfig, "gate_lexical_threshold"),
    "rrf_k0": (SearchConfig, "rrf_k0"),
    "recall_pool": (RecallConfig, "pool"),
    "recall_top_k": (RecallConfig, "top_k"),
    "recall_s2_k": (RecallConfig, "s2_k"),
    "recall_scope": (RecallConfig, "scope"),
}


def test_settings_take_memory_defaults_and_bounds_from_memory_config() -> None:
    for setting, (model, field) in INHERITED.items():
        mine, theirs = Settings.model_fields[setting], model.model_fields[field]
        assert mine.default == theirs.default, setting
        assert mine.metadata == theirs.metadata, setting  # same bounds (ge/le/gt)


def test_a_setting_reaches_the_memory_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEAKERMEM_RECALL_TOP_K", "7")
    monkeypatch.setenv("SPEAKERMEM_WRITER_WINDOW", "12")
    cfg = Settings(_env_file=None).memory_config()  # type: ignore[call-arg]
    assert cfg.recall.top_k == 7 and cfg.ingest.segment_window == 12
    monkeypatch.setenv("SPEAKERMEM_RECALL_TOP_K", "1000")  # RecallConfig's bound is 100
    with pytest.raises(ValueError):
        Settings(_env_file=None)  # type: ignore[call-arg]


# ---- every command has help, and the README lists it -----------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    """'name' or 'group sub' -> parser, for every subcommand of `speakermem`."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    full = f"{prefix} {name}".strip()
                    assert helps.get(name), f"`speakermem {full}` has no help line"
                    out[full] = sub
                    walk(sub, full)

    walk(build_parser(), "")
    return out


def test_every_command_has_help_text() -> None:
    commands = _commands()
    assert {"demo", "shell", "doctor", "discord invite-url", "discord-sync", "run"} <= set(commands)
    for name, parser in commands.items():
        assert parser.description, f"`speakermem {name}` has no description"
        text = parser.format_help()
        assert "usage: speakermem" in text
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help",):
                assert action.help, f"`speakermem {name} {action.option_strings[0]}` lacks help"


def test_readme_lists_every_command() -> None:
    readme = README.read_text()
    for name in _commands():
        assert f"speakermem {name}" in readme, f"README does not mention `speakermem {name}`"
