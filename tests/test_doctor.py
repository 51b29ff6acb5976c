"""`speakermem doctor`: exit codes, fixes, and each check against real servers and a real store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from speakermem.bot.settings import Settings
from speakermem.integrations.doctor import (
    llm_checks,
    network_token_checks,
    parity_reference,
    run_checks,
    store_checks,
    token_checks,
)
from speakermem.integrations.doctor_checks import Check, exit_code
from speakermem.integrations.embeddings import minilm
from speakermem.integrations.embeddings.minilm import EmbedderUnavailable
from tests.llm_server import LLMServer, Reply
from tests.standins.discord_gateway import DiscordStandIn
from tests.standins.slack_api import SlackApiStandIn

SLACK_BOT = "xoxb-1234567890-0987654321-abcdefABCDEF1234"
SLACK_SECRET = "0123456789abcdef0123456789abcdef"
DISCORD = "MTIzNDU2Nzg5MDEyMzQ1Njc4OQ.GaBcDe.abcdefghijklmnopqrstuvwxyz0123456789AB"


def settings_for(tmp_path: Path, **extra: object) -> Settings:
    values: dict[str, object] = {"db_path": tmp_path / "doctor.db", "embedder": "none"}
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def doctor(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`speakermem doctor` in a fresh process, with only the given SPEAKERMEM_ settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    clean.update({"SPEAKERMEM_EMBEDDER": "none", "COLUMNS": "200", **env})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "--db",
            str(tmp_path / "d.db"),
            "doctor",
            *args,
        ],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,  # no .env from the working directory
        timeout=120,
    )


# ---- exit codes through the CLI ----------------------------------------------------------


@pytest.mark.e2e
def test_no_llm_exits_0_with_a_warning(tmp_path: Path) -> None:
    proc = doctor(tmp_path, "--offline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "warn" in out and "no LLM" in out
    assert "fix: set SPEAKERMEM_LLM_BASE_URL" in out  # the fix says what to set
    assert "schema" in out and "sqlite-vec" in out and "FTS5" in out


@pytest.mark.e2e
def test_unreachable_llm_exits_1_with_the_fix(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = doctor(tmp_path, "--quick", SPEAKERMEM_LLM_BASE_URL=url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "FAIL" in out and "reachable" in out
    assert f"fix: start the model server or fix SPEAKERMEM_LLM_BASE_URL ({url}" in out


def test_exit_code_counts_failures_only() -> None:
    ok = Check(area="a", name="x", status="ok")
    warn = Check(area="a", name="y", status="warn", fix="do y")
    fail = Check(area="a", name="z", status="fail", fix="do z")
    assert exit_code([ok, warn]) == 0
    assert exit_code([ok, warn, fail]) == 1


# ---- the LLM endpoint, against the scripted OpenAI-compatible server ------------------------


async def test_reachable_llm_with_structured_output_passes(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    llm_server.script(*[Reply(content='{"actions": [{"type": "NOOP"}]}')] * 2)
    settings = settings_for(tmp_path, llm_base_url=llm_server.base_url, llm_model="test-model")
    checks = await llm_checks(settings)
    assert [(c.name, c.status) for c in checks] == [
        ("reachable", "ok"),
        ("model listed", "ok"),
        ("server", "ok"),
        ("context", "warn"),  # a server that does not say its context
        ("structured output (json_schema)", "ok"),
        ("thinking", "ok"),
        ("latency", "ok"),
    ]
    assert llm_server.model_list_calls == 2  # the doctor's listing, then identifying the server
    sent = llm_server.last_request
    assert sent["model"] == "test-model"
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["name"] == "writer_actions"  # the real one
    assert exit_code(await run_checks(settings, network=False, embedder=False)) == 0


async def test_unlisted_model_and_unusable_output_fail_with_fixes(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    llm_server.script(Reply(content="sure! here you go"))
    settings = settings_for(tmp_path, llm_base_url=llm_server.base_url, llm_model="qwen-typo")
    checks = {c.name: c for c in await llm_checks(settings)}
    assert checks["model listed"].status == "fail"
    assert checks["model listed"].fix == "set SPEAKERMEM_LLM_MODEL to one of: test-model"
    structured = checks["structured output (json_schema)"]
    assert structured.status == "fail" and "json_object" in (structured.fix or "")
    assert "latency" not in checks


async def test_http_error_from_the_endpoint_is_a_failure(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    llm_server.fail_next(1, status=401)
    settings = settings_for(tmp_path, llm_base_url=llm_server.base_url, llm_model="test-model")
    (check,) = await llm_checks(settings)
    assert (check.status, check.fix) == ("fail", "check SPEAKERMEM_LLM_API_KEY")


# ---- the store and the embedder -------------------------------------------------------------


async def test_store_checks_report_driver_migrations_vec_and_fts(tmp_path: Path) -> None:
    checks = {c.name: c for c in await store_checks(settings_for(tmp_path))}
    assert all(c.status == "ok" for c in checks.values()), checks
    assert checks["sqlite-vec"].detail.startswith("v0.")
    of = checks["migrations"].detail.split()  # "schema N of N"
    assert of[1] == of[3]


async def test_unopenable_database_fails_with_a_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    (check,) = await store_checks(settings_for(tmp_path, db_path=blocker / "x.db"))
    assert check.status == "fail" and "SPEAKERMEM_DB_PATH" in (check.fix or "")


def _minilm_installed() -> bool:
    try:
        minilm.locate_model_dir()
    except EmbedderUnavailable:
        return False
    return True


def test_parity_reference_is_shipped_with_the_package() -> None:
    sentences, vectors = parity_reference()
    assert len(sentences) == vectors.shape[0] >= 3 and vectors.shape[1] == 384


@pytest.mark.slow
@pytest.mark.skipif(not _minilm_installed(), reason="MiniLM weights absent")
async def test_minilm_parity_check_passes(tmp_path: Path) -> None:
    from speakermem.integrations.doctor import embedder_checks

    checks = {c.name: c for c in await embedder_checks(settings_for(tmp_path, embedder="minilm"))}
    assert checks["loads"].status == "ok"
    parity = checks["parity with sentence-transformers"]
    assert parity.status == "ok" and float(parity.detail.split()[2]) >= 0.999


# ---- platform tokens ------------------------------------------------------------------------


def test_token_formats() -> None:
    good = Settings(  # type: ignore[call-arg]
        _env_file=None,
        slack_bot_token=SecretStr(SLACK_BOT),
        slack_signing_secret=SecretStr(SLACK_SECRET),
        discord_token=SecretStr(DISCORD),
    )
    assert {(c.area, c.status) for c in token_checks(good)} == {("slack", "ok"), ("discord", "ok")}
    bad = Settings(  # type: ignore[call-arg]
        _env_file=None,
        slack_bot_token=SecretStr("xoxp-user-token-not-a-bot"),
        slack_mode="socket",
        discord_token=SecretStr("client-secret"),
    )
    checks = token_checks(bad)
    assert [c.status for c in checks] == ["fail", "fail", "fail"]
    assert all(c.fix for c in checks)
    assert not any("xoxp-user" in c.detail or "client-secret" in c.detail for c in checks)


@pytest.mark.e2e
async def test_network_token_checks_call_auth_test_and_users_me(tmp_path: Path) -> None:
    slack = await SlackApiStandIn().start()
    discord = await DiscordStandIn().start()
    try:
        settings = settings_for(
            tmp_path,
            slack_bot_token=SecretStr(SLACK_BOT),
            slack_api_url=slack.base_url,
            discord_token=SecretStr(DISCORD),
            discord_api_url=discord.api_base,
        )
        checks = {c.name: c for c in await network_token_checks(settings)}
        assert checks["auth.test"].status == "ok" and "Stand-in" in checks["auth.test"].detail
        assert checks["users/@me"].status == "ok" and "speakermem" in checks["users/@me"].detail
        assert "auth.test" in [m for m, _ in slack.calls]
        assert any(path == "/users/@me" for _, path, _ in discord.requests)
    finally:
        await slack.close()
        await discord.close()


async def test_network_token_checks_fail_when_the_platform_is_unreachable(tmp_path: Path) -> None:
    port = free_port()
    settings = settings_for(
        tmp_path,
        slack_bot_token=SecretStr(SLACK_BOT),
        slack_api_url=f"http://127.0.0.1:{port}/api/",
        discord_token=SecretStr(DISCORD),
        discord_api_url=f"http://127.0.0.1:{port}/api/v10",
    )
    checks = await network_token_checks(settings)
    assert [c.status for c in checks] == ["fail", "fail"]
    assert all("cannot reach" in c.detail and c.fix for c in checks)
