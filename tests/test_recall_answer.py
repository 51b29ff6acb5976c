"""/recall's Project and Answer stages with the scripted LLM, System 2 rows and the pack's numbering
(split from test_recall.py, whose fixtures and helpers it shares)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import (
    GROUP,
    Layer,
    Scope,
)
from speakermem.memory.query.answer import check_citations, extractive_answer
from speakermem.memory.query.compose import (
    approx_tokens,
    render_pack,
)
from speakermem.memory.query.pipeline import (
    RecallPipeline,
    RecallRequest,
)
from speakermem.memory.query.projection import fallback_projection
from speakermem.memory.query.system2 import read_rows
from tests.llm_server import Garbage, LLMServer, Reply
from tests.test_recall import (
    Router,
    add,
    llm,  # noqa: F401
    record,
    rows_section,
    seed,
    seed_records,
    team,  # noqa: F401
)

pytestmark = pytest.mark.contract


async def test_project_uses_a_valid_llm_reply_and_falls_back_on_garbage(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
    llm_server: LLMServer,
    llm: OpenAICompatLLM,  # noqa: F811
) -> None:
    await seed(engine, team)
    router = Router(
        llm_server,
        project=Reply(
            content='{"issue": "launch date", "rows": ["bob"], "tense": "full",'
            ' "source": null, "owner": "Bob"}'
        ),
    )
    pipe = RecallPipeline(engine, llm=llm)
    result = await pipe.run(RecallRequest("When does the launch happen?", team))
    assert result.trace.projection["method"] == "llm"
    assert result.trace.projection["rows"] == ["bob"]
    assert result.trace.projection["tense"] == "full"
    assert result.trace.projection["owner"] == "bob"  # a name resolved to its roster id
    assert [r.key for r in result.rows] == ["bob"]
    prompt = router.user_prompt("project")
    assert "alice: Alice" in prompt and "helperbot: HelperBot [bot]" in prompt

    router.routes["project"] = Garbage()
    fallback = await pipe.run(RecallRequest("When does the launch happen?", team))
    assert fallback.trace.projection["method"] == "fallback"
    assert any(e.startswith("project:") for e in fallback.trace.llm_errors)

    router.routes["project"] = Reply(
        content='{"issue": "x", "rows": ["nobody-here"],'
        ' "tense": "head", "source": null, "owner": null}'
    )
    unknown = await pipe.run(RecallRequest("When does the launch happen?", team))
    assert unknown.trace.projection["method"] == "fallback"


async def test_answer_keeps_valid_citations_and_strips_unknown_ones(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
    llm_server: LLMServer,
    llm: OpenAICompatLLM,  # noqa: F811
) -> None:
    await seed(engine, team)
    Router(llm_server, answer=Reply(content="Alice wants May [1]. Bob says April [99]."))
    # citation checking alone: the claim check (tests/test_claims.py) would re-cite these
    no_claims = engine.config.recall.model_copy(update={"check_claims": False})
    result = await RecallPipeline(engine, llm=llm, config=no_claims).run(
        RecallRequest("When is the launch?", team)
    )
    ans = result.answer
    assert ans.used_llm
    assert ans.text == "Alice wants May [1]. Bob says April."
    assert ans.stripped_citations == 1
    assert [c.n for c in ans.citations] == [1]
    assert ans.citations[0].message_id == result.pack.excerpts[0].message_id


async def test_uncited_llm_answer_falls_back_to_extractive(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
    llm_server: LLMServer,
    llm: OpenAICompatLLM,  # noqa: F811
) -> None:
    await seed(engine, team)
    Router(llm_server, answer=Reply(content="The launch is in May, trust me."))
    result = await RecallPipeline(engine, llm=llm).run(RecallRequest("When is the launch?", team))
    ans = result.answer
    assert not ans.used_llm
    expected, used, _ = check_citations(extractive_answer(result.pack), result.pack)
    assert ans.text == expected and ans.text.startswith("Here is what I found")
    assert [c.n for c in ans.citations] == used and used
    assert "answer: reply had no valid citations" in result.trace.llm_errors


async def test_llm_outage_still_answers_extractively(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
    llm_server: LLMServer,
    llm: OpenAICompatLLM,  # noqa: F811
) -> None:
    await seed(engine, team)
    llm_server.fail_next(10, status=503)
    result = await RecallPipeline(engine, llm=llm).run(RecallRequest("When is the launch?", team))
    assert result.trace.projection["method"] == "fallback"
    assert result.trace.select == "fused (llm reply unusable)"
    assert not result.answer.used_llm and result.answer.citations
    assert {e.split(":")[0] for e in result.trace.llm_errors} >= {"project", "select", "answer"}


# ----------------------------------------------------------------------------------------------
# System 2 rows


async def test_all_rows_k_source_k_fallback_and_none(engine: MemoryEngine, team: Scope) -> None:  # noqa: F811
    await seed(engine, team)
    ids = await seed_records(engine, team)
    result = await RecallPipeline(engine).run(
        RecallRequest("What does everyone think about the launch?", team)
    )
    keys = [r.key for r in result.rows]
    assert result.trace.projection["rows"] == ["ALL"]
    assert keys[-1] == GROUP and sorted(keys[:-1]) == ["alice", "bob", "carol", "dave"]
    rows = {r.key: r for r in result.rows}
    for row in result.rows:  # k=2 per row, plus at most source-k=1 about others
        assert len([rr for rr in row.records if not rr.via_source]) <= 2
        assert len([rr for rr in row.records if rr.via_source]) <= 1
    alice = rows["alice"]
    assert len([rr for rr in alice.records if not rr.via_source]) == 2  # she has 3 on topic
    via = [rr.record for rr in alice.records if rr.via_source]
    assert [r.id for r in via] == [ids["ab"]] and via[0].owner == "bob"
    assert {rr.record.owner for rr in alice.records if not rr.via_source} == {"alice"}
    assert {rr.record.id for rr in rows[GROUP].records} == {ids["g1"], ids["g2"]}
    # Carol: messages, no records -> her best verbatim messages
    carol = rows["carol"]
    assert not carol.records and carol.fallback
    assert all(m.speaker_id == "carol" and "launch" in m.text.lower() for m in carol.fallback)
    # Dave: nothing at all -> an explicit (none)
    assert rows["dave"].empty
    text = render_pack(result.pack)
    assert "- Dave:\n    (none)" in text
    assert "- Carol:\n    (no derived record; see their messages [" in text
    assert "(provided about someone else)" in text
    assert result.trace.s2_rows["Dave"] == ["(none)"]

    narrow = await RecallPipeline(engine, config=RecallConfig(s2_k=1, s2_source_k=0)).run(
        RecallRequest("What does everyone think about the launch?", team)
    )
    for row in narrow.rows:
        assert len(row.records) <= 1 and not any(rr.via_source for rr in row.records)
    assert len({r.key: r for r in narrow.rows}["alice"].records) == 1


async def test_rows_embed_the_issue_only_when_lexical_matches_run_short(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
) -> None:
    await seed(engine, team)
    ids = await seed_records(engine, team)
    roster = await engine.members(team)
    pks = await engine.channel_pks([team])
    calls: list[str] = []

    def lazy(issue: str) -> Callable[[], Any]:
        async def vector() -> np.ndarray | None:
            calls.append(issue)
            return await engine.embed_query(issue)

        return vector

    full = fallback_projection("What does Alice think about the launch?", roster)
    cfg = RecallConfig()
    rows = (await read_rows(engine, full, roster, pks, cfg, query_vector=lazy("launch"))).rows
    assert calls == [] and len([rr for rr in rows[0].records if not rr.via_source]) == 2

    # no record shares a word with "weekly standup": every row is filled by the dense pool,
    # which is fetched once for all rows
    short = fallback_projection("What does everyone think about the weekly standup?", roster)
    rows = (await read_rows(engine, short, roster, pks, cfg, query_vector=lazy("x"))).rows
    assert calls == ["x"]
    by_key = {r.key: r for r in rows}
    assert {rr.record.id for rr in by_key[GROUP].records} == {ids["g1"], ids["g2"]}
    assert len(by_key["alice"].records) == 2
    assert all(rr.record.owner == "alice" for rr in by_key["alice"].records)


async def test_head_shows_new_state_and_full_shows_the_chain(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
) -> None:
    await seed(engine, team)
    (old,) = await add(
        engine,
        team,
        [
            record(
                Layer.CORE,
                "Alice prefers Postgres for the launch database",
                "alice",
                "alice",
                ["db1"],
                27,
                event="database",
            )
        ],
    )
    (new,) = await add(
        engine,
        team,
        [
            record(
                Layer.CORE,
                "Alice now prefers SQLite for the launch database",
                "alice",
                "alice",
                ["db2"],
                45,
                supersedes=old,
                event="database",
            )
        ],
    )
    pipe = RecallPipeline(engine)

    head = await pipe.run(RecallRequest("Which database does Alice prefer?", team))
    assert head.trace.projection["tense"] == "head"
    rows = rows_section(head)
    assert "SQLite" in rows and "Postgres" not in rows
    assert [rec.state for rec in head.pack.rows[0].records] == ["active"]

    full = await pipe.run(
        RecallRequest(
            "Which database did Alice use to prefer before, and how has it changed?", team
        )
    )
    assert full.trace.projection["tense"] == "full"
    rows = rows_section(full)
    assert rows.startswith(" (full history, oldest first")
    lines = [ln for ln in rows.splitlines() if "launch database" in ln]
    assert len(lines) == 2
    assert "Postgres" in lines[0] and "2024-03-01 09:27; superseded" in lines[0]
    assert "SQLite" in lines[1] and "2024-03-01 09:45; active" in lines[1]
    assert [r.record_id for r in full.pack.rows[0].records[:2]] == [old, new]


# ----------------------------------------------------------------------------------------------
# Compose


async def test_pack_numbers_excerpts_once_and_records_point_at_their_support(
    engine: MemoryEngine,
    team: Scope,  # noqa: F811
) -> None:
    await seed(engine, team)
    await seed_records(engine, team)
    result = await RecallPipeline(engine).run(
        RecallRequest("What does everyone think about the launch?", team)
    )
    pack = result.pack
    assert [e.n for e in pack.excerpts] == list(range(1, len(pack.excerpts) + 1))
    keys = [(e.scope, e.message_id) for e in pack.excerpts]
    assert len(keys) == len(set(keys))
    tracks = [e.track for e in pack.excerpts]
    assert tracks == sorted(tracks)  # s1 first, then s2 support
    n_records = 0
    for row in pack.rows:
        for rec in row.records:
            n_records += 1
            assert rec.excerpts, rec
            for n in rec.excerpts:
                excerpt = pack.excerpt(n)
                assert excerpt is not None and excerpt.message_id in rec.from_ids
        for n in row.fallback_excerpts:
            excerpt = pack.excerpt(n)
            assert excerpt is not None and excerpt.speaker_id == row.key
    assert n_records >= 6
    assert pack.tokens == approx_tokens(render_pack(pack)) > 0
