"""The Writer and doctor against each model server's behaviour (issue 32), default settings.

Every server here is the one fake (tests/llm_server.py) with a `Persona`: vLLM's
max_model_len, llama.cpp's /props and its Python server's HTTP 500 on json_schema, Ollama's
silent cut at a small context, LM Studio's loaded context, reasoning models thinking inline
or in a field, 429 with Retry-After. Each is driven through the real openai client with
nothing set but the endpoint, the model and the database: `doctor` must name the server and
the mode it chose, flag a cut prompt and thinking; the Writer must accept valid actions; a
cut prompt must be detected and reported, never used.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.governance_commands import writer_lines
from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_llm, open_engine
from speakermem.integrations.doctor import llm_checks
from speakermem.integrations.doctor_checks import exit_code
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.store.usage import writer_usage
from speakermem.memory.writer.runner import Writer
from tests.conftest import msg
from tests.llm_server import (
    Handler,
    LLMServer,
    Persona,
    Reply,
    Status,
    llamacpp,
    lmstudio,
    ollama,
    prompt_tokens,
    vllm,
    writer_model,
)

SCOPE = Scope(platform="test", workspace="w1", channel="plans")
SPEAKERS = ("Alice", "Bob", "Carol", "Dan", "Erin")
TOPICS = (
    "booked the train to Porto for the 14th and will share the tickets tonight",
    "moved to the payments team last Monday and now works from the Berlin office",
    "is allergic to peanuts, so the dinner on Friday must be nut-free",
    "agreed to cover the Thursday on-call shift while the release goes out",
    "is presenting the third-quarter roadmap at the offsite, slides due Wednesday",
)


def settings_for(tmp_path: Path, server: LLMServer, **extra: Any) -> Settings:
    """Defaults everywhere but where the endpoint and the database are."""
    values: dict[str, Any] = {
        "db_path": tmp_path / "servers.db",
        "embedder": "none",
        "llm_base_url": server.base_url,
        "llm_model": "test-model",
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


async def fill(engine: MemoryEngine, segments: int = 2) -> int:
    """`segments` full windows of long-ish chat lines (a 25-message prompt is ~2,300 tokens)."""
    events = []
    for i in range(25 * segments):
        who = SPEAKERS[i % len(SPEAKERS)]
        text = (
            f"Update {i}: {who} {TOPICS[i % len(TOPICS)]}; please keep it in mind for the "
            f"plans and tell the others in this channel before the weekend (note {i})."
        )
        events.append(msg(SCOPE, f"s{i}", who, text, i))
    await engine.ingest_many(events)
    return len(events)


async def write_all(settings: Settings) -> tuple[list[Any], dict[str, Any], OpenAICompatLLM]:
    """Ingest two segments and write them with the Writer the bot would build."""
    llm = build_llm(settings)
    assert isinstance(llm, OpenAICompatLLM)
    async with open_engine(settings, with_embedder=False) as engine:
        await fill(engine)
        writer = Writer(engine, llm)
        outcomes = await writer.flush_due()
        runs = await engine.store.db.read(
            "SELECT outcome, error, prompt_tokens FROM writer_runs ORDER BY id"
        )
        usage = await writer_usage(engine.store)
    await llm.aclose()
    return outcomes, {"runs": runs, "usage": usage}, llm


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name.split(" (")[0]: c for c in checks}


# ---- doctor: the server, the mode it chose, the context -------------------------------------

PERSONAS = {
    "vllm": (vllm(8192), "vLLM", "json_schema"),
    "llamacpp": (llamacpp(8192), "llama.cpp server", "json_object"),
    "llamacpp-python": (llamacpp(8192, python=True), "not identified", "json_object"),
    "ollama": (ollama(8192, advertise_context=True), "Ollama 0.6.5", "json_schema"),
    "lmstudio": (lmstudio(8192), "LM Studio", "json_schema"),
}


@pytest.mark.parametrize("name", list(PERSONAS))
async def test_doctor_names_the_server_and_the_mode_it_chose(tmp_path: Path, name: str) -> None:
    persona, server_name, mode = PERSONAS[name]
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        checks = await llm_checks(settings_for(tmp_path, server))
    found = by_name(checks)
    assert server_name in found["server"].detail
    assert f"structured mode {mode}" in found["server"].detail
    output = found["structured output"]
    assert output.name == f"structured output ({mode})" and output.status == "ok", output
    if name == "llamacpp-python":  # no /props: its context is not known, and doctor says so
        assert found["context"].status == "warn"
        assert "SPEAKERMEM_LLM_CONTEXT_TOKENS" in (found["context"].fix or "")
    else:
        assert found["context"].status == "ok" and "8192 tokens" in found["context"].detail
    assert found["thinking"].detail == "off" or found["thinking"].detail.startswith("off;")
    assert "tokens/s" in found["latency"].detail
    assert exit_code(checks) == 0
    sent = server.requests[-1]
    assert "You are the Writer" in sent["messages"][0]["content"]  # the real Writer prompt
    kind = (sent.get("response_format") or {}).get("type", "none")
    assert kind == mode


async def test_doctor_warns_that_ollama_cuts_prompts_at_its_assumed_context(
    tmp_path: Path,
) -> None:
    """Ollama that does not say its context: the release default (2,048 before 0.6.7) is
    assumed, the probe is split to fit, and the fix names OLLAMA_CONTEXT_LENGTH."""
    async with LLMServer(default=Handler(writer_model), persona=ollama(2048)) as server:
        checks = by_name(await llm_checks(settings_for(tmp_path, server)))
    context = checks["context"]
    assert context.status == "warn"
    assert "2048 tokens (Ollama's default for 0.6.5 (assumed))" in context.detail
    assert "written in 2 calls" in context.detail and "without an error" in context.detail
    assert "OLLAMA_CONTEXT_LENGTH=" in (context.fix or "")
    assert "PARAMETER num_ctx" in (context.fix or "")
    assert server.cut == []  # sized to fit: nothing was cut
    assert checks["structured output"].status == "ok"


async def test_doctor_flags_a_prompt_the_server_cut(tmp_path: Path) -> None:
    """A newer Ollama is assumed at 4,096 tokens but runs at 1,024: the Writer-sized probe
    is cut, the doctor fails the context with the Ollama fix and judges no output."""
    persona = ollama(1024, version="0.9.0")
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        checks = await llm_checks(settings_for(tmp_path, server))
    found = by_name(checks)
    assert server.cut, "the fake should have cut the probe"
    context = found["context"]
    assert context.status == "fail"
    assert "the server cut a Writer prompt" in context.detail
    assert "read 1024 of ~" in context.detail
    assert "OLLAMA_CONTEXT_LENGTH=" in (context.fix or "")
    assert found["structured output"].status == "fail"
    assert "not judged" in found["structured output"].detail
    assert exit_code(checks) == 1


@pytest.mark.parametrize("where", ["content", "field"])
async def test_doctor_flags_thinking_it_cannot_switch_off(tmp_path: Path, where: str) -> None:
    persona = ollama(8192, advertise_context=True, thinking=where)  # 0.6.5: no switch
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        checks = by_name(await llm_checks(settings_for(tmp_path, server)))
    assert checks["structured output"].status == "ok"  # the draft in the thinking is ignored
    thinking = checks["thinking"]
    assert thinking.status == "warn" and thinking.detail.startswith("on: the model thought")
    assert "1024 tokens more" in thinking.detail


async def test_doctor_reports_thinking_switched_off_on_vllm(tmp_path: Path) -> None:
    persona = vllm(8192, thinking="field", thinking_field="reasoning")
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        checks = by_name(await llm_checks(settings_for(tmp_path, server)))
    assert checks["thinking"].detail == "off; asked off with chat_template_kwargs"
    assert server.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}


# ---- the Writer with default settings ----------------------------------------------------------


@pytest.mark.parametrize(
    "persona",
    [
        vllm(8192),
        llamacpp(8192),
        llamacpp(8192, python=True),
        lmstudio(8192),
        ollama(2048),
        vllm(2048),
        llamacpp(2048),
    ],
    ids=[
        "vllm",
        "llamacpp",
        "llamacpp-python",
        "lmstudio",
        "ollama-2k",
        "vllm-2k",
        "llamacpp-2k",
    ],
)
async def test_the_writer_accepts_valid_actions_with_default_settings(
    tmp_path: Path, persona: Persona
) -> None:
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        outcomes, _, llm = await write_all(settings_for(tmp_path, server))
    assert [o.status for o in outcomes] == ["committed", "committed"]
    assert all(o.accepted >= 1 for o in outcomes), outcomes
    assert server.cut == []  # sized to the context from the start
    if persona.context_tokens == 2048:  # a 25-message segment does not fit 2,048 tokens
        assert all(o.accepted >= 2 for o in outcomes)  # written in parts, one ADD each
    assert llm.stats.errors.get("rejected", 0) == 0


async def test_a_cut_prompt_is_detected_reported_and_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ollama assumed at 4,096 tokens (0.9.0) that runs at 2,048: the first prompt is cut
    (the model, without its instructions, answers NOOP). That answer is never used: the
    adapter sees the server read far less than it was sent, the Writer plans the segment
    again for 2,048 tokens, and the run log says so."""
    caplog.set_level(logging.WARNING)
    persona = ollama(2048, version="0.9.0")
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        outcomes, log, llm = await write_all(settings_for(tmp_path, server))
    assert len(server.cut) == 1  # only the first prompt: later ones are sized to fit
    assert [o.status for o in outcomes] == ["committed", "committed"]
    assert all(o.accepted >= 2 for o in outcomes)
    assert llm.stats.truncations == 1 and llm.context_tokens == 2048
    assert "a cut prompt" in llm.context_source
    first = log["runs"][0]
    assert first[0] == "committed" and "did not fit" in first[1] and "2048" in first[1]
    assert "OLLAMA_CONTEXT_LENGTH=" in caplog.text  # the warning names the fix


