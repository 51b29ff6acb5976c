"""Answer (SPEC §5.5): the reply to a pack, with its citations checked and linked.

With an LLM, the answerer writes from the pack alone (`memory.query.answer`'s prompt);
its citations must point into the pack, and a reply that cites nothing falls back to the
extractive one, as does any failure. With `check_claims`, each claim of the LLM's reply is
checked against what it cites (`memory.query.claims`). The pack's budgets are sized first,
so the answer prompt fits the endpoint's context (`memory.context_budget`).
"""

from __future__ import annotations

from speakermem.memory.config import RecallConfig
from speakermem.memory.context_budget import (
    approx_tokens,
    endpoint_limits,
    prompt_budget,
    scaled_budgets,
)
from speakermem.memory.ports import LLM, ChatMessage, LLMError
from speakermem.memory.query.answer import (
    ANSWER_SYSTEM,
    ExtractiveReason,
    RecallAnswer,
    check_citations,
    citations_for,
    extractive_answer,
    render_answer_messages,
)
from speakermem.memory.query.claims import check_claims
from speakermem.memory.query.compose import EvidencePack
from speakermem.memory.query.links import LinkResolver
from speakermem.memory.query.trace import RecallTrace

ANSWER_FRAME_TOKENS = 40
"""The answer prompt's wrapper around the pack and the question (tags, the closing ask)."""


async def pack_budgets(
    llm: LLM | None, cfg: RecallConfig, question: str, answer: bool
) -> tuple[int, int]:
    """The evidence pack's budgets, shrunk in proportion when the answer prompt would
    not fit the LLM's context (memory/context_budget.py)."""
    budgets = [cfg.s1_pack_tokens, cfg.s2_pack_tokens]
    if not answer or llm is None:
        return budgets[0], budgets[1]
    room = prompt_budget(await endpoint_limits(llm), cfg.answer_max_tokens)
    if room.input_tokens is not None:
        fixed = approx_tokens(ANSWER_SYSTEM) + approx_tokens(question) + ANSWER_FRAME_TOKENS
        budgets = scaled_budgets(budgets, room.input_tokens - fixed)
    return budgets[0], budgets[1]


async def answer_pack(
    llm: LLM | None,
    cfg: RecallConfig,
    link: LinkResolver,
    pack: EvidencePack,
    trace: RecallTrace,
    note: str | None = None,
    locale: str | None = None,
) -> RecallAnswer:
    """The LLM's cited answer to the pack, or the extractive one (framed in the asker's
    `locale`); citations linked."""
    text: str | None = None
    used_llm = False
    reason: ExtractiveReason | None = "no_llm" if llm is None else "llm_empty"
    if llm is not None:
        try:
            result = await llm.complete_text(
                [ChatMessage(**m) for m in render_answer_messages(pack, note)],
                max_tokens=cfg.answer_max_tokens,
            )
            trace.tokens["answer_prompt"] = result.usage.prompt_tokens
            trace.tokens["answer_completion"] = result.usage.completion_tokens
            if result.raw_text.strip():
                text, used_llm, reason = result.raw_text.strip(), True, None
        except LLMError as exc:
            trace.llm_errors.append(f"answer: {exc}")
            reason = "llm_failed"
    if text is None:
        text = extractive_answer(pack, locale=locale)
    cleaned, used, stripped = check_citations(text, pack)
    if used_llm and not used and pack.excerpts:
        # an uncited LLM reply cannot be checked: fall back to the extractive one
        trace.llm_errors.append("answer: reply had no valid citations")
        cleaned, used, stripped2 = check_citations(extractive_answer(pack, locale=locale), pack)
        stripped += stripped2
        used_llm, reason = False, "uncited"
    if used_llm and cfg.check_claims:
        report = check_claims(cleaned, pack)
        trace.claims = {
            "checked": report.checked,
            "dropped": report.dropped,
            "rewritten": report.rewritten,
            "misattributed": report.misattributed,
            "abstained": int(report.abstained),
        }
        trace.dropped_claims = [c.claim.text[:120] for c in report.claims if c.verdict == "dropped"]
        cleaned, used, _ = check_citations(report.text, pack)
    citations = citations_for(pack, used)
    for c in citations:
        excerpt = pack.excerpt(c.n)
        c.link = link(c.scope, c.message_id, excerpt.thread_id if excerpt else None)
    return RecallAnswer(
        text=cleaned,
        citations=citations,
        used_llm=used_llm,
        stripped_citations=stripped,
        extractive_reason=reason,
        locale=locale,
    )
