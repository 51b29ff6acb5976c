"""Expand along conversation structure (issue 11): reply links instead of +-1 neighbours,
the reply slot, and sessions the eval must infer (--no-sessions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speakermem.memory.datasets.friendsqa import read_friendsqa
from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.query.system1 import linked_context, reply_slots
from tests.conftest import msg, shared_file

pytestmark = pytest.mark.contract


def test_linked_context_follows_replies_then_the_parent_then_neighbours() -> None:
    parents = {10: 3, 11: 10}
    replies = {10: [11, 14]}
    around = {20: (21, 19)}
    assert linked_context([10, 20], parents, replies, around) == [11, 14, 3, 21, 19]
    assert linked_context([11], parents, replies, around) == [10]
    assert linked_context([30], parents, replies, around) == []


def test_reply_slot_moves_the_reply_up_or_brings_it_in() -> None:
    order = [1, 2, 3, 4, 5]
    assert reply_slots(order, {1: [9]}, slots=1, top_k=4) == [1, 9, 2, 3]
    # already inside the cut: left where it is
    assert reply_slots(order, {1: [3]}, slots=1, top_k=4) == [1, 2, 3, 4]
    # ranked below the cut: moved up
    assert reply_slots(order, {1: [5]}, slots=1, top_k=4) == [1, 5, 2, 3]
    assert reply_slots(order, {2: [8]}, slots=1, top_k=4) == [1, 2, 3, 4]
    assert reply_slots(order, {1: [8], 2: [9]}, slots=2, top_k=5) == [1, 8, 2, 9, 3]


SCOPE = Scope(platform="test", workspace="w1", channel="lobby")


async def _seed(engine: MemoryEngine) -> None:
    """A question answered four turns later, in a reply, while two others chat between."""
    rows = [
        ("Ann", "Where should we hold the quarterly offsite this year?", None),
        ("Cy", "did anyone see the match last night", None),
        ("Dee", "yes what a finish", None),
        ("Cy", "unbelievable last minute goal", None),
        ("Bo", "Lisbon, by the river", "m0"),
        ("Dee", "the referee was awful though", None),
    ]
    topics = ["pasta", "garden", "bikes", "jazz", "chess", "tea", "rain", "trains", "cats", "maps"]
    rows += [
        ("Cy" if i % 2 else "Dee", f"talking about {t} again", None)
        for i, t in enumerate(topics * 3)
    ]
    for i, (who, text, parent) in enumerate(rows):
        await engine.ingest(msg(SCOPE, f"m{i}", who, text, i * 0.1, reply_to=parent))
    # not embedded: only the lexical rankings find anything, so what Expand adds is visible


async def test_expand_reaches_a_reply_that_is_not_the_next_turn(engine: MemoryEngine) -> None:
    await _seed(engine)
    question = "Where should the quarterly offsite be held?"
    cfg = engine.config.recall.model_copy(update={"top_k": 3})
    linked = await RecallPipeline(engine, config=cfg).run(
        RecallRequest(question, SCOPE), answer=False
    )
    assert linked.trace.s1_evidence[0] == "m0"
    assert "m4" in linked.trace.s1_evidence
    turns = cfg.model_copy(update={"context_structure": False})
    plain = await RecallPipeline(engine, config=turns).run(
        RecallRequest(question, SCOPE), answer=False
    )
    assert "m4" not in plain.trace.s1_evidence


async def test_reply_slot_puts_the_reply_right_after_its_question(engine: MemoryEngine) -> None:
    await _seed(engine)
    cfg = engine.config.recall.model_copy(
        update={"top_k": 3, "reply_slots": 1, "context_structure": False, "context_weight": 0}
    )
    res = await RecallPipeline(engine, config=cfg).run(
        RecallRequest("Where should the quarterly offsite be held?", SCOPE), answer=False
    )
    assert res.trace.s1_evidence[:2] == ["m0", "m4"]
    no_slot = await RecallPipeline(engine, config=cfg.model_copy(update={"reply_slots": 0})).run(
        RecallRequest("Where should the quarterly offsite be held?", SCOPE), answer=False
    )
    assert "m4" not in no_slot.trace.s1_evidence


async def test_no_catch_up_means_no_inferred_graph(engine: MemoryEngine) -> None:
    await _seed(engine)
    off = engine.config.recall.model_copy(update={"interaction_catchup": 0})
    await RecallPipeline(engine, config=off).run(RecallRequest("offsite?", SCOPE), answer=False)
    assert (await engine.store.db.read("SELECT count(*) FROM message_links"))[0][0] == 0
    await RecallPipeline(engine).run(RecallRequest("offsite?", SCOPE), answer=False)
    assert (await engine.store.db.read("SELECT count(*) FROM message_links"))[0][0] > 5


# ---- --no-sessions readers -----------------------------------------------------------------


def _friends_file(tmp_path: Path) -> Path:
    scene = lambda title, lines: {  # noqa: E731
        "title": title,
        "paragraphs": [
            {
                "utterances:": [
                    {"uid": i, "speakers": [s], "utterance": t} for i, (s, t) in enumerate(lines)
                ],
                "qas": [],
            }
        ],
    }
    data = {
        "data": [
            scene("s01_e01_c01", [("Ross", "hi"), ("Monica", "hey")]),
            scene("s01_e01_c02", [("Joey", "how you doin"), ("Rachel", "fine")]),
        ]
    }
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    return path


def test_friendsqa_without_sessions_hides_markers_and_scene_gaps(tmp_path: Path) -> None:
    marked = read_friendsqa(_friends_file(tmp_path))
    hidden = read_friendsqa(_friends_file(tmp_path), sessions=False)
    assert [m.session_break for m in marked.messages] == [True, False, True, False]
    assert not any(m.session_break for m in hidden.messages)
    gaps = [
        (b.ts - a.ts).total_seconds()
        for a, b in zip(hidden.messages[:-1], hidden.messages[1:], strict=True)
    ]
    assert gaps == [30.0, 30.0, 30.0]
    assert [m.message_id for m in hidden.messages] == [m.message_id for m in marked.messages]


def test_locomo_without_sessions_keeps_times_but_drops_markers() -> None:
    path = shared_file("locomo/locomo-dev.json")
    marked, hidden = read_locomo(path), read_locomo(path, sessions=False)
    assert any(m.session_break for m in marked.messages)
    assert not any(m.session_break for m in hidden.messages)
    assert [m.ts for m in hidden.messages] == [m.ts for m in marked.messages]


# ---- sessions from structure -----------------------------------------------------------------


def test_a_reply_continues_its_session_across_the_idle_gap() -> None:
    from speakermem.memory.sessions import ChannelCursor, place_message

    cur = ChannelCursor(last_ts=0.0, session_id=3, next_turn=7)
    later = 2 * 3600.0
    assert place_message(cur, later, gap_seconds=1800).new_session
    kept = place_message(cur, later, gap_seconds=1800, continues=True)
    assert (kept.new_session, kept.session_id, kept.turn_index) == (False, 3, 7)
    # too late even for a reply, and an explicit break always wins
    assert place_message(cur, 2 * 86400.0, gap_seconds=1800, continues=True).new_session
    assert place_message(cur, 60.0, gap_seconds=1800, force_break=True, continues=True).new_session


async def test_store_keeps_a_late_thread_reply_in_its_session(engine: MemoryEngine) -> None:
    await engine.ingest(msg(SCOPE, "a", "Ann", "Who owns the release checklist?", 0))
    await engine.ingest(msg(SCOPE, "b", "Bo", "unrelated chat", 1))
    await engine.ingest(msg(SCOPE, "c", "Cy", "I do, updated it", 120, thread_id="a"))
    await engine.ingest(msg(SCOPE, "d", "Dee", "morning all", 200))
    got = await engine.store.messages.by_ids(SCOPE, ["a", "b", "c", "d"])
    assert got["c"].session_id == got["a"].session_id
    assert got["c"].turn_index == 2
    assert got["d"].session_id == got["a"].session_id + 1  # the gap still splits the rest
