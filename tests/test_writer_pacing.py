"""The Writer's adaptive concurrency (memory/writer/pacing.py) and prompt sizing
(memory/writer/sizing.py, memory/context_budget.py), as pure decisions."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from speakermem.memory.config import WriterConfig
from speakermem.memory.context_budget import (
    EndpointLimits,
    PromptBudget,
    chat_tokens,
    prompt_budget,
    scaled_budgets,
)
from speakermem.memory.models import (
    DerivedRecord,
    Layer,
    RecordScope,
    RecordState,
    RosterMember,
    Scope,
    StoredMessage,
)
from speakermem.memory.writer.pacing import ConcurrencyController, Pacer
from speakermem.memory.writer.sizing import merge_reports, plan_prompts
from speakermem.memory.writer.validate import AcceptedAction, RejectReason, ValidationReport
from tests.conftest import T0

# ---- pacing ----------------------------------------------------------------------------------


def run_round(c: ConcurrencyController, latency: float, *, saturated: bool = True) -> None:
    """One round: as many calls as the limit, all waited for a slot when `saturated`."""
    if saturated:
        c.saturated()
    for _ in range(c.limit):
        c.observe(latency)


def test_the_limit_climbs_while_latency_holds_and_work_waits() -> None:
    c = ConcurrencyController(2, 32)
    seen = [c.limit]
    for _ in range(20):
        run_round(c, 1.0)
        seen.append(c.limit)
    assert seen[:6] == [2, 4, 8, 16, 32, 32]  # slow start: doubling, up to the ceiling
    assert c.limit == 32  # never beyond
    assert seen == sorted(seen)


def test_after_backing_off_the_climb_is_by_a_quarter() -> None:
    c = ConcurrencyController(16, 64)
    c.observe(1.0, overloaded=True)  # 16 -> 8, and slow start ends
    seen = [c.limit]
    for _ in range(4):
        run_round(c, 1.0)
        seen.append(c.limit)
    assert seen == [8, 10, 12, 15, 18]


def test_no_climb_without_waiting_work() -> None:
    c = ConcurrencyController(2, 32)
    for _ in range(10):
        run_round(c, 1.0, saturated=False)
    assert c.limit == 2  # more slots would not be used


def test_rising_latency_lowers_it_and_a_429_halves_it() -> None:
    c = ConcurrencyController(2, 32)
    for _ in range(12):
        run_round(c, 1.0)
    high = c.limit
    run_round(c, 1.0 * 1.5 + 0.1)  # the endpoint started queueing
    assert c.limit == high - max(1, high // 4)
    before = c.limit
    c.observe(0.2, overloaded=True)
    assert c.limit == before // 2
    for _ in range(10):
        c.observe(0.1, overloaded=True)
    assert c.limit == 1  # never below one


def test_jitter_of_milliseconds_is_not_rising_latency() -> None:
    c = ConcurrencyController(4, 32)
    run_round(c, 0.005)
    run_round(c, 0.012)  # 2.4x the best, but 7 ms: not queueing
    assert c.limit > 4


def test_a_ceiling_equal_to_the_start_fixes_the_limit() -> None:
    c = ConcurrencyController(3, 3)
    run_round(c, 1.0)
    run_round(c, 5.0)
    c.observe(1.0, overloaded=True)
    assert c.limit == 3


async def test_pacer_holds_calls_to_its_limit_and_a_server_cap() -> None:
    pacer = Pacer(2, 8)
    peak = 0

    async def call() -> None:
        nonlocal peak
        async with pacer.slot():
            peak = max(peak, pacer.in_flight)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(call() for _ in range(6)))
    assert peak == 2 and pacer.in_flight == 0
    assert pacer.controller.best is None  # nothing observed: no latency yet
    pacer.cap(1)  # llama.cpp says one slot
    assert pacer.limit == 1 and pacer.controller.ceiling == 1


# ---- sizing -----------------------------------------------------------------------------------

SCOPE = Scope(platform="test", workspace="w", channel="c")


def messages(n: int, chars: int = 160) -> list[StoredMessage]:
    return [
        StoredMessage(
            pk=i + 1,
            scope=SCOPE,
            message_id=f"m-{i}",
            thread_id=None,
            speaker_id=f"u{i % 3}",
            speaker_name=f"User{i % 3}",
            text=(f"message {i} " + "word " * chars)[:chars],
            ts=T0 + timedelta(minutes=i),
            session_id=1,
            turn_index=i,
            reply_to=None,
            addressees=(),
            edited_at=None,
        )
        for i in range(n)
    ]


ROSTER = [RosterMember(user_id=f"u{i}", display_name=f"User{i}") for i in range(40)]
HEAD = DerivedRecord(
    id=1,
    scope=SCOPE,
    layer=Layer.CORE,
    record_scope=RecordScope.PERSON,
    content="User0 lives in Lisbon.",
    source="u0",
    owner="u0",
    event="home",
    time=T0,
    session_id=1,
    state=RecordState.ACTIVE,
    from_ids=("old",),
    chain_root=1,
    writer_model="t",
    prompt_version="t",
)


def test_prompt_budget_keeps_room_for_the_answer_and_the_thinking() -> None:
    assert prompt_budget(EndpointLimits(), 2048) == PromptBudget(2048, None)
    big = prompt_budget(EndpointLimits(context_tokens=32768, thinking_tokens=1024), 2048)
    assert big.output_tokens == 3072 and big.input_tokens == int((32768 - 3072) * 0.9)
    small = prompt_budget(EndpointLimits(context_tokens=2048), 2048)
    assert small.output_tokens == 512 and small.input_tokens == int(1536 * 0.9)
    assert prompt_budget(EndpointLimits(context_tokens=600), 2048).output_tokens == 256
    assert scaled_budgets([1500, 1300], 1400) == [750, 650]
    assert scaled_budgets([1500, 1300], None) == [1500, 1300]


def test_a_segment_that_fits_is_one_prompt() -> None:
    cfg = WriterConfig()
    parts, notes = plan_prompts(
        ROSTER, [HEAD], messages(25), links=None, budget=PromptBudget(2048, None), cfg=cfg
    )
    assert len(parts) == 1 and notes.parts == 1
    assert "User39" in parts[0].chat[1]["content"]  # the whole roster, as always
    assert parts[0].refs["m25"] == "m-24"


@pytest.mark.parametrize("context", [2048, 3072, 4096])
def test_a_segment_too_long_for_the_context_splits_into_parts_that_fit(context: int) -> None:
    cfg = WriterConfig()
    segment = messages(25)
    budget = prompt_budget(EndpointLimits(context_tokens=context), cfg.max_tokens)
    parts, notes = plan_prompts(ROSTER, [HEAD], segment, links=None, budget=budget, cfg=cfg)
    assert all(budget.fits(p.tokens) for p in parts)
    assert all(p.tokens == chat_tokens(p.chat) for p in parts)
    covered = [m.message_id for p in parts for m in p.messages]
    assert covered == [m.message_id for m in segment]  # every message, once, in order
    whole = plan_prompts(ROSTER, [HEAD], segment, links=None, budget=PromptBudget(1, None), cfg=cfg)
    if budget.fits(whole[0][0].tokens):  # 4096: the whole segment fits, as it is
        assert len(parts) == 1 and not notes.roster_narrowed
        return
    assert notes.roster_narrowed  # 40 members, 3 of them speak
    assert "User39" not in parts[0].chat[1]["content"]
    if context == 2048:
        assert len(parts) > 1 and notes.notes


def test_a_message_longer_than_a_part_is_shortened_in_the_prompt_only() -> None:
    cfg = WriterConfig()
    segment = messages(3, chars=40) + messages(1, chars=6000)[0:1]
    segment[-1] = segment[-1].model_copy(update={"pk": 99, "message_id": "long"})
    budget = prompt_budget(EndpointLimits(context_tokens=2048), cfg.max_tokens)
    parts, notes = plan_prompts(ROSTER[:3], [], segment, links=None, budget=budget, cfg=cfg)
    assert notes.shortened == 1 and all(budget.fits(p.tokens) for p in parts)
    last = parts[-1]
    assert last.messages[-1].text == segment[-1].text  # validation sees the real message
    assert "…" in last.chat[1]["content"]


def test_merged_parts_drop_what_a_later_part_repeats() -> None:
    (msg,) = messages(1)

    def add(i: int, content: str) -> AcceptedAction:
        return AcceptedAction(
            index=i,
            kind="ADD",
            layer=Layer.CORE,
            record_scope=RecordScope.PERSON,
            source="u0",
            owner="u0",
            content=content,
            event="",
            cited=(msg,),
        )

    first = ValidationReport(accepted=[add(0, "User0 moved to Porto.")], proposed=1)
    second = ValidationReport(
        accepted=[add(0, "User0 moved to Porto"), add(1, "User0 has a dog.")], proposed=2
    )
    merged = merge_reports([first, second])
    assert [a.content for a in merged.accepted] == ["User0 moved to Porto.", "User0 has a dog."]
    assert merged.proposed == 3
    assert [(r.index, r.reason) for r in merged.rejected] == [(1, RejectReason.DUPLICATE_IN_BATCH)]
