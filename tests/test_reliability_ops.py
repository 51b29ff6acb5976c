"""Operations: /healthz and /metrics of a running bot, JSON logs, LLM metering, backup/restore."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from speakermem.bot.health import HealthFacts, LLMHealth, decide
from speakermem.bot.settings import Settings
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.integrations.ops import server
from speakermem.integrations.ops.logs import JsonFormatter, StderrHandler, configure_logging
from speakermem.integrations.ops.metrics import MeteredLLM, Metrics
from speakermem.integrations.ops.server import OpsServer
from speakermem.integrations.runtime import run
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.ports import ChatMessage, LLMUnavailable
from speakermem.memory.search.cjk import index_text
from speakermem.memory.store.sqlite.backup import backup_database
from speakermem.memory.store.sqlite.driver import pick_driver
from tests.conftest import msg
from tests.llm_server import LLMServer, Reply
from tests.standins.slack_api import TEAM_ID, SlackApiStandIn, sign
from tests.test_run import free_port

ROOT = Path(__file__).resolve().parents[1]
SECRET = "ops-signing-secret"
IMPORT = ["import", "locomo", str(ROOT / "tests" / "fixtures" / "locomo_small.json"), "--no-embed"]

# --- the decision -----------------------------------------------------------------------------


def test_health_decision_rules() -> None:
    good = HealthFacts(db_ok=True, platforms={"slack": True, "discord": True})
    assert decide(good).http_status == 200 and decide(good).status == "ok"
    one_down = good.model_copy(update={"platforms": {"slack": True, "discord": False}})
    assert decide(one_down).status == "degraded" and decide(one_down).http_status == 200
    all_down = good.model_copy(update={"platforms": {"slack": False}})
    assert decide(all_down).http_status == 503
    db_down = good.model_copy(update={"db_ok": False, "db_error": "disk I/O error"})
    report = decide(db_down)
    assert report.http_status == 503 and "disk I/O error" in report.reasons[0]
    llm_down = good.model_copy(
        update={"llm": LLMHealth(configured=True, failing_since=1.0, last_error="LLMUnavailable")}
    )
    report = decide(llm_down)
    assert report.http_status == 200 and report.status == "degraded"
    assert "extractive" in report.reasons[0]
    backlog = good.model_copy(update={"writer_pending": 50})
    assert decide(backlog, queue_warn=10).status == "degraded"
    assert decide(backlog, queue_warn=100).status == "ok"


# --- a running bot ----------------------------------------------------------------------------


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, await resp.text()


@pytest.mark.e2e
async def test_running_bot_serves_healthz_and_metrics(tmp_path: Path) -> None:
    api = await SlackApiStandIn(
        users={"U1": {"name": "alice", "profile": {"display_name": "Alice"}}},
        members={"C1": ["U1"]},
    ).start()
    port, ops_port = free_port(), free_port()
    settings = Settings(
        db_path=tmp_path / "ops.db",
        slack_bot_token="xoxb-test",  # type: ignore[arg-type]
        slack_signing_secret=SECRET,  # type: ignore[arg-type]
        slack_mode="http",
        slack_http_host="127.0.0.1",
        slack_http_port=port,
        slack_api_url=api.base_url,
        embedder="none",
        llm_base_url=None,
        discord_token=None,
        ops_host="127.0.0.1",
        ops_port=ops_port,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop))
    base = f"http://127.0.0.1:{ops_port}"
    try:
        for _ in range(200):
            try:
                status, body = await get(f"{base}/healthz")
                if json.loads(body)["facts"]["platforms"].get("slack"):
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        assert status == 200, body
        health = json.loads(body)
        assert health["status"] == "ok" and health["facts"]["db_ok"] is True
        assert health["facts"]["llm"]["configured"] is False

        url = f"http://127.0.0.1:{port}/slack/events"
        async with aiohttp.ClientSession() as http:
            for i in range(3):
                event = {
                    "type": "event_callback",
                    "team_id": TEAM_ID,
                    "event_id": f"Ev{i}",
                    "event": {
                        "type": "message",
                        "channel": "C1",
                        "user": "U1",
                        "text": f"release note {i}",
                        "ts": f"1700000000.00010{i}",
                        "channel_type": "channel",
                    },
                }
                body = json.dumps(event)
                headers = {
                    **sign(SECRET, int(time.time()), body),
                    "Content-Type": "application/json",
                }
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200
            # bolt acks an event before its listener stores it: wait for the three stores
            stored = 'speakermem_events_handled_total{outcome="message_stored"} 3.0'
            for _ in range(200):
                if stored in (await get(f"{base}/metrics"))[1]:
                    break
                await asyncio.sleep(0.05)
            form = (
                "command=%2Frecall&text=release+note&user_id=U1&user_name=alice&channel_id=C1"
                f"&team_id={TEAM_ID}&response_url={api.response_url('m')}&trigger_id=1.2"
            )
            headers = {
                **sign(SECRET, int(time.time()), form),
                "Content-Type": "application/x-www-form-urlencoded",
            }
            async with http.post(url, data=form, headers=headers) as resp:
                assert resp.status == 200
        for _ in range(100):
            if api.responses:
                break
            await asyncio.sleep(0.05)
        status, text = await get(f"{base}/metrics")
        assert status == 200
        assert stored in text
        assert 'speakermem_recall_seconds_count{outcome="answered"} 1.0' in text
        assert "speakermem_writer_queue_segments 0.0" in text
        assert 'speakermem_platform_connected{platform="slack"} 1.0' in text
        assert (
            'speakermem_adapter_events_total{counter="event_MessageEvent",platform="slack"} 3.0'
            in text
        )
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await api.close()


async def test_healthz_is_503_when_the_database_does_not_answer(tmp_path: Path) -> None:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db")))

    class Up:
        async def connected(self) -> bool:
            return True

    ops = OpsServer(engine, Metrics(), {"slack": Up()})
    await ops.start()
    try:
        status, body = await get(f"http://127.0.0.1:{ops.port}/healthz")
        assert status == 200
        await engine.close()  # the store is gone: the bot cannot serve
        status, body = await get(f"http://127.0.0.1:{ops.port}/healthz")
        assert status == 503
        assert json.loads(body)["facts"]["db_ok"] is False
        _, metrics = await get(f"http://127.0.0.1:{ops.port}/metrics")
        assert "speakermem_db_up 0.0" in metrics
    finally:
        await ops.stop()


async def test_a_slow_queue_count_is_not_a_database_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting a long queue under load can take longer than the probe: /healthz stays 200
    and the gauges keep the last counts instead of dropping to 0."""
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db")))
    scope = Scope(platform="test", workspace="w", channel="c")
    await engine.ingest_many([msg(scope, f"m{i}", "Ann", f"note {i}", i) for i in range(7)])

    class Up:
        async def connected(self) -> bool:
            return True

    ops = OpsServer(engine, Metrics(), {"slack": Up()})
    await ops.start()
    try:
        _, metrics = await get(f"http://127.0.0.1:{ops.port}/metrics")
        assert "speakermem_embed_queue_messages 7.0" in metrics
        count = engine.store.messages.count_pending_embeddings
        release = asyncio.Event()

        async def slow_count() -> int:
            await release.wait()  # longer than the probe's timeout
            return await count()

        monkeypatch.setattr(server, "PROBE_TIMEOUT_S", 0.2)
        monkeypatch.setattr(engine.store.messages, "count_pending_embeddings", slow_count)
        status, body = await get(f"http://127.0.0.1:{ops.port}/healthz")
        assert status == 200 and json.loads(body)["facts"]["db_ok"] is True
        _, metrics = await get(f"http://127.0.0.1:{ops.port}/metrics")
        assert "speakermem_db_up 1.0" in metrics
        assert "speakermem_embed_queue_messages 7.0" in metrics  # the last count, not 0
    finally:
        release.set()
        await ops.stop()
        await engine.close()


