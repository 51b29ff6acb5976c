"""/recall's evidence pack: budgets on a large channel, clipping, and citation checks (split from
test_recall.py, whose fixtures and helpers it shares)."""

from __future__ import annotations

import numpy as np
import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import (
    GROUP,
    Layer,
    Scope,
)
from speakermem.memory.query.answer import check_citations
from speakermem.memory.query.compose import (
    EvidencePack,
    Excerpt,
    approx_tokens,
    clip_level,
    render_pack,
)
from speakermem.memory.query.pipeline import (
    RecallPipeline,
    RecallRequest,
)
from tests.conftest import T0, msg
from tests.test_recall import (
    CHATTER,
    add,
    record,
    team,  # noqa: F401
)

pytestmark = pytest.mark.contract


ROSTER = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
ROSTER += ["Mallory", "Niaj", "Olivia", "Peggy"]


@pytest.mark.parametrize("members", [6, 14])
async def test_pack_stays_within_budget_on_a_500_message_channel(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
    members: int,
) -> None:
    rng = np.random.default_rng(7)
    names = ROSTER[:members]
    words = [*CHATTER, "launch", "budget", "design", "deadline", "review", "customer"]
    events = []
    for i in range(500):
        n = int(rng.integers(5, 120)) if i % 25 else 400  # a few very long messages
        text = " ".join(str(w) for w in rng.choice(words, size=n))
        events.append(msg(team, f"m{i}", names[i % members], text, i * 3.0))
    await engine.ingest_many(events)
    pending = await engine.store.messages.pending_embeddings(1_000)
    vecs = rng.standard_normal((len(pending), 384)).astype(np.float32)
    await engine.store.messages.store_vectors(pending, vecs / np.linalg.norm(vecs, axis=1)[:, None])
    long_text = "keeps pushing the launch budget review" + " and the customer design deadline" * 4
    recs = []
    for i, name in enumerate(names):
        uid, other = name.lower(), names[(i + 1) % members].lower()
        recs += [
            record(Layer.CORE, f"{name} {long_text}", uid, uid, [f"m{i + members * j}"], j)
            for j in range(3)
        ]
        recs.append(
            record(
                Layer.PROFILE,
                f"{name} thinks the launch budget is too tight for them",
                uid,
                other,
                [f"m{i + members * 5}"],
                5,
            )
        )
    recs += [
        record(
            Layer.INSIGHT,
            "The team reviews every launch budget on Fridays",
            GROUP,
            GROUP,
            [f"m{k}"],
            k,
        )
        for k in range(0, 60, 10)
    ]
    await add(engine, team, recs)
    for q in (
        "What does everyone think about the launch budget?",
        "What did Alice say about the customer design deadline?",
        "What did the team decide on the launch review?",
    ):
        result = await RecallPipeline(engine).run(RecallRequest(q, team))
        tokens = approx_tokens(render_pack(result.pack))
        assert 0 < result.pack.tokens == tokens <= 1_500 + 1_300, (q, tokens)  # a hard cap
        assert len(result.trace.s1_evidence) == 10  # cut to size, nothing dropped
        assert result.pack.s1_message_ids() == result.trace.s1_evidence
        # every row that has records keeps at least one of them (no false "(none)")
        for row, prow in zip(result.rows, result.pack.rows, strict=True):
            assert (row.key, bool(row.records)) == (prow.key, bool(prow.records))
        if "everyone" in q:  # the most relevant people (at most 5), never the whole roster
            assert len(result.pack.rows) == min(members, 5) + 1
            assert result.trace.s2_people["left_out"] == members - min(members, 5)
            kept = sum(len(r.records) for r in result.pack.rows)
            found = sum(len(r.records) for r in result.rows)
            # long texts are shortened (and if need be the least important left out), and
            # --explain says so
            assert any(c.startswith(("shortened", "left out")) for c in result.trace.cut)
            assert len(result.pack.rows) <= kept <= found
            assert tokens > 2_000  # but the budget is used, not wasted


@pytest.mark.parametrize(
    ("lengths", "room", "cap"),
    [
        ([10, 20, 30], 100, None),
        ([10, 20, 300], 100, 70),
        ([100, 100], 50, 25),
        ([], 0, None),
        ([500, 5, 5, 500], 110, 50),
    ],
)
def test_clip_level_cuts_only_the_longest_texts(
    lengths: list[int], room: int, cap: int | None
) -> None:
    assert clip_level(lengths, room) == cap


# ----------------------------------------------------------------------------------------------
# Citation checking (pure)


def _pack(n: int) -> EvidencePack:
    scope = Scope(platform="test", workspace="w", channel="c")
    excerpts = [
        Excerpt(
            n=i,
            scope=scope,
            message_id=f"m{i}",
            thread_id=None,
            speaker_id="a",
            speaker="A",
            time=T0,
            text=f"text {i}",
            track="s1",
        )
        for i in range(1, n + 1)
    ]
    return EvidencePack(question="q", tense="head", excerpts=excerpts, rows=[])


@pytest.mark.parametrize(
    ("text", "cleaned", "used", "stripped"),
    [
        ("Alice said yes [1].", "Alice said yes [1].", [1], 0),
        ("Both agreed [1, 2].", "Both agreed [1][2].", [1, 2], 0),
        ("Both agreed [2,1].", "Both agreed [2][1].", [2, 1], 0),
        ("Noted [1][3].", "Noted [1][3].", [1, 3], 0),
        ("Noted [1][9].", "Noted [1].", [1], 1),
        ("Made up [7].", "Made up.", [], 1),
        ("Made up [0] and [12, 99]!", "Made up and!", [], 3),
        ("Mixed [3, 42], fine.", "Mixed [3], fine.", [3], 1),
        ("No citations at all.", "No citations at all.", [], 0),
        ("Wrong [9], then right [2]; done [9]?", "Wrong, then right [2]; done?", [2], 2),
        ("Reused [1] and [1] again.", "Reused [1] and [1] again.", [1], 0),
        ("Not a cite [a] or [1a] or [ 1 ].", "Not a cite [a] or [1a] or [ 1 ].", [], 0),
    ],
)
def test_check_citations(text: str, cleaned: str, used: list[int], stripped: int) -> None:
    assert check_citations(text, _pack(3)) == (cleaned, used, stripped)


def test_check_citations_with_an_empty_pack_strips_everything() -> None:
    assert check_citations("Claim [1].", _pack(0)) == ("Claim.", [], 1)
