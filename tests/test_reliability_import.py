"""Imports under stress: ZIP limits, streamed DiscordChatExporter files, a second run, kill -9."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import tracemalloc
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.discord.export import read_discord_export
from speakermem.integrations.payload import PayloadError
from speakermem.integrations.slack.export import ZipLimits, read_slack_export
from speakermem.memory.search.cjk import index_text

ROOT = Path(__file__).resolve().parents[1]
SLACK_DIR = ROOT / "tests" / "fixtures" / "slack_export_small"
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def zip_dir(src: Path, dest: Path, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(src.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(src).as_posix())
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return dest


def discord_export(path: Path, n: int, *, channel: str = "700000000000000010") -> Path:
    """A DiscordChatExporter-shaped file with `n` messages, written incrementally."""
    with path.open("w", encoding="utf-8") as fh:
        head = {
            "guild": {"id": "700000000000000001", "name": "Load Club"},
            "channel": {"id": channel, "type": "GuildTextChat", "name": "general"},
            "dateRange": {"after": None, "before": None},
        }
        fh.write(json.dumps(head)[:-1] + ', "messages": [\n')
        for i in range(n):
            msg = {
                "id": str(800000000000000000 + i),
                "type": "Default",
                "timestamp": (T0 + timedelta(seconds=30 * i)).isoformat(),
                "timestampEdited": None,
                "isPinned": False,
                "content": f"message number {i} about the quarterly plan and item {i % 97}",
                "author": {
                    "id": str(900000000000000200 + i % 7),
                    "name": f"user{i % 7}",
                    "nickname": f"User {i % 7}",
                    "isBot": False,
                    "roles": [],
                    "avatarUrl": "https://cdn.invalid/a.png",
                },
                "attachments": [],
                "embeds": [],
                "stickers": [],
                "reactions": [],
                "mentions": [],
                "inlineEmojis": [],
            }
            fh.write(("," if i else "") + json.dumps(msg) + "\n")
        fh.write(f'], "messageCount": {n}}}\n')
    return path


# --- limits -----------------------------------------------------------------------------------


def test_slack_zip_limits_refuse_with_a_clear_reason(tmp_path: Path) -> None:
    archive = zip_dir(SLACK_DIR, tmp_path / "export.zip")
    ok = read_slack_export(archive)
    assert len(ok) > 0
    entries = len(zipfile.ZipFile(archive).infolist())
    largest = max(i.file_size for i in zipfile.ZipFile(archive).infolist())
    total = sum(i.file_size for i in zipfile.ZipFile(archive).infolist())

    with pytest.raises(PayloadError, match=r"entries is over the limit"):
        read_slack_export(archive, limits=ZipLimits(max_entries=entries - 1))
    with pytest.raises(PayloadError, match=r"over the per-file limit"):
        read_slack_export(archive, limits=ZipLimits(max_entry_bytes=largest - 1))
    with pytest.raises(PayloadError, match=r"bytes uncompressed in all"):
        read_slack_export(archive, limits=ZipLimits(max_total_bytes=total - 1))
    # exactly at the limits is fine
    at = ZipLimits(max_entries=entries, max_entry_bytes=largest, max_total_bytes=total)
    assert len(read_slack_export(archive, limits=at)) == len(ok)


@pytest.mark.slow
def test_a_zip_bomb_entry_is_refused_before_decompressing(tmp_path: Path) -> None:
    archive = zip_dir(SLACK_DIR, tmp_path / "bomb.zip")
    # 300 MB of blanks deflates to ~300 kB; written in chunks, never held whole
    with (
        zipfile.ZipFile(archive, "a", zipfile.ZIP_DEFLATED) as zf,
        zf.open("general/2024-02-02.json", "w", force_zip64=True) as entry,
    ):
        entry.write(b"[")
        chunk = b" " * (1024 * 1024)
        for _ in range(300):
            entry.write(chunk)
        entry.write(b"]")
    assert archive.stat().st_size < 5 * 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match=r"2024-02-02\.json.*per-file limit"):
            read_slack_export(archive)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024


@pytest.mark.slow
def test_discord_export_is_streamed_not_loaded_whole(tmp_path: Path) -> None:
    path = discord_export(tmp_path / "big.json", 20_000)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        export = read_discord_export(path)
        count = sum(1 for _ in export.events())
        _, streamed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loaded = json.loads(path.read_bytes())
        _, loaded_peak = tracemalloc.get_traced_memory()
        del loaded
    finally:
        tracemalloc.stop()
    assert len(export) == 20_000 and count == 20_000
    # a whole-file load holds every message at once; streaming holds a bounded window
    assert streamed_peak < loaded_peak / 3, (streamed_peak, loaded_peak, size)


def test_discord_stream_restores_local_order_and_skips_bad_records(tmp_path: Path) -> None:
    path = discord_export(tmp_path / "x.json", 50)
    data = json.loads(path.read_text())
    data["messages"][10], data["messages"][11] = data["messages"][11], data["messages"][10]
    data["messages"][20]["content"] = "\udcff"  # an escaped lone surrogate
    path.write_text(json.dumps(data))
    events = list(read_discord_export(path))
    stamps = [e.ts for e in events]  # type: ignore[union-attr]
    assert stamps == sorted(stamps)
    assert len(events) == 49


# --- a second run and kill -9 -----------------------------------------------------------------


def cli_env(db: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPEAKERMEM_DB_PATH": str(db),
        "SPEAKERMEM_EMBEDDER": "none",
        "SPEAKERMEM_LLM_BASE_URL": "",
    }


def run_import(db: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "import",
            "discord-export",
            str(path),
        ],
        env=cli_env(db),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def db_state(db: Path) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    # the full-text index's content view segments CJK text with the store's own function
    # (memory/store/sqlite/cjk_index.py); reading its rows needs it, as every store connection has
    conn.create_function("speakermem_segment", 1, index_text, deterministic=True)
    try:
        ids = [r[0] for r in conn.execute("SELECT message_id FROM messages")]
        fts = conn.execute("SELECT count(*) FROM messages_fts").fetchone()[0]
        in_segments = conn.execute("SELECT coalesce(sum(n_messages), 0) FROM segments").fetchone()[
            0
        ]
        turns = conn.execute(
            "SELECT count(*) FROM (SELECT session_id, turn_index FROM messages"
            " GROUP BY channel_pk, session_id, turn_index HAVING count(*) > 1)"
        ).fetchone()[0]
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    return {
        "ids": ids,
        "fts": fts,
        "in_segments": in_segments,
        "dup_turns": turns,
        "integrity": check,
    }


@pytest.mark.e2e
def test_import_run_twice_stores_everything_once(tmp_path: Path) -> None:
    db = tmp_path / "twice.db"
    path = discord_export(tmp_path / "export.json", 300)
    first = run_import(db, path)
    assert first.returncode == 0, first.stderr
    second = run_import(db, path)
    assert second.returncode == 0, second.stderr
    assert "imported 0 messages (300 already present" in second.stderr.replace("\n", " ")
    state = db_state(db)
    assert len(state["ids"]) == 300 == len(set(state["ids"]))
    assert state["fts"] == 300 and state["in_segments"] == 300


@pytest.mark.e2e
def test_kill_9_during_an_import_then_rerun_loses_and_doubles_nothing(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    n = 30_000
    path = discord_export(tmp_path / "export.json", n)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "import",
            "discord-export",
            str(path),
        ],
        env=cli_env(db),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stored_at_kill = 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
                    stored_at_kill = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
                    conn.close()
                except sqlite3.Error:
                    stored_at_kill = 0
            if stored_at_kill >= 4_000:  # two committed batches in, more in flight
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the import finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    partial = db_state(db)
    assert partial["integrity"] == "ok"
    assert 0 < len(partial["ids"]) < n
    assert len(partial["ids"]) % 2_000 == 0  # whole batches only: no half transaction
    assert partial["fts"] == len(partial["ids"]) == partial["in_segments"]

    rerun = run_import(db, path)
    assert rerun.returncode == 0, rerun.stderr
    state = db_state(db)
    assert len(state["ids"]) == n == len(set(state["ids"]))
    assert sorted(state["ids"]) == sorted(str(800000000000000000 + i) for i in range(n))
    assert state["fts"] == n and state["in_segments"] == n
    assert state["dup_turns"] == 0 and state["integrity"] == "ok"