async def test_metered_llm_counts_calls_and_tracks_failure(llm_server: LLMServer) -> None:
    metrics = Metrics()
    inner = OpenAICompatLLM(
        base_url=llm_server.base_url, api_key="t", model="m", timeout_s=10, max_retries=0
    )
    llm = MeteredLLM(inner, metrics, role="writer")
    llm_server.fail_next(1, status=503)
    with pytest.raises(LLMUnavailable):
        await llm.complete_text([ChatMessage(role="user", content="hi")])
    assert llm.health.failing_since is not None
    llm_server.script(Reply(content="fine"))
    result = await llm.complete_text([ChatMessage(role="user", content="hi")])
    assert result.raw_text == "fine"
    assert llm.health.failing_since is None
    text = metrics.render().decode()
    assert 'speakermem_llm_calls_total{result="error",role="writer"} 1.0' in text
    assert 'speakermem_llm_calls_total{result="ok",role="writer"} 1.0' in text
    assert 'speakermem_llm_seconds_count{role="writer"} 2.0' in text


# --- logs -------------------------------------------------------------------------------------


def test_json_formatter_emits_one_object_per_line() -> None:
    logger = logging.getLogger("speakermem.test")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logger.makeRecord(
            "speakermem.test",
            logging.ERROR,
            __file__,
            1,
            "failed %s",
            ("x",),
            sys.exc_info(),
            extra={"channel": "C1"},
        )
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert data["msg"] == "failed x" and data["level"] == "ERROR" and data["channel"] == "C1"
    assert "ValueError: boom" in data["exc"] and "\n" not in line


