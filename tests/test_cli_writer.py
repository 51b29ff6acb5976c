"""`speakermem write / records / eval-writer / replay`, run in-process like a user would.

`main()` calls `asyncio.run`, so it runs in a worker thread while the scripted LLM server
keeps answering on the test's own event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.settings import load_settings
from speakermem.integrations.cli import render
from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig, WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from tests.conftest import msg
from tests.llm_server import Handler, LLMServer, Reply

SCOPE = Scope(platform="test", workspace="w1", channel="general")
NURSE = {
    "type": "ADD",
    "layer": "core",
    "source": "alice",
    "owner": "alice",
    "content": "Alice works as a nurse at the city hospital.",
    "event": "job",
    "refs": ["m1"],
}


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No .env from the working tree, no embedding model, no retries inside the client."""
    monkeypatch.chdir(tmp_path)
    for name in ("SPEAKERMEM_LLM_BASE_URL", "SPEAKERMEM_DB_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.setenv("SPEAKERMEM_LLM_MODEL", "test-model")
    monkeypatch.setenv("SPEAKERMEM_LLM_TIMEOUT_S", "2")
    monkeypatch.setenv("SPEAKERMEM_LLM_MAX_RETRIES", "0")
    for con in (render.console, render.err_console):  # wide enough that cells don't fold
        monkeypatch.setattr(con, "_width", 160)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "x.db"


async def seed(db: Path, texts: list[tuple[str, str]], start: int = 0) -> None:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        await engine.ingest_many(
            [
                msg(SCOPE, f"g{start + i}", who, text, start + i)
                for i, (who, text) in enumerate(texts)
            ]
        )
    finally:
        await engine.close()


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


def use_server(monkeypatch: pytest.MonkeyPatch, server: LLMServer) -> None:
    monkeypatch.setenv("SPEAKERMEM_LLM_BASE_URL", server.base_url)


def flat(text: str) -> str:
    """Rich wraps at 80 columns when not on a terminal: compare with whitespace collapsed."""
    return " ".join(text.split())


def reply(*actions: dict[str, Any]) -> Reply:
    return Reply(content=json.dumps({"actions": list(actions)}))


async def test_write_without_llm_is_a_clear_error(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(db, [("Alice", "hello")])
    assert await cli("write", "--channel", "general", "--db", str(db)) == 2
    err = flat(capsys.readouterr().err)
    assert "SPEAKERMEM_LLM_BASE_URL" in err and "Traceback" not in err


async def test_write_argument_and_channel_errors(
    db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llm_server: LLMServer,
) -> None:
    use_server(monkeypatch, llm_server)
    assert await cli("write", "--db", str(db)) == 2
    assert "--channel" in flat(capsys.readouterr().err)
    assert await cli("write", "--channel", "general", "--db", str(db)) == 2
    assert "no database yet" in flat(capsys.readouterr().err)
    await seed(db, [("Alice", "hello")])
    assert await cli("write", "--channel", "nope", "--db", str(db)) == 2
    err = flat(capsys.readouterr().err)
    assert "unknown channel 'nope'" in err and "general" in err and "Traceback" not in err
    assert llm_server.requests == []


async def test_write_then_records_heads_full_and_json(
    db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llm_server: LLMServer,
) -> None:
    use_server(monkeypatch, llm_server)
    await seed(db, [("Alice", "I work as a nurse at the city hospital."), ("Bob", "cool")])
    llm_server.script(reply(NURSE, dict(NURSE, source="zed")))
    assert await cli("write", "--channel", "general", "--db", str(db)) == 0
    out = flat(capsys.readouterr().out)
    assert "committed: proposed 2, accepted 1, rejected unknown_source=1" in out
    assert "rejected: unknown_source" in out and "prompt tokens" in out
    assert len(llm_server.requests) == 1

    # a later segment updates the record: --full shows the chain, the default only the head
    await seed(db, [("Alice", "I quit the hospital and now I work as a paramedic.")], start=5)

    def update(body: dict[str, Any]) -> Reply:
        (entry,) = re.findall(r"^#(\d+) ", body["messages"][-1]["content"], re.M)
        return reply(
            {
                "type": "UPDATE",
                "entry_id": entry,
                "refs": ["m1"],
                "content": "Alice quit the hospital and works as a paramedic.",
            }
        )

    llm_server.script(Handler(update))
    assert await cli("write", "--channel", "general", "--db", str(db)) == 0
    capsys.readouterr()
    assert await cli("records", "--owner", "Alice", "--json", "--db", str(db)) == 0
    (head,) = json.loads(capsys.readouterr().out)
    assert head["content"] == "Alice quit the hospital and works as a paramedic."
    assert (head["owner"], head["owner_id"], head["layer"]) == ("Alice", "alice", "core")
    assert head["from_ids"] == ["g5"] and head["state"] == "active"
    assert await cli("records", "--owner", "alice", "--full", "--json", "--db", str(db)) == 0
    chain = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in chain] == ["superseded", "active"]
    assert chain[0]["superseded_by"] == chain[1]["id"] and chain[0]["from_ids"] == ["g0"]
    assert await cli("records", "--owner", "Alice", "--full", "--db", str(db)) == 0
    table = flat(capsys.readouterr().out)
    assert "superseded" in table and "paramedic" in table and "g0" in table
    assert await cli("records", "--owner", "Nobody", "--db", str(db)) == 0
    assert "no derived records owned by 'Nobody'" in flat(capsys.readouterr().out)


async def test_write_when_endpoint_down_exits_1_and_retries_on_next_run(
    db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llm_server: LLMServer,
) -> None:
    use_server(monkeypatch, llm_server)
    await seed(db, [("Alice", "I work as a nurse at the city hospital.")])
    # down for two calls: identifying the server (structured mode auto), the Writer's call
    llm_server.fail_next(2)
    assert await cli("write", "--channel", "general", "--db", str(db)) == 1
    captured = capsys.readouterr()
    assert "deferred: server_error (http 503)" in flat(captured.out)
    assert "stay pending" in flat(captured.err) and "Traceback" not in captured.err
    # the Writer backed the segment off for 30 s; a manual run retries it at once
    llm_server.script(reply(NURSE))
    assert await cli("write", "--channel", "general", "--db", str(db)) == 0
    assert "accepted 1" in flat(capsys.readouterr().out)
    assert await cli("write", "--all", "--db", str(db)) == 0
    assert "nothing to write" in flat(capsys.readouterr().out)
    assert len(llm_server.requests) == 2


async def test_records_export_and_eval_writer(
    tmp_path: Path,
    db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llm_server: LLMServer,
) -> None:
    use_server(monkeypatch, llm_server)
    await seed(db, [("Alice", "I work as a nurse at the city hospital.")])
    llm_server.script(reply(NURSE))
    assert await cli("write", "--all", "--db", str(db)) == 0
    pred, gold = tmp_path / "pred.json", tmp_path / "gold.json"
    assert await cli("records", "--export", str(pred), "--db", str(db)) == 0
    doc = json.loads(pred.read_text())
    assert doc["owner_field"] == "display_name"
    assert [(r["owner"], r["source"], r["layer"]) for r in doc["records"]] == [
        ("Alice", "Alice", "core")
    ]
    gold.write_text(
        json.dumps(
            [
                {
                    "owner": "alice",
                    "source": "alice",
                    "layer": "core",
                    "content": "Alice is a nurse at the city hospital.",
                }
            ]
        )
    )
    capsys.readouterr()
    assert await cli("eval-writer", str(pred), str(gold)) == 0
    out = flat(capsys.readouterr().out)
    assert "alice" in out and "SpeakerLevenshtein = 0." in out and "memory reward" in out
    assert await cli("eval-writer", str(pred), str(gold), "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.5 < result["speaker_levenshtein"]["score"] < 1.0
    assert result["chain_score"] == 1.0

    assert await cli("eval-writer", str(tmp_path / "missing.json"), str(gold)) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    gold.write_text('{"items": []}')
    assert await cli("eval-writer", str(pred), str(gold)) == 2
    err = flat(capsys.readouterr().err)
    assert 'no "records" key' in err and "Traceback" not in err
    assert await cli("records", "--db", str(db)) == 2
    assert "--owner" in flat(capsys.readouterr().err)
    assert await cli("records", "--owner", "x", "--db", str(tmp_path / "none.db")) == 2


TINY_LOCOMO = [
    {
        "sample_id": "t1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I just adopted a cat named Miso."},
                {
                    "speaker": "Ben",
                    "dia_id": "D1:2",
                    "text": "Nice! I am training for a marathon in June.",
                },
            ],
        },
        "observation": {
            "session_1_observation": {
                "Ann": [["Ann adopted a cat named Miso.", "D1:1"]],
                "Ben": [
                    ["Ben is training for a marathon in June.", "D1:2"],
                    ["Ben owns a sailboat moored in Greece.", "D1:2"],
                ],
            }
        },
        "qa": [],
    }
]


