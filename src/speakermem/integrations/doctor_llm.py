"""`speakermem doctor`'s LLM checks: one realistic Writer call, and what it shows.

A 32-token "pong" proves the endpoint answers; it does not prove the Writer works there.
The probe is what the Writer sends: a 25-message segment of a made-up team chat, the
roster and the current memory, sized to the context the adapter found (split as the Writer
would split it), with the real Writer schema. From that one call the doctor reports the
server and the structured mode it takes, the context and where it comes from, whether the
server cut the prompt, whether the model thinks, latency and tokens/s, and a fix for each
failure.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from speakermem.bot.settings import Settings
from speakermem.integrations.app import build_llm
from speakermem.integrations.doctor_checks import Check, verdict
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.context_budget import PromptBudget, prompt_budget
from speakermem.memory.models import (
    DerivedRecord,
    Layer,
    RecordScope,
    RecordState,
    RosterMember,
    Scope,
    StoredMessage,
)
from speakermem.memory.ports import ChatMessage, LLMContextOverflow, LLMError, LLMResult
from speakermem.memory.writer.prompt import WRITER_SCHEMA, WriterOutput
from speakermem.memory.writer.sizing import plan_prompts

LATENCY_WARN_MS = 30_000.0
"""A Writer call slower than this delays memory noticeably (ingestion never waits)."""

_PEOPLE = [
    ("u1", "Maya"),
    ("u2", "Tom"),
    ("u3", "Priya"),
    ("u4", "Jonas"),
    ("u5", "Lea"),
    ("u6", "Sam"),
]
_LINES = [
    "Morning all. Quick reminder that the offsite planning doc is due on Friday.",
    "Thanks Maya. I booked the train tickets for the Lisbon trip, we leave on the 14th.",
    "Great. Did anyone check whether the venue has a projector and decent wifi?",
    "I called them yesterday: projector yes, wifi is patchy in the big room.",
    "Then let's bring the portable router, I can take it home tonight and test it.",
    "By the way I switched teams, I'm on the payments squad since Monday.",
    "Congrats Priya! Who takes over your on-call shifts next week?",
    "Jonas agreed to cover Tuesday and Wednesday, I still need someone for Thursday.",
    "I can do Thursday if someone swaps my Saturday shift with me.",
    "Deal, I'll take your Saturday. Updating the rota now.",
    "For the offsite dinner, anyone vegetarian or allergic to something?",
    "I'm vegetarian, and Sam can't eat nuts.",
    "Right, I'm allergic to peanuts, please no satay this time.",
    "Noted. I'll ask the restaurant for a vegetarian menu and a nut-free kitchen.",
    "Budget check: finance approved 4,000 euros for the whole trip.",
    "That should cover travel and two dinners if we keep the hotel under 120 a night.",
    "I found a hotel near the venue at 110 a night with breakfast included.",
    "Book it, we agreed last week to stay together in one place.",
    "Booked, confirmation is in the shared drive under offsite/hotel.",
    "Can we move the retro to Thursday afternoon? Tuesday clashes with the release.",
    "Fine by me, Thursday 3pm then. I'll send a new invite.",
    "Lea, are you still presenting the roadmap at the offsite?",
    "Yes, I'm presenting the Q3 roadmap on day one, slides by next Wednesday.",
    "I'll review them Wednesday evening if you share them by noon.",
    "Perfect, thanks everyone. Let's keep the offsite channel for logistics only.",
]


def probe_segment() -> tuple[list[RosterMember], list[DerivedRecord], list[StoredMessage]]:
    """A 25-message team chat with its roster and two current memories (made up, fixed)."""
    scope = Scope(platform="doctor", workspace="w", channel="offsite")
    start = datetime(2025, 5, 5, 9, 0, tzinfo=UTC)
    roster = [RosterMember(user_id=uid, display_name=name) for uid, name in _PEOPLE]
    messages = [
        StoredMessage(
            pk=i + 1,
            scope=scope,
            message_id=f"doctor-{i}",
            thread_id=None,
            speaker_id=_PEOPLE[i % len(_PEOPLE)][0],
            speaker_name=_PEOPLE[i % len(_PEOPLE)][1],
            text=text,
            ts=start + timedelta(minutes=3 * i),
            session_id=1,
            turn_index=i,
            reply_to=None,
            addressees=(),
            edited_at=None,
        )
        for i, text in enumerate(_LINES)
    ]
    heads = [
        DerivedRecord(
            id=101,
            scope=scope,
            layer=Layer.CORE,
            record_scope=RecordScope.PERSON,
            content="Priya works on the search team.",
            source="u3",
            owner="u3",
            event="job",
            time=start - timedelta(days=30),
            session_id=0,
            from_ids=("old-1",),
            state=RecordState.ACTIVE,
            chain_root=101,
            writer_model="doctor",
            prompt_version="doctor",
        )
    ]
    return roster, heads, messages


def _mode_fix(server: str) -> str:
    return (
        f"the endpoint ({server}) did not return the Writer's JSON: use an instruction-tuned "
        "model (docs/guides/serving-a-writer-model.md), or force a mode with "
        "SPEAKERMEM_LLM_STRUCTURED_MODE=json_object (llama.cpp) / json_schema (vLLM, Ollama, "
        "LM Studio) / none"
    )


async def writer_probe_checks(settings: Settings, timeout_s: float) -> list[Check]:
    """Identify the server and make one Writer-sized call; never raises."""
    llm = build_llm(settings.model_copy(update={"llm_timeout_s": timeout_s, "llm_max_retries": 0}))
    assert isinstance(llm, OpenAICompatLLM)  # settings name an endpoint: the caller checked
    cfg = settings.memory_config().writer
    out: list[Check] = []
    try:
        limits = await llm.limits()
        profile = llm.profile
        server = profile.name if profile is not None else "the endpoint"
        roster, heads, messages = probe_segment()
        budget = prompt_budget(limits, cfg.max_tokens)
        whole = plan_prompts(
            roster,
            heads,
            messages,
            links=None,
            budget=PromptBudget(budget.output_tokens, None),
            cfg=cfg,
        )[0][0]
        parts, _ = plan_prompts(roster, heads, messages, links=None, budget=budget, cfg=cfg)
        part = parts[0]
        started = time.perf_counter()
        error: str | None = None
        truncated: LLMContextOverflow | None = None
        try:
            result = await llm.complete_json(
                [ChatMessage(**m) for m in part.chat],
                WRITER_SCHEMA,
                schema_name="writer_actions",
                max_tokens=budget.output_tokens,
            )
        except LLMContextOverflow as exc:
            result, truncated, error = None, exc, str(exc)
        except LLMError as exc:
            result, error = None, str(exc)
        ms = (time.perf_counter() - started) * 1000
        out.append(_server_check(llm, server))
        out.append(_context_check(llm, server, whole.tokens, len(parts), truncated))
        output = _output_check(llm, server, result, error, truncated)
        out.append(output)
        if result is not None:
            out.append(_thinking_check(llm, result.usage.thinking_tokens, settings))
        if result is not None and output.status == "ok":  # latency of a usable answer
            tokens_s = result.usage.completion_tokens / (ms / 1000) if ms > 0 else 0.0
            out.append(
                verdict(
                    "llm",
                    "latency",
                    ms < LATENCY_WARN_MS,
                    f"{ms:.0f} ms for a Writer call of ~{part.tokens} prompt tokens, "
                    f"{result.usage.completion_tokens} completion tokens ({tokens_s:.0f} tokens/s)",
                    "a slow endpoint delays the Writer, not ingestion: a smaller or quantised "
                    "model, or a GPU server (docs/guides/serving-a-writer-model.md)",
                    bad="warn",
                )
            )
    finally:
        await llm.aclose()
    return out


def _server_check(llm: OpenAICompatLLM, server: str) -> Check:
    how = "identified" if llm.auto else "SPEAKERMEM_LLM_STRUCTURED_MODE set"
    mode = llm.structured_mode if llm.mode_confirmed else f"{llm.structured_mode} (unconfirmed)"
    kind = llm.profile.kind if llm.profile is not None else "unknown"
    detail = f"{server} ({how}); structured mode {mode}"
    if kind == "unknown" and llm.auto:
        detail = f"{server}, not identified; structured mode {mode}, taken by its first call"
    return Check(area="llm", name="server", status="ok", detail=detail)


def _context_check(
    llm: OpenAICompatLLM,
    server: str,
    whole_tokens: int,
    parts: int,
    truncated: LLMContextOverflow | None,
) -> Check:
    profile = llm.profile
    ctx, source = llm.context_tokens, llm.context_source
    fix = profile.context_fix(whole_tokens) if profile is not None else ""
    if truncated is not None:
        what = "cut" if truncated.truncated else "refused"
        return Check(
            area="llm",
            name="context",
            status="fail",
            detail=f"the server {what} a Writer prompt: {truncated}; the Writer now sizes "
            f"prompts to {ctx or '?'} tokens and writes each segment in several calls",
            fix=fix,
        )
    if ctx is None:
        return Check(
            area="llm",
            name="context",
            status="warn",
            detail=f"{server} does not say its context: prompts are not sized to it (a "
            "refused or cut prompt is caught and the segment planned again, smaller)",
            fix="set SPEAKERMEM_LLM_CONTEXT_TOKENS to the model's context",
        )
    assumed = "assumed" in source
    if parts > 1 or assumed:
        split = (
            f"a 25-message segment (~{whole_tokens} tokens) is written in {parts} calls"
            if parts > 1
            else f"a 25-message segment needs ~{whole_tokens} tokens"
        )
        silently = (
            "; Ollama cuts a longer prompt without an error"
            if profile and profile.kind == "ollama"
            else ""
        )
        return Check(
            area="llm",
            name="context",
            status="warn",
            detail=f"{ctx} tokens ({source}): {split}{silently}",
            fix=fix,
        )
    return Check(
        area="llm",
        name="context",
        status="ok",
        detail=f"{ctx} tokens ({source}); a 25-message segment (~{whole_tokens} tokens) fits",
    )


def _output_check(
    llm: OpenAICompatLLM,
    server: str,
    result: LLMResult | None,
    error: str | None,
    truncated: LLMContextOverflow | None,
) -> Check:
    name = f"structured output ({llm.structured_mode})"
    if truncated is not None:
        return Check(
            area="llm",
            name=name,
            status="fail",
            detail="not judged: the answer was to a prompt the server had cut",
            fix="fix the context first (above)",
        )
    if result is None:
        return Check(
            area="llm",
            name=name,
            status="fail",
            detail=f"no answer: {error}",
            fix=_mode_fix(server),
        )
    if result.parse_error == "thinking_budget":
        return Check(
            area="llm",
            name=name,
            status="fail",
            detail="the model spent its tokens thinking and never answered",
            fix="raise SPEAKERMEM_LLM_THINKING_TOKENS, or serve the model with thinking off "
            "(docs/guides/serving-a-writer-model.md)",
        )
    try:
        actions = WriterOutput.model_validate(result.data).actions if result.data else None
    except ValidationError as exc:
        actions, error = None, f"not the Writer's schema: {exc.errors()[0]['msg']}"
    ok = actions is not None
    detail = (
        f"valid Writer JSON: {len(actions)} action(s)"
        if actions is not None
        else f"no usable Writer JSON: {(error or result.parse_error or 'empty')[:160]}"
    )
    return verdict("llm", name, ok, detail, _mode_fix(server))


def _thinking_check(llm: OpenAICompatLLM, thought: int, settings: Settings) -> Check:
    switch = llm.profile.thinking_off if llm.profile is not None else {}
    if not thought:
        how = f"; asked off with {', '.join(switch)}" if switch else ""
        return Check(area="llm", name="thinking", status="ok", detail=f"off{how}")
    return Check(
        area="llm",
        name="thinking",
        status="warn",
        detail=f"on: the model thought {thought} tokens before answering (stripped from "
        f"the answer); each call gets {settings.llm_thinking_tokens} tokens more for it",
        fix="serve the model with thinking off: vLLM / llama.cpp pass "
        "chat_template_kwargs enable_thinking=false (we send it), Ollama 0.12.4+ honours "
        "reasoning effort none; or pick an instruct model that does not think",
    )