@pytest.mark.e2e
def test_log_format_setting_switches_the_cli_to_json(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SPEAKERMEM_DB_PATH": str(tmp_path / "l.db"),
        "SPEAKERMEM_EMBEDDER": "none",
    }
    out = {}
    for fmt in ("text", "json"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "speakermem.integrations.cli.main",
                "--log-level",
                "INFO",
                *IMPORT,
            ],
            env={**env, "SPEAKERMEM_LOG_FORMAT": fmt},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out[fmt] = [ln for ln in proc.stderr.splitlines() if "store open" in ln]
    assert out["text"] and not out["text"][0].startswith("{")
    assert json.loads(out["json"][0])["logger"] == "speakermem.memory.store.sqlite.database"


def test_configure_logging_replaces_handlers() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        other = logging.NullHandler()
        root.addHandler(other)
        configure_logging("info", "text")
        configure_logging("warning", "json")
        ours = [h for h in root.handlers if isinstance(h, StderrHandler)]
        assert len(ours) == 1 and isinstance(ours[0].formatter, JsonFormatter)
        assert other in root.handlers  # a handler someone else installed stays
        assert root.level == logging.WARNING
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


# --- backup and restore -----------------------------------------------------------------------


@pytest.mark.e2e
async def test_online_backup_while_another_process_writes_then_restore_answers_the_same(
    tmp_path: Path, scope: Scope
) -> None:
    db = tmp_path / "live.db"
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    await engine.ingest_many(
        msg(
            scope,
            f"m{i}",
            ["Ann", "Bob"][i % 2],
            f"the {['budget', 'launch'][i % 3 % 2]} item {i}",
            i,
        )
        for i in range(500)
    )
    # another process keeps writing while the backup runs
    writer = subprocess.Popen(  # noqa: ASYNC220 - a plain child process, waited off-loop
        [
            sys.executable,
            "-c",
            "import sqlite3,sys,time\n"
            "c=sqlite3.connect(sys.argv[1],isolation_level=None,timeout=30)\n"
            "t=time.time()\n"
            "while time.time()-t<3:\n"
            "  c.execute('BEGIN IMMEDIATE');c.execute(\"CREATE TABLE IF NOT EXISTS churn(x)\")\n"
            "  c.executemany('INSERT INTO churn VALUES (?)',[(i,) for i in range(200)])\n"
            "  c.execute('COMMIT')\n",
            str(db),
        ]
    )
    try:
        await asyncio.sleep(0.3)
        live_ingest = asyncio.create_task(
            engine.ingest_many(
                msg(scope, f"n{i}", "Cy", f"late note {i}", 600 + i) for i in range(300)
            )
        )
        result = await backup_database(db, tmp_path / "copy.db", pick_driver("auto"))
        await live_ingest
    finally:
        await asyncio.to_thread(writer.wait, 30)
    assert 500 <= result.messages <= 800
    conn = sqlite3.connect(tmp_path / "copy.db")
    # the full-text view segments CJK text with the store's own function (cjk_index.py)
    conn.create_function("speakermem_segment", 1, index_text, deterministic=True)
    try:
        n_msgs = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        n_fts = conn.execute("SELECT count(*) FROM messages_fts").fetchone()[0]
        in_segments = conn.execute("SELECT sum(n_messages) FROM segments").fetchone()[0]
    finally:
        conn.close()
    assert n_msgs == n_fts == in_segments == result.messages  # one snapshot, not a mix

    with pytest.raises(Exception, match="exists"):
        await backup_database(db, tmp_path / "copy.db", pick_driver("auto"))

    # restore (as documented): stop, copy over, drop -wal/-shm, start; same answers
    final = await backup_database(db, tmp_path / "final.db", pick_driver("auto"))
    hits = [h.message.message_id for h in await engine.search("budget item", [scope], limit=10)]
    await engine.close()
    restored_path = tmp_path / "restored.db"
    restored_path.write_bytes(final.path.read_bytes())
    restored = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=restored_path)))
    try:
        again = [
            h.message.message_id for h in await restored.search("budget item", [scope], limit=10)
        ]
        assert again == hits and len(hits) == 10
        assert (await restored.store.messages.counts())["messages"] == 800
    finally:
        await restored.close()


