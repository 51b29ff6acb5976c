"""Answers scored by format: the pure scorers, then the harness end to end through the real
openai client against tests/llm_server.py (no mock of the judge: the fake server plays it).
The live run on the SocialMemBench dev set with a real endpoint is in tests/test_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.datasets import read_dataset
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.eval.answer_scoring import (
    RUBRIC_PROMPT_VERSION,
    RUBRIC_SCHEMA,
    RubricVerdict,
    chosen_option,
    normalise,
    options_note,
    parse_rubric,
    render_rubric_messages,
    rubric_score,
    short_match,
)
from speakermem.memory.eval.harness import EvalHarness, markdown_table
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, LLMServer, Reply

FIXTURES = Path(__file__).parent / "fixtures" / "socialmembench_small"
OPTIONS = {"A": "Ines", "B": "Ravi", "C": "Tomas"}


@pytest.mark.parametrize(
    ("answer", "chosen"),
    [
        ("(B) Ravi suggested it [2].", "B"),
        ("B) Ravi [1]", "B"),
        ("c. Tomas, who said so [3]", "C"),
        ("A", "A"),
        ("The answer is (A): Ines asked first [1].", "A"),
        ("Answer: c", "C"),
        ("It was Ines who suggested the gym [1].", "A"),  # names exactly one option
        ("Ines or Ravi, hard to say.", None),  # names two: no choice
        ("Nobody suggested anything.", None),
        ("I think option D is right.", None),  # not an option here
    ],
)
def test_the_chosen_option(answer: str, chosen: str | None) -> None:
    assert chosen_option(answer, OPTIONS) == chosen


def test_options_note_lists_every_option_and_asks_for_the_letter() -> None:
    note = options_note({"B": "Ravi", "A": "Ines"})
    assert note.index("(A) Ines") < note.index("(B) Ravi")
    assert "start your answer with the letter" in note


def test_short_answers_match_after_normalising() -> None:
    assert normalise("The Shoulder-injury!") == "shoulder injury"
    assert short_match("It was his shoulder injury [1].", "shoulder injury")
    assert short_match("Closest pair, clearly", "closest pair")
    assert not short_match("his shoulders", "shoulder")  # whole words only
    assert not short_match("anything", "")


def test_rubric_scores_points_and_halves_for_wrong_people() -> None:
    verdict = parse_rubric(
        {
            "points": [
                {"point": "Tomas skipped the rope walls", "verdict": "covered"},
                {"point": "because of his shoulder", "verdict": "partial"},
                {"point": "later wanted to try them", "verdict": "missing"},
                {"point": "once the shoulder healed", "verdict": "covered"},
            ],
            "wrong_attribution": False,
            "contradiction": False,
            "reason": "mostly there",
        }
    )
    assert verdict is not None and verdict.score == 0.625
    assert rubric_score(verdict).correct is True
    wrong = verdict.model_copy(update={"wrong_attribution": True})
    assert wrong.score == 0.3125 and rubric_score(wrong).correct is False
    assert parse_rubric({"points": [], "wrong_attribution": False}) is None
    assert parse_rubric("CORRECT") is None
    assert rubric_score(None).correct is None and rubric_score(None).score is None


def test_rubric_prompt_and_schema_agree() -> None:
    messages = render_rubric_messages("Q?", "The reference.", "")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "Reference answer: The reference." in messages[1]["content"]
    assert "System answer: (empty)" in messages[1]["content"]
    assert RUBRIC_PROMPT_VERSION.startswith("rubric-v")
    schema_fields = set(RUBRIC_SCHEMA["properties"])
    assert schema_fields == set(RubricVerdict.model_fields)
    assert set(RUBRIC_SCHEMA["required"]) == schema_fields


def _schema_name(request: dict[str, Any]) -> str | None:
    fmt = request.get("response_format") or {}
    return fmt.get("json_schema", {}).get("name") if fmt else None


def _fake_model(request: dict[str, Any]) -> Reply:
    """The answerer, the judge and the rubric judge, told apart by the response format."""
    name = _schema_name(request)
    if name == "judge":
        return Reply(content=json.dumps({"label": "CORRECT", "reason": "same"}))
    if name == "rubric":
        points = [
            {"point": "skipped the rope walls", "verdict": "covered"},
            {"point": "wanted them later", "verdict": "partial"},
        ]
        verdict = {"points": points, "wrong_attribution": False, "contradiction": False}
        return Reply(content=json.dumps({**verdict, "reason": "ok"}))
    if name is not None:
        return Reply(content="{}")  # project / select: the deterministic fallbacks
    prompt = request["messages"][-1]["content"]
    if "Options:" in prompt:
        return Reply(content="(A) Ines suggested the gym first [1].")
    if "skip the rope walls at first" in prompt:
        return Reply(content="His shoulder injury kept him off them [1].")
    return Reply(content="Tomas skipped the rope walls, then wanted to try them [1].")


async def test_harness_scores_each_format_through_the_fake_server(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    dataset = read_dataset("socialmembench", [FIXTURES])
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    llm = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, "json_schema")
    llm_server.default = Handler(_fake_model)
    try:
        await engine.ingest_many(dataset.messages)
        await engine.embed_pending()
        harness = EvalHarness(engine, RecallPipeline(engine, llm=llm), k=10, llm=llm)
        report = await harness.run(dataset)
    finally:
        await engine.close()
    names = [_schema_name(r) for r in llm_server.requests]
    # two long-form answers go to the rubric; the multiple-choice and the matched short
    # answer need no judge at all
    assert names.count("rubric") == 2 and names.count("judge") == 0
    answers = report["answers"]
    assert answers["scored_by"] == {"match": 1, "option": 1, "rubric": 2}
    assert answers["accuracy"] == 1.0 and answers["mean_score"] == 0.875  # (1+1+.75+.75)/4
    assert answers["by_format"]["multiple_choice"] == {
        "accuracy": 1.0,
        "mean_score": 1.0,
        "n": 1,
        "unscored": 0,
    }
    assert answers["by_format"]["long_form"]["mean_score"] == 0.75
    assert set(answers["by_category"]) == {"Q1", "Q3", "Q4", "Q8"}
    assert answers["mean_score_per_channel"] == round((0.75 + (1 + 1 + 0.75) / 3) / 2, 4)
    # the answerer saw the options of the multiple-choice question, never the searchers
    answered = [r for r in llm_server.requests if _schema_name(r) is None]
    choice = [r for r in answered if "Options:" in r["messages"][-1]["content"]]
    assert len(choice) == 1 and "(C) Tomas" in choice[0]["messages"][-1]["content"]
    assert "accuracy 1.0" in markdown_table(report)


async def test_a_wrong_option_and_an_unmatched_short_answer(
    tmp_path: Path, llm_server: LLMServer
) -> None:
    """The option chosen decides (no judge); a short answer that does not match goes to the
    judge, whose WRONG counts; an unusable rubric reply is unscored, not wrong."""
    dataset = read_dataset("socialmembench", [FIXTURES / "net_alpha.json"])

    def model(request: dict[str, Any]) -> Reply:
        name = _schema_name(request)
        if name == "judge":
            return Reply(content=json.dumps({"label": "WRONG", "reason": "no"}))
        if name == "rubric":
            return Reply(content="not json")
        if name is not None:
            return Reply(content="{}")
        if "Options:" in request["messages"][-1]["content"]:
            return Reply(content="(B) Ravi [1].")
        return Reply(content="He was busy that day [1].")

    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    llm = OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, "json_schema")
    llm_server.default = Handler(model)
    try:
        await engine.ingest_many(dataset.messages)
        await engine.embed_pending()
        harness = EvalHarness(engine, RecallPipeline(engine, llm=llm), k=10, llm=llm)
        report = await harness.run(dataset)
    finally:
        await engine.close()
    answers = report["answers"]
    assert answers["scored_by"] == {"judge": 1, "option": 1, "rubric": 1}
    assert answers["by_format"]["multiple_choice"]["accuracy"] == 0.0
    assert answers["by_format"]["short_answer"]["accuracy"] == 0.0
    assert answers["by_format"]["long_form"] == {
        "accuracy": None,
        "mean_score": None,
        "n": 1,
        "unscored": 1,
    }
    assert answers["accuracy"] == 0.0 and answers["unscored"] == 1
