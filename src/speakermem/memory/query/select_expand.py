"""System 1 after the pool (SPEC §5.2): Select, the optional ASK, Expand, the top-k evidence.

**Select** ranks the pool by necessity (the LLM, `memory.query.select`; without one, or on
an unusable reply, the fused order) and names the anchors whose neighbours Expand adds.
**ASK** (off by default): if the LLM judges the top-k insufficient, its one extra search
term queries one more pool, fused with the selection. **Expand** puts each anchor's
neighbouring turns right after it; then the first picks' replies get slots
(`reply_slots`), and the evidence is cut to top-k. The ordering rules are pure functions
in `memory.query.system1`; this module fetches the turns they need.
"""

from __future__ import annotations

from speakermem.memory.config import RecallConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import StoredMessage
from speakermem.memory.ports import LLM
from speakermem.memory.query.pool import Pool
from speakermem.memory.query.projection import Projection
from speakermem.memory.query.select import (
    SELECT_SCHEMA,
    SUFFICIENCY_SCHEMA,
    parse_select,
    parse_sufficiency,
    render_select_messages,
    render_sufficiency_messages,
)
from speakermem.memory.query.system1 import (
    Rankings,
    expand_order,
    fuse,
    recall_rankings,
    reply_slots,
)
from speakermem.memory.query.timewords import TimeWindow
from speakermem.memory.query.trace import RecallTrace, llm_json


async def select_and_expand(
    engine: MemoryEngine,
    cfg: RecallConfig,
    llm: LLM | None,
    trace: RecallTrace,
    question: str,
    projection: Projection,
    pool: Pool,
    pks: list[int],
    window: TimeWindow | None,
    names: frozenset[str],
) -> list[StoredMessage]:
    """The top-k verbatim evidence from the pool, in evidence order."""
    messages = pool.messages
    order, anchors = await select(cfg, llm, trace, question, pool.pks, messages)
    if cfg.ask and llm is not None:
        top = [messages[pk] for pk in order[: cfg.top_k] if pk in messages]
        data = await llm_json(
            llm,
            trace,
            "sufficiency",
            render_sufficiency_messages(question, top),
            SUFFICIENCY_SCHEMA,
            128,
        )
        term = parse_sufficiency(data)
        if term:
            trace.ask = term
            more = await recall_rankings(
                engine,
                f"{question} {term}",
                projection,
                pks,
                pool=cfg.pool,
                window=window,
                extra_terms=[term],
                name_terms=names,
            )
            merged = Rankings({"first": order, **{f"ask_{k}": v for k, v in more.lists.items()}})
            order = [pk for pk, _ in fuse(merged, k0=cfg.rrf_k0, weights={"first": 2.0})][
                : cfg.pool
            ]
            messages.update(await engine.store.messages.get_many(order))
            anchors = [pk for pk in anchors if pk in order]
    neighbours: dict[int, list[int]] = {}
    if cfg.expand_radius > 0:
        for pk in anchors:
            msg = messages.get(pk)
            if msg is None:
                continue
            around = await engine.store.messages.neighbours(msg, cfg.expand_radius)
            for m in around:
                messages.setdefault(m.pk, m)
            neighbours[pk] = [m.pk for m in around if m.pk != pk]
    ordered = [pk for pk in order if pk not in anchors]
    final = expand_order(
        anchors + ordered, neighbours, anchors=len(anchors), top_k=cfg.top_k + cfg.reply_slots
    )
    if cfg.reply_slots > 0 and final:
        linked = await engine.store.interactions.replies(final[: cfg.reply_slots])
        replies = {pk: [c for c, _ in kids] for pk, kids in linked.items()}
        firsts = [kids[0] for kids in replies.values() if kids]
        messages.update(await engine.store.messages.get_many(firsts))
        final = reply_slots(final, replies, slots=cfg.reply_slots, top_k=cfg.top_k)
    final = final[: cfg.top_k]
    trace.anchors = [messages[pk].message_id for pk in anchors if pk in messages]
    return [messages[pk] for pk in final if pk in messages]


async def select(
    cfg: RecallConfig,
    llm: LLM | None,
    trace: RecallTrace,
    question: str,
    fused: list[int],
    messages: dict[int, StoredMessage],
) -> tuple[list[int], list[int]]:
    """(ordered pks, anchor pks): the LLM's necessity ranking or the fused order."""
    if llm is not None and fused:
        cands = [messages[pk] for pk in fused if pk in messages]
        data = await llm_json(
            llm, trace, "select", render_select_messages(question, cands), SELECT_SCHEMA
        )
        parsed = parse_select(data, len(cands))
        if parsed is not None:
            ranking, expand = parsed
            trace.select = "llm"
            order = [cands[i].pk for i in ranking]
            rest = [c.pk for c in cands if c.pk not in order]
            return order + rest, [cands[i].pk for i in expand][: cfg.expand_anchors]
        trace.select = "fused (llm reply unusable)"
    return fused, fused[: cfg.fallback_expand_anchors]
