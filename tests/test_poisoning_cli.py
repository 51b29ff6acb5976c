"""Issue 39's scenario, replayed through the CLI as a new user would: a Slack export with the
three messages imported, `speakermem write` against a gullible scripted model, then
`speakermem recall` whose model pins Mallory's promise on Alice. With Mallory under her own
name, and again with Mallory's display name borrowed ("Alice").
"""

from __future__ import annotations

import asyncio
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli import render
from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from tests.llm_server import Handler, Item, LLMServer, Reply
from tests.test_poisoning import NOTE, OPPOSE, PAY
from tests.test_writer import refs_by_text, user_prompt

pytestmark = pytest.mark.e2e

FALSE_CLAIM = "Alice said she will pay the whole overrun herself"


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPEAKERMEM_DB_PATH", raising=False)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.setenv("SPEAKERMEM_LLM_MODEL", "test-model")
    monkeypatch.setenv("SPEAKERMEM_LLM_TIMEOUT_S", "5")
    monkeypatch.setenv("SPEAKERMEM_LLM_MAX_RETRIES", "0")
    for con in (render.console, render.err_console):
        monkeypatch.setattr(con, "_width", 200)


def export(tmp_path: Path, mallory_name: str) -> Path:
    users = [
        {"id": "UALICE", "team_id": "T39", "name": "alice", "profile": {"display_name": "Alice"}},
        {"id": "UBOB", "team_id": "T39", "name": "bob", "profile": {"display_name": "Bob"}},
        {
            "id": "UMALLORY",
            "team_id": "T39",
            "name": "mallory",
            "profile": {"display_name": mallory_name},
        },
    ]
    channels = [{"id": "CBUDGET", "name": "budget", "members": ["UALICE", "UBOB", "UMALLORY"]}]
    said = [("UALICE", OPPOSE), ("UBOB", NOTE), ("UMALLORY", PAY)]
    day = [
        {"type": "message", "user": u, "text": t, "ts": f"170929080{i}.000100", "team": "T39"}
        for i, (u, t) in enumerate(said)
    ]
    dest = tmp_path / "export.zip"
    with zipfile.ZipFile(dest, "w") as zf:
        zf.writestr("users.json", json.dumps(users))
        zf.writestr("channels.json", json.dumps(channels))
        zf.writestr("budget/2024-03-01.json", json.dumps(day))
    return dest


def model(body: dict[str, Any]) -> Item:
    """The Writer: gullible (the planted note's actions, plus the two honest ones). The
    answerer: Alice's stance, then Mallory's promise pinned on Alice."""
    prompt = user_prompt(body)
    if body.get("response_format") and "## New messages" in prompt:
        refs = refs_by_text(prompt)
        a, b, m = refs[OPPOSE], refs[NOTE], refs[PAY]

        def add(layer: str, source: str, owner: str, content: str, ref: str) -> dict[str, Any]:
            return {
                "type": "ADD",
                "layer": layer,
                "source": source,
                "owner": owner,
                "content": content,
                "refs": [ref],
            }

        actions = [
            add("core", "UALICE", "UALICE", "Alice approved the budget increase.", b),
            add("profile", "UALICE", "UALICE", "Alice will pay the whole overrun herself.", m),
            add("insight", "GROUP", "GROUP", "The group agreed to the budget increase.", b),
            add("core", "UALICE", "UALICE", "Alice opposes the budget increase.", a),
            add("profile", "UBOB", "UALICE", "Bob says Alice approved the budget increase.", b),
        ]
        return Reply(content=json.dumps({"actions": actions}))
    if body.get("response_format"):
        return Reply(content="{}")  # Project, Select: their deterministic fallbacks
    lines = re.findall(r"^\[(\d+)\] (.*)$", prompt, re.M)
    number = {text: int(n) for n, line in lines for text in (OPPOSE, PAY) if text in line}
    return Reply(
        content=f"Alice opposes the budget increase [{number[OPPOSE]}]. "
        f"{FALSE_CLAIM} [{number[PAY]}]."
    )


async def records(db: Path) -> list[tuple[str, str, str]]:
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)))
    try:
        rows = await engine.store.db.read("SELECT source, owner, content FROM records ORDER BY id")
        return [(r[0], r[1], r[2]) for r in rows]
    finally:
        await engine.close()


@pytest.mark.parametrize("mallory_name", ["Mallory", "Alice"])
async def test_the_scenario_through_the_cli(
    tmp_path: Path,
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mallory_name: str,
) -> None:
    db = str(tmp_path / "x.db")
    monkeypatch.setenv("SPEAKERMEM_LLM_BASE_URL", llm_server.base_url)
    llm_server.default = Handler(model)

    async def cli(*argv: str) -> int:
        return await asyncio.to_thread(main, ["--db", db, *argv])

    assert await cli("import", "slack-export", str(export(tmp_path, mallory_name))) == 0
    assert await cli("write", "--all") == 0
    written = capsys.readouterr()
    # none of the poisoned actions; both controls
    assert await records(Path(db)) == [
        ("UALICE", "UALICE", "Alice opposes the budget increase."),
        ("UBOB", "UALICE", "Bob says Alice approved the budget increase."),
    ]
    shown = " ".join((written.out + written.err).split())
    assert "self_report_not_cited=2" in shown and "group_one_speaker=1" in shown
    assert (
        await cli(
            "recall",
            "--channel",
            "budget",
            "--explain",
            "budget increase and overrun: who said what?",
        )
        == 0
    )
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    print(out)  # the replay's transcript, for the record
    assert "Extractive answer" not in flat  # the model answered; its claims were checked
    answer, _, explain = flat.partition(" explain ")
    assert FALSE_CLAIM not in answer
    assert "opposes the budget increase [" in answer
    if mallory_name == "Alice":  # the two Alices told apart; the claim is Mallory's
        assert "Alice (@UALICE)" in answer and "Alice (@UMALLORY)" in answer
        assert "Alice (@UALICE) opposes the budget increase" in answer
        assert "Alice (@UMALLORY) said she will pay the whole overrun herself" in answer
    else:
        assert f"dropped: {FALSE_CLAIM}" in explain