async def test_the_writer_ignores_a_draft_in_the_thinking(tmp_path: Path) -> None:
    """A reasoning model drafting `{"type": "NOOP"}` inside <think> before its real answer:
    the answer after the thinking is what the Writer reads."""
    persona = ollama(8192, advertise_context=True, thinking="content")
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        outcomes, _, llm = await write_all(settings_for(tmp_path, server))
    assert all(o.accepted >= 1 for o in outcomes)
    assert llm.stats.thinking_tokens > 0 and llm.thinks
    # Ollama said "thinking" and 0.6.5 has no switch: every call gets the thinking budget
    # (SPEAKERMEM_LLM_THINKING_TOKENS, 1024) on top of the answer's 2048
    assert {r["max_tokens"] for r in server.requests} == {2048 + 1024}
    assert "reasoning" not in server.requests[0]  # no switch sent to a release without one


async def test_reasoning_content_is_read_and_not_taken_for_the_answer(tmp_path: Path) -> None:
    persona = llamacpp(8192, thinking="field", thinking_switch=False)
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        outcomes, _, llm = await write_all(settings_for(tmp_path, server))
    assert all(o.accepted >= 1 for o in outcomes)
    assert llm.stats.thinking_tokens > 0
    assert server.requests[0]["chat_template_kwargs"] == {"enable_thinking": False}
    # the switch did not stop it: once seen, thinking gets its budget on top of the answer
    assert [r["max_tokens"] for r in server.requests] == [2048, 2048 + 1024]