@pytest.mark.e2e
def test_backup_cli(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SPEAKERMEM_DB_PATH": str(tmp_path / "c.db"),
        "SPEAKERMEM_EMBEDDER": "none",
    }
    subprocess.run(
        [sys.executable, "-m", "speakermem.integrations.cli.main", *IMPORT],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "backup",
            str(tmp_path / "b.db"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "integrity ok" in proc.stderr and (tmp_path / "b.db").exists()
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "backup",
            str(tmp_path / "b.db"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "exists" in again.stderr


# --- the spill and catch-up on /healthz and /metrics ------------------------------------------


def test_spilled_events_degrade_health() -> None:
    good = HealthFacts(db_ok=True, platforms={"slack": True})
    report = decide(good.model_copy(update={"spilled": 7}))
    assert report.status == "degraded" and report.http_status == 200
    assert "7 events wait in the spill" in report.reasons[0]


async def test_metrics_and_health_show_the_spill_and_catch_up_lag(tmp_path: Path) -> None:
    from speakermem.bot.catchup import CatchUp, ChannelProgress
    from speakermem.bot.dispatch import Dispatcher
    from speakermem.bot.spill import Spill
    from speakermem.memory.query.pipeline import RecallPipeline

    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=tmp_path / "m.db")))
    spill = Spill(tmp_path / "spill.jsonl")
    dispatcher = Dispatcher(engine, RecallPipeline(engine), spill=spill)
    scope = Scope(platform="slack", workspace="T1", channel="C1")
    for i in range(3):
        spill.append(msg(scope, f"m{i}", "Ann", "kept while the disk was full", i))

    class Adapter:  # the two attributes the collector reads of a platform adapter
        def __init__(self, runner: CatchUp) -> None:
            self.stats: dict[str, int] = {}
            self.catchup = type("Life", (), {"catchup": runner})()

        async def connected(self) -> bool:
            return True

    runner = CatchUp(dispatcher, engine.store.catchup, source=None)  # type: ignore[arg-type]
    behind = Scope(platform="slack", workspace="T1", channel="C2")
    runner.progress[behind] = ChannelProgress(scope=behind, name="eng", fetched=40)
    runner.progress[behind].newest_ts = time.time() - 600
    runner.progress[scope] = ChannelProgress(scope=scope, name="gen", fetched=2, done=True)
    metrics = Metrics()
    adapters = {"slack": Adapter(runner)}
    metrics.watch(dispatcher, adapters)
    ops = OpsServer(engine, metrics, adapters, spill=spill)
    try:
        text = metrics.render().decode()
        assert "speakermem_spill_events 3.0" in text
        lag = next(
            line
            for line in text.splitlines()
            if line.startswith('speakermem_catchup_lag_seconds{channel="C2"')
        )
        assert 590 <= float(lag.split()[-1]) <= 700
        assert 'speakermem_catchup_lag_seconds{channel="C1",platform="slack"} 0.0' in text
        assert 'speakermem_catchup_messages_total{platform="slack"} 42.0' in text
        report = await ops.report()
        assert report.facts.spilled == 3 and report.status == "degraded"
    finally:
        await engine.close()
