"""The recall-quality floor: a change that loses evidence fails CI, not only a benchmark run.

`fixtures/quality_floor_chat.json` is a group chat written for this test (five friends over
four months: a new job, a cabin weekend, a half marathon, a book club, a move; ten sessions,
162 messages, with later chatter that reuses the earlier words) and 36 questions with the
ids of the messages that answer them. It is in LoCoMo's format, so
`speakermem eval locomo tests/fixtures/quality_floor_chat.json --no-sessions --out r.json`
reports the same figure (with a fresh --db).

The measure is `speakermem eval`'s: evidence recall@10 of the /recall pipeline (no LLM),
with the bot's default embedder (MiniLM), as a live channel sees it (no session markers).
When the floor was set the pipeline scored 0.806 there, plain BM25 0.472 and dense alone
0.708; the floor sits below the first so that a small, deliberate trade-off can pass and a
broken ranking cannot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.eval.harness import EvalHarness
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config

FIXTURE = Path(__file__).parent / "fixtures" / "quality_floor_chat.json"
FLOOR = 0.70
"""Evidence recall@10 the /recall pipeline must reach on the fixture."""


def minilm() -> Any:
    """The bot's default embedder; the test skips where its weights are not installed
    (CI installs them: deploy/install.sh)."""
    from speakermem.integrations.embeddings.minilm import EmbedderUnavailable, MiniLMEmbedder

    embedder = MiniLMEmbedder()
    try:
        embedder.load()
    except EmbedderUnavailable as exc:
        pytest.skip(f"MiniLM weights not installed: {exc}")
    return embedder


async def evidence_recall(tmp_path: Path, embedder: Any, *, lexical: bool = True) -> float:
    """The pipeline's evidence recall@10 on the fixture (`lexical=False`: its word search
    finds nothing, as a broken index would)."""
    dataset = read_locomo(FIXTURE, sessions=False)
    engine = await MemoryEngine.open(make_config(tmp_path), embedder)
    try:
        await engine.ingest_many(dataset.messages)
        await engine.embed_pending()
        if not lexical:

            async def nothing(*args: Any, **kwargs: Any) -> list[Any]:
                return []

            engine.store.messages.lexical = nothing  # type: ignore[method-assign]
        report = await EvalHarness(engine, RecallPipeline(engine), k=10).run(dataset)
    finally:
        await engine.close()
    assert report["questions"] == 36 and report["skipped_without_evidence"] == 0
    return float(report["systems"]["speakermem"]["evidence_recall"])


def test_the_fixture_is_a_group_chat_with_answerable_questions() -> None:
    dataset = read_locomo(FIXTURE, sessions=False)
    assert len({m.speaker_id for m in dataset.messages}) == 5
    assert len(dataset.messages) == 162
    ids = {m.message_id for m in dataset.messages}
    for q in dataset.questions:
        assert q.evidence and set(q.evidence) <= ids, q.id


async def test_recall_stays_above_the_floor(tmp_path: Path) -> None:
    recall = await evidence_recall(tmp_path, minilm())
    assert recall >= FLOOR, f"evidence recall@10 {recall:.3f} fell below the floor {FLOOR}"


async def test_the_floor_catches_broken_retrieval(tmp_path: Path) -> None:
    """No embedder (dense off) and a word search that finds nothing: far below the floor,
    so the measure above depends on what retrieval finds."""
    assert await evidence_recall(tmp_path, None, lexical=False) < FLOOR / 2
