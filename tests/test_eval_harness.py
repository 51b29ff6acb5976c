"""The evaluation harness end to end on a small fixture, without and with an LLM."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli.main import main
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.eval.harness import SYSTEMS, EvalHarness, markdown_table
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, Item, LLMServer, Reply, Status

pytestmark = pytest.mark.contract

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_small.json"


ANSWERS = {
    "What is the name of Ben's dog?": "Ben's dog is called Pixel [1].",
    "What hobby did Ben pick up after climbing?": "Ben took up knitting [1].",
    "Where does Ana volunteer?": "Ana volunteers at the animal shelter [1].",
}
"""What the stand-in model answers: right, wrong (the gold answer is pottery), right."""


def field(text: str, name: str) -> str:
    found = re.search(rf"^{name}: (.*)$", text, re.M)
    assert found, (name, text)
    return found.group(1)


def grade(request: dict[str, Any]) -> Reply:
    """A judge that reads what it is sent: CORRECT when every word of the gold answer is in
    the system answer. It can only score the harness's answers right if the harness sends
    each question with its own gold answer and the pipeline's answer to it."""
    user = request["messages"][-1]["content"]
    gold, said = field(user, "Gold answer").casefold(), field(user, "System answer").casefold()
    label = "CORRECT" if all(word in said for word in re.findall(r"\w+", gold)) else "WRONG"
    return Reply(content=json.dumps({"label": label, "reason": "compared with the gold"}))


def model(request: dict[str, Any]) -> Reply:
    """The judge (json schema 'judge'), Project/Select (unusable JSON: the deterministic
    fallbacks) and the answer to the question in the prompt."""
    fmt = request.get("response_format") or {}
    if fmt.get("json_schema", {}).get("name") == "judge":
        return grade(request)
    if fmt:
        return Reply(content="{}")
    prompt = request["messages"][-1]["content"]
    question = prompt.split("<question>")[-1].split("</question>")[0].strip()
    return Reply(content=ANSWERS[question])


async def run_harness(tmp_path: Path, llm_server: LLMServer) -> dict[str, Any]:
    dataset = read_locomo(FIXTURE)
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    llm = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, "json_schema", max_retries=0)
    try:
        await engine.ingest_many(dataset.messages)
        await engine.embed_pending()
        harness = EvalHarness(engine, RecallPipeline(engine, llm=llm), k=10, llm=llm)
        return await harness.run(dataset)
    finally:
        await llm.aclose()
        await engine.close()


def judge_requests(llm_server: LLMServer) -> list[dict[str, str]]:
    return [
        {k: field(r["messages"][-1]["content"], k) for k in ("Question", "Gold answer")}
        for r in llm_server.requests
        if (r.get("response_format") or {}).get("json_schema", {}).get("name") == "judge"
    ]


async def test_harness_reports_every_system_and_answers(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    llm_server.default = Handler(model)
    report = await run_harness(tmp_path, llm_server)
    assert set(report["systems"]) == set(SYSTEMS)
    for name in SYSTEMS:
        system = report["systems"][name]
        assert {"evidence_recall", "all_hit", "n", "by_category"} <= set(system)
        assert system["n"] == 3  # the question without evidence is skipped
    assert report["skipped_without_evidence"] == 1
    # a 5-message channel: every system finds everything within 10
    assert report["systems"]["speakermem"]["evidence_recall"] == 1.0
    # the judge saw each question with its own gold answer, and graded two of three right
    assert judge_requests(llm_server) == [
        {"Question": "What is the name of Ben's dog?", "Gold answer": "Pixel"},
        {"Question": "What hobby did Ben pick up after climbing?", "Gold answer": "pottery"},
        {"Question": "Where does Ana volunteer?", "Gold answer": "animal shelter"},
    ]
    assert report["answers"]["judged"] == 3
    assert report["answers"]["judge_accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert 0 < report["answers"]["token_f1"] < 1
    assert "system1" in report["latency_per_question"]
    assert "answer_prompt" in report["mean_tokens_per_question"]
    assert "| speakermem |" in markdown_table(report)


async def test_an_unusable_judgement_is_left_out_not_counted_wrong(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    """A judge reply without a usable label, or a judge call that fails, scores nothing:
    the accuracy is over the questions actually judged."""
    judged = 0

    def flaky(request: dict[str, Any]) -> Item:
        nonlocal judged
        fmt = request.get("response_format") or {}
        if fmt.get("json_schema", {}).get("name") == "judge":
            judged += 1
            if judged == 1:
                return Reply(content=json.dumps({"label": "MAYBE", "reason": "unsure"}))
            if judged == 2:
                return Status(500)
        return model(request)

    llm_server.default = Handler(flaky)
    report = await run_harness(tmp_path, llm_server)
    assert judged == 3
    assert report["answers"]["judged"] == 1
    assert report["answers"]["judge_accuracy"] == 1.0  # the shelter answer, judged right


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
