"""The interaction graph (issue 11): who spoke to whom, how it was found, and reply links;
the pure inference, the store pass, and the relation ranking.

A contract module: every test runs over both store backends (the pure inference tests
simply run twice)."""

from __future__ import annotations

import pytest

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.interactions import NameIndex, Turn, infer, interaction_names, vocatives
from speakermem.memory.models import RosterMember, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from tests.conftest import msg

pytestmark = pytest.mark.contract

NAMES = NameIndex.build(
    [
        ("ross", "Ross Geller", ()),
        ("mon", "Monica", ("Mon",)),
        ("zed", "zed_42", ()),
        ("rach", "Rachel", ()),
    ]
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ross, can you pass the salt?", [("ross", "vocative")]),
        ("hey Monica how was work", [("mon", "vocative")]),
        ("That was great, Ross!", [("ross", "vocative")]),
        ("Monica!", [("mon", "vocative")]),
        ("Ross the van is here", [("ross", "name_start")]),
        ("@zed_42 the build is red", [("zed", "name_start")]),
        ("I told Ross about it yesterday", []),
        ("the ross thing again", []),  # lower case, mid-sentence: not a name
    ],
)
def test_vocatives(text: str, expected: list[tuple[str, str]]) -> None:
    assert vocatives(text, NAMES) == expected


def _turns(*rows: tuple[str, str], gap: float = 30.0) -> list[Turn]:
    return [
        Turn(pk=i + 1, speaker_id=s, text=t, ts=i * gap, session_id=1, message_id=f"m{i + 1}")
        for i, (s, t) in enumerate(rows)
    ]


def test_addressees_carry_how_they_were_found() -> None:
    turns = _turns(
        ("rach", "Anyone seen my keys?"),
        ("mon", "Rachel, they are on the counter."),
        ("ross", "Monica the van is here"),
    )
    tagged = Turn(
        pk=4, speaker_id="zed", text="+1", ts=100, session_id=1, addressees=("rach", "zed")
    )
    out = {i.pk: dict(i.addressees) for i in infer([*turns, tagged], NAMES)}
    assert out[2] == {"rach": "vocative"}
    assert out[3] == {"mon": "name_start"}  # Monica spoke just before: a name opening a reply
    assert out[4] == {"rach": "platform"}  # the platform's tags, minus the speaker


def test_name_start_needs_the_person_to_have_spoken_recently() -> None:
    out = infer(_turns(("mon", "hi all"), ("ross", "Rachel called earlier")), NAMES)
    assert dict(out[1].addressees) == {}


def test_two_person_stretch_gives_adjacency_and_a_third_voice_breaks_it() -> None:
    turns = _turns(
        ("ross", "so what happened"),
        ("mon", "long story"),
        ("ross", "tell me"),
        ("mon", "fine, the oven broke"),
        ("rach", "which oven"),
    )
    out = infer(turns, NAMES)
    assert dict(out[3].addressees) == {"ross": "adjacency"}
    assert out[4].addressees == ()


def test_reply_parent_explicit_addressed_overlap_and_previous() -> None:
    turns = _turns(
        ("rach", "Who wants to see the new dinosaur exhibit on Saturday?"),
        ("mon", "I am baking all weekend"),
        ("ross", "the dinosaur exhibit opens Saturday, I can get tickets"),
        ("rach", "Monica, what are you baking?"),
        ("zed", "ok"),
    )
    explicit = Turn(pk=6, speaker_id="mon", text="cookies", ts=200, session_id=1, reply_to="m4")
    out = {i.pk: i for i in infer([*turns, explicit], NAMES)}
    assert (out[2].parent, out[2].parent_how) == (1, "previous")
    assert (out[3].parent, out[3].parent_how) == (1, "overlap")  # skips the unrelated turn
    assert (out[4].parent, out[4].parent_how) == (2, "addressed")  # Monica's last turn
    assert (out[5].parent, out[5].parent_how) == (4, "previous")
    assert (out[6].parent, out[6].parent_how) == (4, "explicit")
    assert dict(out[6].addressees) == {"rach": "reply"}
    assert out[1].parent is None


def test_no_inferred_parent_across_an_idle_gap() -> None:
    out = infer(_turns(("ross", "hi"), ("mon", "hello"), gap=3 * 3600), NAMES)
    assert out[1].parent is None


def test_handles_and_aliases_are_names() -> None:
    idx = interaction_names([RosterMember(user_id="n", display_name="Night-Owl", aliases=("Owl",))])
    assert vocatives("Owl, you up?", idx) == [("n", "vocative")]
    assert vocatives("Night-Owl, you up?", idx) == [("n", "vocative")]


# ---- store pass and relation ranking -------------------------------------------------------


@pytest.fixture
def friends() -> Scope:
    return Scope(platform="test", workspace="w1", channel="friends")


async def _seed(engine: MemoryEngine, scope: Scope) -> None:
    rows = [
        ("Rachel", "I need a new job, the coffee house is killing me"),
        ("Ross", "Rachel, have you thought about fashion?"),
        ("Rachel", "Fashion is all I think about"),
        ("Monica", "Ross, did you feed the monkey?"),
        ("Ross", "Marcel ate a banana"),
        ("Joey", "fashion shows have free food"),
        ("Ross", "Monica, the lasagna tasted of fashion magazines"),
        ("Rachel", "Ross that is a weird thing to say"),
    ]
    for i, (who, text) in enumerate(rows):
        await engine.ingest(msg(scope, f"m{i}", who, text, i * 0.5))
    await engine.embed_pending()


