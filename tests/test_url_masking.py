"""Passwords and keys inside URLs never reach output (issue #40, items 2 and 8).

One rule (memory/url_masking.py, and the PostgreSQL key=value form in
memory/store/pg/database.py) masks every form; the password each case must hide is the one
libpq itself reads (`conninfo_to_dict`), so a form the rule misses fails here."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from speakermem.bot.settings import Settings
from speakermem.integrations.doctor import llm_checks
from speakermem.integrations.llm.server_profile import detect_server
from speakermem.memory.config import StoreConfig
from speakermem.memory.store import StoreError
from speakermem.memory.store.pg.database import PgDatabase, masked_url, scrub_error
from speakermem.memory.url_masking import mask_url
from tests.pg_fixtures import with_database

ROOT = Path(__file__).resolve().parents[1]

PG_FORMS = [
    "postgresql://bot:s3cr%21t-pw@db.example:5432/mem",
    "postgresql://bot@db.example/mem?password=s3cr3t-pw&sslmode=require",
    "postgres://db.example/mem?user=bot&password=s3cr3t-pw",
    "host=db.example user=bot password=s3cr3t-pw dbname=mem",
    "host=db.example user=bot password='s3cr 3t\\'pw' dbname=mem",
    "postgresql://bot:s3cr3t-pw@h1:5432,h2:5433/mem?target_session_attrs=read-write",
]


@pytest.mark.parametrize("url", PG_FORMS)
def test_every_libpq_password_form_is_masked(url: str) -> None:
    password = str(conninfo_to_dict(url)["password"])
    shown = masked_url(url)
    assert password not in shown and "s3cr" not in shown
    assert "***" in shown
    assert "db.example" in shown or "h1:5432,h2:5433" in shown  # still says where


def test_a_raw_at_sign_in_the_password_is_masked_whole() -> None:
    # libpq reads the password as "p" and the host as "ss@db.example"; the operator meant
    # "p@ss": neither half may show
    shown = masked_url("postgresql://bot:p@ss-word@db.example/mem")
    assert shown == "postgresql://bot:***@db.example/mem"


def test_a_url_without_credentials_is_unchanged() -> None:
    assert masked_url("postgresql:///mem?host=/tmp") == "postgresql:///mem?host=/tmp"
    assert mask_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1"


def test_a_parse_error_does_not_quote_the_connection_string() -> None:
    url = "host=db.example password=half of-secret dbname=mem"
    with pytest.raises(Exception) as caught:
        conninfo_to_dict(url)
    assert "of-secret" in str(caught.value)  # libpq quotes what it choked on
    assert "of-secret" not in scrub_error(str(caught.value), url)


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pa55word@llm.example/v1",
        "https://llm.example/v1?api-key=sk-abcdef123456",
        "https://llm.example/openai/deployments/x?api-version=2024-02&api_key=sk-abcdef123456",
        "https://llm.example/v1?access_token=sk-abcdef123456#frag",
    ],
)
def test_http_urls_lose_their_credentials(url: str) -> None:
    shown = mask_url(url)
    assert "pa55word" not in shown and "sk-abcdef123456" not in shown
    assert shown.startswith("https://") and "llm.example" in shown
    assert "api-version=2024-02" in mask_url(url) or "api-version" not in url


# ---- against PostgreSQL ------------------------------------------------------------------


def with_password(url: str, password: str) -> str:
    return url + ("&" if "?" in url else "?") + f"password={password}"


async def test_store_open_log_and_location_hide_the_password(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = with_password(pg_url, "s3cr3t-in-query")  # the test server trusts local sockets
    db = PgDatabase(StoreConfig(db_url=url, readers=1))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="speakermem.memory.store.pg.database"):
        await db.open()
    try:
        opened = [r.getMessage() for r in caplog.records if "store open" in r.getMessage()]
        assert opened and "password=***" in opened[0]
        assert "s3cr3t-in-query" not in caplog.text
        assert "s3cr3t-in-query" not in db.where and "s3cr3t-in-query" not in str(db.path)
    finally:
        await db.close()


async def test_a_failed_open_names_the_database_without_its_password(pg_url: str) -> None:
    url = with_password(with_database(pg_url, "no_such_db"), "s3cr3t-in-query")
    db = PgDatabase(StoreConfig(db_url=url, readers=1, lock_wait_s=0.5))  # type: ignore[arg-type]
    with pytest.raises(StoreError) as caught:
        await db.open()
    assert "s3cr3t-in-query" not in str(caught.value)
    assert "password=***" in str(caught.value)


# ---- item 8: URL settings in `config`, `doctor` and the LLM probe ------------------------

CRED_URL = "http://probe-user:pa55word-xyz@127.0.0.1:{port}/v1?api-key=sk-key-0123456789"
SECRETS = ("pa55word-xyz", "sk-key-0123456789")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e
def test_config_masks_credentials_inside_url_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEAKERMEM_")}
    url = CRED_URL.format(port=9)
    env.update(
        SPEAKERMEM_DB_PATH=str(tmp_path / "c.db"),
        SPEAKERMEM_LLM_BASE_URL=url,
        SPEAKERMEM_EMBEDDING_BASE_URL=url,
        SPEAKERMEM_WEB_PUBLIC_URL="https://admin:pa55word-xyz@console.example",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "--log-level",
            "DEBUG",
            "config",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for secret in SECRETS:
        assert secret not in proc.stdout + proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["llm_base_url"] == "http://probe-user:***@127.0.0.1:9/v1?api-key=***"
    assert shown["web_public_url"] == "https://admin:***@console.example"


async def test_doctor_llm_check_masks_credentials_in_the_url(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=tmp_path / "d.db",
        embedder="none",
        llm_base_url=CRED_URL.format(port=free_port()),
    )
    (check,) = await llm_checks(settings)
    assert check.status == "fail"
    text = f"{check.detail} {check.fix}"
    assert "127.0.0.1" in text
    for secret in SECRETS:
        assert secret not in text


async def test_llm_server_probe_log_masks_credentials(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="speakermem.integrations.llm.server_profile"):
        # (aiohttp refuses user info beside the probe's own Authorization header)
        url = f"http://127.0.0.1:{free_port()}/v1?api-key=sk-key-0123456789"
        found = await detect_server(url, "k", "m", timeout_s=2)
    assert found is None
    assert "unreachable" in caplog.text and "api-key=***" in caplog.text
    for secret in SECRETS:
        assert secret not in caplog.text