async def test_the_thinking_budget_setting_changes_what_is_asked(tmp_path: Path) -> None:
    persona = llamacpp(8192, thinking="field", thinking_switch=False)
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        await write_all(settings_for(tmp_path, server, llm_thinking_tokens=300))
    assert [r["max_tokens"] for r in server.requests] == [2048, 2048 + 300]


async def test_a_429_with_retry_after_pauses_the_writer_that_long(tmp_path: Path) -> None:
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        server.script(Status(429, headers={"Retry-After": "120"}))
        settings = settings_for(tmp_path, server)
        llm = build_llm(settings)
        async with open_engine(settings, with_embedder=False) as engine:
            await fill(engine, segments=1)
            writer = Writer(engine, llm)  # type: ignore[arg-type]
            (outcome,) = await writer.flush_due()
            assert outcome.status == "deferred" and "429" in (outcome.error or "")
            assert writer.paused_until - time.time() > 100  # the server's 120 s, honoured
            assert len(server.requests) == 1  # no retry inside the call
            assert writer.pacer.limit == 1  # halved from 2: the server said it is full
        await llm.aclose()  # type: ignore[union-attr]


# ---- usage ---------------------------------------------------------------------------------------


async def test_tokens_per_run_and_per_thousand_messages(tmp_path: Path) -> None:
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        settings = settings_for(
            tmp_path,
            server,
            llm_prompt_price_per_mtok=1.0,
            llm_completion_price_per_mtok=2.0,
        )
        _, log, _ = await write_all(settings)
    usage = log["usage"]
    prompt = sum(r[2] for r in log["runs"])
    assert usage.runs == 2 and usage.messages == 50 and usage.prompt_tokens == prompt
    total = usage.prompt_tokens + usage.completion_tokens
    assert usage.tokens_per_run == pytest.approx(total / 2)
    assert usage.tokens_per_1k_messages == pytest.approx(total * 1000 / 50)
    cost = usage.cost_usd(1.0, 2.0)
    assert cost == pytest.approx((usage.prompt_tokens + 2 * usage.completion_tokens) / 1e6)


