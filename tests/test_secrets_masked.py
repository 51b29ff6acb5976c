"""Secrets never reach output: `speakermem config` (and its DEBUG logs) print every secret
setting masked. The secret settings are found from their type, so a new one is covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import SecretStr

from speakermem.bot.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def secret_fields() -> list[str]:
    return [
        name
        for name, field in Settings.model_fields.items()
        if field.annotation is SecretStr or SecretStr in get_args(field.annotation)
    ]


def test_the_known_secrets_are_secret_fields() -> None:
    found = set(secret_fields())
    assert {"slack_bot_token", "slack_signing_secret", "discord_token", "llm_api_key"} <= found


@pytest.mark.e2e
def test_config_prints_every_secret_masked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    values = {name: f"sekrit-{name}-0123456789" for name in secret_fields()}
    env.update({f"SPEAKERMEM_{name.upper()}": value for name, value in values.items()})
    env["SPEAKERMEM_DB_PATH"] = str(tmp_path / "c.db")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "--log-level",
            "DEBUG",
            "config",
        ],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,  # no .env of the checkout is read
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    for value in values.values():
        assert value not in output
        assert value[: len(value) // 2] not in output  # not even a prefix
    shown = json.loads(proc.stdout)
    for name in values:
        assert shown[name] == "**********", name  # present, and masked