async def test_store_pass_records_addressees_links_and_a_cursor(
    engine: MemoryEngine, friends: Scope
) -> None:
    await _seed(engine, friends)
    (pk,) = await engine.channel_pks([friends])
    names = interaction_names(await engine.members(friends))
    assert await engine.store.interactions.update(pk, names) == 8
    assert await engine.store.interactions.update(pk, names) == 0  # cursor: read once
    by_id = await engine.store.messages.by_ids(friends, [f"m{i}" for i in range(8)])
    pks = {mid: m.pk for mid, m in by_id.items()}
    got = await engine.store.interactions.addressees(list(pks.values()))
    assert got[pks["m1"]] == [("rachel", "vocative")]
    assert got[pks["m7"]] == [("ross", "name_start")]
    parents = await engine.store.interactions.parents([pks["m2"]])
    assert parents[pks["m2"]] == (pks["m1"], "previous")
    # a later message is read by the next pass, with the earlier turns as context
    await engine.ingest(msg(friends, "m8", "Monica", "Rachel, want my old job?", 5))
    assert await engine.store.interactions.update(pk, names) == 1
    (m8,) = (await engine.store.messages.by_ids(friends, ["m8"])).values()
    assert (await engine.store.interactions.addressees([m8.pk]))[m8.pk] == [("rachel", "vocative")]


async def test_relation_question_ranks_what_x_said_to_y(
    engine: MemoryEngine, friends: Scope
) -> None:
    await _seed(engine, friends)
    pipeline = RecallPipeline(engine)
    on = await pipeline.run(
        RecallRequest(question="What did Ross tell Monica about fashion?", scope=friends),
        answer=False,
    )
    assert on.trace.projection["addressee"] == "monica"
    assert on.trace.rankings.get("relation", 0) >= 1
    assert on.trace.s1_evidence[0] == "m6"  # Ross -> Monica, not Ross -> Rachel (m1)
    off = RecallPipeline(
        engine, config=engine.config.recall.model_copy(update={"relation_weight": 0})
    )
    res = await off.run(
        RecallRequest(question="What did Ross tell Monica about fashion?", scope=friends),
        answer=False,
    )
    assert "relation" not in res.trace.rankings


async def test_removing_a_message_row_drops_its_links(engine: MemoryEngine, friends: Scope) -> None:
    await _seed(engine, friends)
    (pk,) = await engine.channel_pks([friends])
    await engine.store.interactions.update(pk, interaction_names(await engine.members(friends)))
    (m1,) = (await engine.store.messages.by_ids(friends, ["m1"])).values()
    assert await engine.store.interactions.replies([m1.pk])
    async with engine.store.db.transaction() as tx:
        await tx.execute("DELETE FROM message_vectors WHERE id = ?", (m1.pk,))
        await tx.execute("DELETE FROM messages WHERE id = ?", (m1.pk,))
    assert await engine.store.interactions.replies([m1.pk]) == {}
    assert await engine.store.interactions.addressees([m1.pk]) == {}
    assert await engine.store.interactions.parents([m1.pk]) == {}


async def test_a_deleted_message_row_takes_its_vectors_along_on_postgres(
    engine: MemoryEngine, friends: Scope, backend: str
) -> None:
    """PostgreSQL enforces the vectors' references to messages(id): deleting the row alone
    (by hand, a later cleanup) removes its dense index rows with it instead of failing."""
    if backend != "postgres":
        pytest.skip("SQLite's vec0 table holds no reference to enforce or cascade")
    await _seed(engine, friends)
    (pk,) = await engine.channel_pks([friends])
    await engine.store.interactions.update(pk, interaction_names(await engine.members(friends)))
    (m1,) = (await engine.store.messages.by_ids(friends, ["m1"])).values()
    tables = {"messages_vec": "rowid", "messages_bits": "rowid", "message_vectors": "id"}

    async def held() -> dict[str, int]:
        return {
            t: (await engine.store.db.read(f"SELECT count(*) FROM {t} WHERE {c} = ?", (m1.pk,)))[0][
                0
            ]
            for t, c in tables.items()
        }

    assert await held() == dict.fromkeys(tables, 1)
    async with engine.store.db.transaction() as tx:
        await tx.execute("DELETE FROM messages WHERE id = ?", (m1.pk,))
    assert await held() == dict.fromkeys(tables, 0)
    assert await engine.store.interactions.parents([m1.pk]) == {}
    assert await engine.store.messages.by_ids(friends, ["m1"]) == {}
    # the other messages keep theirs
    (count,) = (await engine.store.db.read("SELECT count(*) FROM messages_vec"))[0]
    assert count == 7


async def test_writer_prompt_marks_addressees_with_how_and_the_turn_answered(
    engine: MemoryEngine, friends: Scope
) -> None:
    from speakermem.memory.writer.prompt import (
        WRITER_PROMPT_VERSION,
        SegmentLinks,
        render_writer_messages,
    )

    await _seed(engine, friends)
    (pk,) = await engine.channel_pks([friends])
    roster = await engine.members(friends)
    await engine.store.interactions.update(pk, interaction_names(roster))
    segment = list((await engine.store.messages.by_ids(friends, ["m0", "m1", "m2"])).values())
    segment.sort(key=lambda m: m.turn_index)
    ids = [m.pk for m in segment]
    parents = await engine.store.interactions.parents(ids)
    links = SegmentLinks(
        addressees=await engine.store.interactions.addressees(ids),
        parents={k: p for k, (p, _) in parents.items()},
    )
    chat, _ = render_writer_messages(roster, [], segment, budget=4, links=links)
    user = chat[1]["content"]
    assert "m2 [" in user and "Ross (ross) [answers m1; to Rachel (rachel) (by name)]" in user
    assert "[answers m2" in user  # Rachel's reply answers Ross
    plain, _ = render_writer_messages(roster, [], segment, budget=4)
    assert "answers" not in plain[1]["content"]
    assert WRITER_PROMPT_VERSION == "writer-v3"
