"""One segment's Writer calls: sized to the endpoint, paced, validated, merged.

The runner decides what to write and commits; this module turns a segment's messages into
validated actions. It asks the LLM for the endpoint's limits (context, parallel slots,
thinking budget), plans the prompts to fit (memory/writer/sizing.py), makes the calls
through the pacer's slots' latency signal, and validates each part against its own refs.

A prompt the server cut or refused (`LLMContextOverflow`) is never used: the adapter has
learned the smaller context by then, so the segment is planned again, smaller, and asked
again; after MAX_REPLANS the error goes to the runner, which defers the segment.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from speakermem.memory.config import WriterConfig
from speakermem.memory.context_budget import EndpointLimits, endpoint_limits, prompt_budget
from speakermem.memory.models import DerivedRecord, RosterMember, StoredMessage
from speakermem.memory.ports import (
    LLM,
    ChatMessage,
    LLMBadOutput,
    LLMContextOverflow,
    LLMUnavailable,
)
from speakermem.memory.writer.pacing import Pacer
from speakermem.memory.writer.prompt import WRITER_SCHEMA, SegmentLinks
from speakermem.memory.writer.sizing import PromptPart, SizingNotes, merge_reports, plan_prompts
from speakermem.memory.writer.validate import ValidationReport

MAX_REPLANS = 2
"""Times a segment is planned again after its prompt did not fit, before it is deferred."""
SHRINK_WITHOUT_HINT = 0.75
"""A refused prompt without a context in the error: plan for this share of the last one."""

Validate = Callable[[PromptPart, Any, str | None], Awaitable[ValidationReport]]


@dataclass
class Derivation:
    """The merged report of a segment and what its calls cost."""

    report: ValidationReport = field(default_factory=ValidationReport)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    thinking_tokens: int = 0
    calls: int = 0
    replans: int = 0
    sizing: SizingNotes = field(default_factory=SizingNotes)
    overflow: str = ""
    """The last prompt that did not fit (the error's text), when one did not."""

    def overflow_note(self) -> str:
        return (
            f"written after {self.replans} prompt(s) did not fit ({self.overflow[:160]}); "
            f"{self.sizing.parts} call(s) sized to the smaller context"
        )


class SegmentWriter:
    """Plans, asks and validates; raises the LLM's errors for the runner to handle."""

    def __init__(self, llm: LLM, cfg: WriterConfig, pacer: Pacer) -> None:
        self.llm = llm
        self.cfg = cfg
        self.pacer = pacer
        self._capped = False

    async def limits(self) -> EndpointLimits:
        limits = await endpoint_limits(self.llm)
        if limits.parallel and not self._capped:
            self.pacer.cap(limits.parallel)  # the server serves no more than this at once
            self._capped = True
        return limits

    async def derive(
        self,
        roster: Sequence[RosterMember],
        heads: Sequence[DerivedRecord],
        messages: Sequence[StoredMessage],
        links: SegmentLinks | None,
        validate: Validate,
        spent: Derivation | None = None,
    ) -> Derivation:
        """Actions for `messages`; `spent` (given) accumulates the cost even when this
        raises, so a deferred segment's run log still shows the tokens it used."""
        out = spent if spent is not None else Derivation()
        limits = await self.limits()
        while True:
            budget = prompt_budget(limits, self.cfg.max_tokens)
            parts, out.sizing = plan_prompts(
                roster, heads, messages, links=links, budget=budget, cfg=self.cfg
            )
            try:
                reports = [await self._part(p, budget.output_tokens, validate, out) for p in parts]
            except LLMContextOverflow as exc:
                out.prompt_tokens += exc.usage.prompt_tokens
                out.completion_tokens += exc.usage.completion_tokens
                out.overflow = str(exc)
                if out.replans >= MAX_REPLANS:
                    raise
                out.replans += 1
                limits = await self._smaller(limits, exc)
                continue
            out.report = merge_reports(reports)
            return out

    async def _smaller(self, before: EndpointLimits, exc: LLMContextOverflow) -> EndpointLimits:
        """The limits after a prompt did not fit: what the LLM learned, else a guess below
        the last plan (a fake or a server that names no number)."""
        after = await self.limits()
        old, new = before.context_tokens, after.context_tokens
        if new is not None and (old is None or new < old):
            return after
        basis = exc.context_tokens or old
        if basis is None:
            return after
        return replace(after, context_tokens=int(basis * SHRINK_WITHOUT_HINT))

    async def _part(
        self, part: PromptPart, max_tokens: int, validate: Validate, out: Derivation
    ) -> ValidationReport:
        started = time.perf_counter()
        try:
            result = await self.llm.complete_json(
                [ChatMessage(**m) for m in part.chat],
                WRITER_SCHEMA,
                schema_name="writer_actions",
                max_tokens=max_tokens,
            )
        except LLMUnavailable as exc:
            await self.pacer.observe(time.perf_counter() - started, overloaded=exc.overloaded)
            raise
        except LLMBadOutput as exc:  # the endpoint answered, with something unusable
            await self.pacer.observe(time.perf_counter() - started)
            out.calls += 1
            return await validate(part, None, f"bad response: {exc}")
        await self.pacer.observe(time.perf_counter() - started)
        out.calls += 1
        out.prompt_tokens += result.usage.prompt_tokens
        out.completion_tokens += result.usage.completion_tokens
        out.thinking_tokens += result.usage.thinking_tokens
        return await validate(part, result.data, result.parse_error)