async def test_replay_locomo_counts_by_reason_and_is_idempotent(
    tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LOCOMO))
    assert await cli("replay", "locomo", str(path), "--db", str(db)) == 0
    out = flat(capsys.readouterr().out)
    assert "3 observations" in out
    assert "accepted" in out and "rejected: ungrounded" in out
    assert await cli("records", "--owner", "Ben", "--json", "--db", str(db)) == 0
    (ben,) = json.loads(capsys.readouterr().out)
    assert ben["content"] == "Ben is training for a marathon in June."
    assert ben["from_ids"] == ["D1:2"] and ben["writer_model"].startswith("replay:")
    assert await cli("replay", "locomo", str(path), "--db", str(db)) == 0
    captured = capsys.readouterr()
    assert "rejected: duplicate_of_head" in flat(captured.out)
    assert "2 already present" in flat(captured.err)
    assert await cli("records", "--export", str(tmp_path / "s.json"), "--db", str(db)) == 0
    assert len(json.loads((tmp_path / "s.json").read_text())["records"]) == 2
    assert await cli("replay", "locomo", str(tmp_path / "nope.json"), "--db", str(db)) == 2


@pytest.mark.parametrize("command", ["write", "records", "eval-writer", "replay"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: speakermem " + command in flat(capsys.readouterr().out)


def test_settings_map_to_the_writer_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bot and the CLI build the Writer from settings: defaults must be the calibrated ones."""
    assert load_settings().memory_config().writer == WriterConfig()
    monkeypatch.setenv("SPEAKERMEM_GATE_LEXICAL_THRESHOLD", "0.4")
    monkeypatch.setenv("SPEAKERMEM_WRITER_CONCURRENCY", "3")
    monkeypatch.setenv("SPEAKERMEM_WRITER_RETRY_BASE_S", "5")
    writer = load_settings().memory_config().writer
    assert (writer.gate_lexical_threshold, writer.concurrency, writer.retry_base_s) == (0.4, 3, 5)