@pytest.mark.slow
async def test_status_shows_the_backlog_and_what_the_writer_costs(tmp_path: Path) -> None:
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        settings = settings_for(tmp_path, server, llm_prompt_price_per_mtok=3.0)
        llm = build_llm(settings)
        async with open_engine(settings, with_embedder=False) as engine:
            began = time.time()
            await fill(engine, segments=3)  # the third window closes with the next message
            await engine.ingest_many([msg(SCOPE, "last", "Alice", "one more", 100)])
            writer = Writer(engine, llm)  # type: ignore[arg-type]
            await writer.flush_due(limit=2)  # the third segment stays pending
            status = await Governance(engine).status()
            elapsed = time.time() - began
        await llm.aclose()  # type: ignore[union-attr]
    queue, usage = status["writer_queue"], status["writer_usage"]
    assert queue["pending_segments"] == 1 and queue["deferred_segments"] == 0
    # the pending segment opened during this test: its age is reported, within the test's span
    assert queue["oldest_pending_age_s"] is not None
    assert 0 <= queue["oldest_pending_age_s"] <= round(elapsed, 1) + 0.1
    assert usage["runs"] == 2 and usage["messages_written"] == 50
    assert usage["tokens_per_1k_messages"] > usage["tokens_per_run"] > 0
    assert usage["cost_usd"] == pytest.approx(usage["prompt_tokens"] * 3.0 / 1e6)
    line = writer_lines(status)
    assert "oldest pending segment" in line and "per 1,000 messages" in line and "$" in line


async def test_a_configured_context_sizes_the_writers_prompts(tmp_path: Path) -> None:
    """An unidentified server that says nothing: SPEAKERMEM_LLM_CONTEXT_TOKENS is what the
    prompts are sized to (a 25-message segment, ~2,300 tokens, does not fit 2,048)."""
    sizes = {}
    for context in (None, 2048):
        async with LLMServer(default=Handler(writer_model)) as server:
            where = tmp_path / str(context)
            where.mkdir()
            outcomes, _, _ = await write_all(
                settings_for(where, server, llm_context_tokens=context)
            )
        assert all(o.status == "committed" for o in outcomes)
        sizes[context] = [prompt_tokens(r) for r in server.requests]
    assert len(sizes[None]) == 2 and min(sizes[None]) > 2048  # one call per segment
    assert len(sizes[2048]) > 2 and max(sizes[2048]) < 2048 - 512  # the answer's room kept


async def test_the_ceiling_bounds_the_writers_concurrency(tmp_path: Path) -> None:
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        settings = settings_for(tmp_path, server, writer_max_concurrency=3)
        llm = build_llm(settings)
        async with open_engine(settings, with_embedder=False) as engine:
            writer = Writer(engine, llm)  # type: ignore[arg-type]
            assert writer.pacer.controller.ceiling == 3
            for _ in range(30):
                writer.pacer.controller.saturated()
                for _ in range(writer.pacer.limit):
                    writer.pacer.controller.observe(1.0)
            assert writer.pacer.limit == 3
        await llm.aclose()  # type: ignore[union-attr]


