"""The evaluation harness end to end on a small fixture, without and with an LLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integrations.cli.main import main
from integrations.llm.openai_compat import OpenAICompatLLM
from memory.datasets.locomo import read_locomo
from memory.engine import MemoryEngine
from memory.eval.harness import SYSTEMS, EvalHarness, markdown_table
from memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, LLMServer, Reply

pytestmark = pytest.mark.contract

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_small.json"


def answer_or_judge(request: dict[str, Any]) -> Reply:
    """Judge requests (json schema 'judge') get CORRECT; answer requests cite [1]."""
    fmt = request.get("response_format") or {}
    if fmt.get("json_schema", {}).get("name") == "judge":
        return Reply(content=json.dumps({"label": "CORRECT", "reason": "same fact"}))
    if fmt:
        return Reply(content="{}")  # project/select: unusable -> deterministic fallbacks
    return Reply(content="Ben's dog is called Pixel [1].")


async def test_harness_reports_every_system_and_answers(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    dataset = read_locomo(FIXTURE)
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    llm = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, "json_schema")
    llm_server.default = Handler(answer_or_judge)
    try:
        await engine.ingest_many(dataset.messages)
        await engine.embed_pending()
        harness = EvalHarness(engine, RecallPipeline(engine, llm=llm), k=10, llm=llm)
        report = await harness.run(dataset)
    finally:
        await engine.close()
    assert set(report["systems"]) == set(SYSTEMS)
    for name in SYSTEMS:
        system = report["systems"][name]
        assert {"evidence_recall", "all_hit", "n", "by_category"} <= set(system)
        assert system["n"] == 3  # the question without evidence is skipped
    assert report["skipped_without_evidence"] == 1
    # a 5-message channel: every system finds everything within 10
    assert report["systems"]["speakermem"]["evidence_recall"] == 1.0
    assert report["answers"]["judge_accuracy"] == 1.0
    assert 0 < report["answers"]["token_f1"] <= 1
    assert "system1" in report["latency_per_question"]
    assert "answer_prompt" in report["mean_tokens_per_question"]
    assert "| speakermem |" in markdown_table(report)


def test_eval_cli_writes_json_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.delenv("SPEAKERMEM_LLM_BASE_URL", raising=False)
    out = tmp_path / "report.json"
    code = main(
        [
            "--db",
            str(tmp_path / "e.db"),
            "eval",
            "locomo",
            str(FIXTURE),
            "--out",
            str(out),
            "--writer",
            "replay",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    sm = report["systems"]["speakermem"]
    assert {"evidence_recall", "all_hit", "n", "by_category"} <= set(sm)
    assert "evidence_coverage" in sm and "pack_messages" in sm
    assert out.with_suffix(".md").read_text().startswith("### locomo")
    assert "recall@10" in capsys.readouterr().out