async def test_the_answer_prompt_is_sized_to_a_small_context(tmp_path: Path) -> None:
    """At 700 tokens the default evidence pack (1,500 + 1,300 tokens) does not fit: the pack
    shrinks to what does, and the model answers instead of refusing the prompt."""

    def answerer(body: dict[str, Any]) -> Reply:
        if body.get("response_format") is not None:  # Select and other structured stages
            return Reply(content='{"picks": []}')
        return Reply(content="Alice booked the train to Porto [1].")

    async with LLMServer(default=Handler(answerer), persona=vllm(700)) as server:
        settings = settings_for(tmp_path, server)
        llm = build_llm(settings)
        async with open_engine(settings, with_embedder=False) as engine:
            await fill(engine, segments=2)
            pipeline = RecallPipeline(engine, llm=llm)
            result = await pipeline.run(
                RecallRequest(question="Who booked the train to Porto?", scope=SCOPE)
            )
        await llm.aclose()  # type: ignore[union-attr]
    budgets = result.trace.budgets
    assert budgets["s1_pack_tokens"] + budgets["s2_pack_tokens"] < 700
    assert result.answer.used_llm, result.trace.llm_errors
    answer_calls = [r for r in server.requests if r.get("response_format") is None]
    assert answer_calls and all(prompt_tokens(r) < 700 for r in answer_calls)


async def test_a_refused_prompt_teaches_the_context_and_is_written_again(tmp_path: Path) -> None:
    """vLLM that hides max_model_len (a proxy in front): its 400 names the context, the
    segment is planned again for it and written; the run log says so."""
    persona = vllm(2048, advertise_context=False)
    async with LLMServer(default=Handler(writer_model), persona=persona) as server:
        outcomes, log, llm = await write_all(settings_for(tmp_path, server))
    assert [o.status for o in outcomes] == ["committed", "committed"]
    assert llm.context_tokens == 2048 and llm.context_source == "the server's context error"
    assert llm.stats.errors.get("context_overflow") == 1
    assert "did not fit" in log["runs"][0][1] and log["runs"][1][1] is None


async def test_a_refused_thinking_switch_is_dropped_for_good(tmp_path: Path) -> None:
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        server.script(Status(400, body={"error": {"message": "unexpected chat_template_kwargs"}}))
        outcomes, _, llm = await write_all(settings_for(tmp_path, server))
    assert all(o.status == "committed" for o in outcomes)
    sent = [("chat_template_kwargs" in r) for r in server.requests]
    assert sent == [True, False, False]  # refused once, then never sent again
    assert llm.profile is not None and llm.profile.thinking_off == {}


async def test_writer_workers_raise_their_claims_as_the_endpoint_keeps_up(tmp_path: Path) -> None:
    """`speakermem worker` rounds claim as many segments as the pacer allows: a round that
    found as many as it had slots counts as waiting work, so the limit climbs."""
    async with LLMServer(default=Handler(writer_model), persona=vllm(8192)) as server:
        settings = settings_for(tmp_path, server)
        llm = build_llm(settings)
        async with open_engine(settings, with_embedder=False) as engine:
            for c in range(12):
                where = Scope(platform="test", workspace="w1", channel=f"c{c}")
                await engine.ingest_many(
                    [msg(where, f"{c}-{i}", SPEAKERS[i % 5], TOPICS[i % 5], i) for i in range(26)]
                )
            writer = Writer(engine, llm)  # type: ignore[arg-type]
            sizes = []
            while outcomes := await writer.write_claimed("w1", lease_s=60.0):
                sizes.append(len(outcomes))
        await llm.aclose()  # type: ignore[union-attr]
    assert sizes == [2, 4, 6]  # 2 claimed (all it could), then 4, then the 6 left
    assert writer.pacer.limit == 8  # the last round had slots to spare: no further climb
