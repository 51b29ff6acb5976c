"""Writer output validation: one reason code per rejected action, valid actions survive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from speakermem.memory.models import (
    GROUP,
    DerivedRecord,
    Layer,
    RecordScope,
    RecordState,
    RosterMember,
    Scope,
    StoredMessage,
)
from speakermem.memory.writer.gate import EvidenceGate
from speakermem.memory.writer.validate import (
    BATCH_INDEX,
    RejectReason,
    ValidationContext,
    build_name_index,
    channel_key,
    normalize_content,
    parse_writer_output,
    proposed_contents,
    validate_actions,
)

SCOPE = Scope(platform="discord", workspace="g1", channel="c1")
OTHER = Scope(platform="discord", workspace="g1", channel="c2")
T0 = datetime(2024, 5, 7, 14, 0, tzinfo=UTC)

ROSTER = [
    RosterMember(user_id="U1", display_name="Alice"),
    RosterMember(user_id="U2", display_name="Bob"),
    RosterMember(user_id="U3", display_name="Carol", aliases=("Caz",)),
]


def msg(pk: int, speaker: str, name: str, text: str, **kw) -> StoredMessage:
    return StoredMessage(
        pk=pk,
        scope=kw.pop("scope", SCOPE),
        message_id=f"mid{pk}",
        thread_id=None,
        speaker_id=speaker,
        speaker_name=name,
        text=text,
        ts=T0 + timedelta(minutes=pk),
        session_id=kw.pop("session_id", 7),
        turn_index=pk,
        reply_to=kw.pop("reply_to", None),
        addressees=kw.pop("addressees", ()),
        edited_at=None,
    )


SEGMENT = [
    msg(1, "U1", "Alice", "I adopted a grey cat named Pixel last weekend"),
    msg(2, "U2", "Bob", "I'm moving to Berlin in June for a new job at a robotics startup"),
    msg(3, "U3", "Carol", "Let's agree: the team standup moves to 10am on Mondays", addressees=()),
    msg(4, "U2", "Bob", "Agreed, standup at 10am Mondays works for me", reply_to="mid3"),
    msg(5, "U1", "Alice", "Actually I now work at the robotics startup too, started in May"),
]
REF_MAP = {f"m{i}": m for i, m in enumerate(SEGMENT, start=1)}


def record(rid: int, layer: Layer, owner: str, source: str, content: str, **kw) -> DerivedRecord:
    scope_ = RecordScope.GROUP if owner == GROUP else RecordScope.PERSON
    return DerivedRecord(
        id=rid,
        scope=kw.pop("scope", SCOPE),
        layer=layer,
        record_scope=scope_,
        content=content,
        source=source,
        owner=owner,
        event=kw.pop("event", "job"),
        time=T0 - timedelta(days=3),
        session_id=3,
        state=kw.pop("state", RecordState.ACTIVE),
        from_ids=("old1",),
        chain_root=rid,
        writer_model="test",
        prompt_version="writer-v1",
    )


HEAD_JOB = record(10, Layer.CORE, "U1", "U1", "Alice works as a teacher in Leeds.")
HEAD_VIEW = record(11, Layer.PROFILE, "U2", "U1", "Alice thinks Bob is moving abroad.")
HEAD_CAT = record(12, Layer.CORE, "U1", "U1", "Alice adopted a grey cat named Pixel.")


def make_ctx(**kw) -> ValidationContext:
    heads = kw.pop("heads", {h.id: h for h in (HEAD_JOB, HEAD_VIEW, HEAD_CAT)})
    all_records = {h: channel_key(SCOPE) for h in heads}
    all_records.update({5: channel_key(SCOPE), 77: channel_key(OTHER)})
    return ValidationContext(
        roster_ids={m.user_id for m in ROSTER},
        heads=heads,
        all_records_channel=kw.pop("all_records_channel", all_records),
        ref_map=kw.pop("ref_map", REF_MAP),
        scope=SCOPE,
        budget=kw.pop("budget", 10),
        gate=kw.pop("gate", EvidenceGate()),
        names=kw.pop("names", build_name_index(ROSTER)),
        **kw,
    )


def add(**kw) -> dict:
    base = {
        "type": "ADD",
        "layer": "core",
        "source": "U2",
        "owner": "U2",
        "content": "Bob is moving to Berlin in June for a job at a robotics startup.",
        "event": "relocation",
        "refs": ["m2"],
    }
    base.update(kw)
    return base


def update(**kw) -> dict:
    base = {
        "type": "UPDATE",
        "entry_id": 10,
        "content": "Alice works at the robotics startup since May 2024.",
        "refs": ["m5"],
    }
    base.update(kw)
    return base


def reasons(report) -> list[RejectReason]:
    return [r.reason for r in report.rejected]


def run(*items, **ctx_kw):
    return validate_actions({"actions": list(items)}, make_ctx(**ctx_kw))


# ---------------------------------------------------------------- happy paths


def test_valid_add_resolves_coordinates() -> None:
    rep = run(add())
    assert reasons(rep) == []
    (a,) = rep.accepted
    assert (a.kind, a.layer, a.record_scope, a.source, a.owner) == (
        "ADD",
        Layer.CORE,
        RecordScope.PERSON,
        "U2",
        "U2",
    )
    assert a.from_ids == ("mid2",)
    assert a.time == SEGMENT[1].ts and a.session_id == 7
    assert a.gate is not None and a.gate.passed
    new = a.to_new_record(writer_model="m")
    assert new.from_ids == ("mid2",) and new.supersedes is None and new.prompt_version


def test_group_layer_add() -> None:
    rep = run(
        add(
            layer="interaction",
            source="U3",
            owner="GROUP",
            content="Carol and Bob agreed the team standup moves to 10am on Mondays.",
            refs=["m3", "m4"],
        )
    )
    assert reasons(rep) == []
    (a,) = rep.accepted
    assert a.record_scope == RecordScope.GROUP and a.owner == GROUP
    assert a.from_ids == ("mid3", "mid4")
    assert a.time == SEGMENT[3].ts


def test_update_inherits_target_coordinates() -> None:
    rep = run(update(layer="insight", owner="U2", source="U3"))  # stray fields are ignored
    assert reasons(rep) == []
    (a,) = rep.accepted
    assert a.kind == "UPDATE" and a.target is HEAD_JOB
    assert (a.layer, a.owner, a.source, a.event) == (Layer.CORE, "U1", "U1", "job")
    new = a.to_new_record(writer_model="m")
    assert new.supersedes == 10 and new.from_ids == ("mid5",)


def test_name_resolution_resolves_instead_of_rejecting() -> None:
    rep = run(
        add(source="bob", owner="Bob"),
        add(
            layer="profile",
            source="Caz",
            owner="@alice",
            content="Carol says standup moves to 10am on Mondays for Alice.",
            refs=["m3"],
        ),
        add(source="Bob (U2)", owner="<@U2>", content="Bob has a new job at a robotics startup."),
    )
    assert reasons(rep) == []
    assert [(a.source, a.owner) for a in rep.accepted] == [("U2", "U2"), ("U3", "U1"), ("U2", "U2")]


def test_ambiguous_names_are_not_resolved() -> None:
    roster = [*ROSTER, RosterMember(user_id="U4", display_name="Bob")]
    names = build_name_index(roster)
    assert "bob" not in names and names["caz"] == "U3"
    rep = run(add(source="Bob", owner="U2"), names=names)
    assert reasons(rep) == [RejectReason.UNKNOWN_SOURCE]


def test_raw_message_id_and_ref_spelling_accepted() -> None:
    rep = run(add(refs=["mid2"]), add(content="Bob moves to Berlin in June.", refs=["M2", "[m2]"]))
    assert reasons(rep) == []
    assert rep.accepted[1].from_ids == ("mid2",)


def test_bare_list_and_lone_action_accepted() -> None:
    assert len(validate_actions([add()], make_ctx()).accepted) == 1
    assert len(validate_actions(add(), make_ctx()).accepted) == 1


# ---------------------------------------------------------------- one case per reason


def test_invalid_json_rejects_whole_batch() -> None:
    raw, err = parse_writer_output('{"actions": [ {"type": "ADD", ')
    assert raw is None and err
    rep = validate_actions(raw, make_ctx(), parse_error=err)
    assert reasons(rep) == [RejectReason.INVALID_JSON]
    assert rep.rejected[0].index == BATCH_INDEX and rep.rejected[0].detail
    assert not rep.json_valid and rep.accepted == [] and rep.proposed == 0
    assert reasons(validate_actions(None, make_ctx())) == [RejectReason.INVALID_JSON]


def test_parse_writer_output_is_defensive() -> None:
    fenced = 'Sure!\n```json\n{"actions": [{"type": "NOOP"}]}\n```'
    assert parse_writer_output(fenced) == ({"actions": [{"type": "NOOP"}]}, None)
    prose = 'Here you go: {"actions": []} hope that helps'
    assert parse_writer_output(prose) == ({"actions": []}, None)
    assert parse_writer_output("")[0] is None


def test_batch_without_action_list_is_schema_violation() -> None:
    rep = validate_actions({"acts": []}, make_ctx())
    assert reasons(rep) == [RejectReason.SCHEMA_VIOLATION]
    assert rep.rejected[0].index == BATCH_INDEX


REASON_CASES = [
    ("ADD Bob moved", RejectReason.SCHEMA_VIOLATION),
    ({"layer": "core"}, RejectReason.SCHEMA_VIOLATION),
    (
        {"type": "ADD", "layer": "core", "source": "U2", "owner": "U2"},
        RejectReason.SCHEMA_VIOLATION,
    ),
    (add(refs=[2]), RejectReason.SCHEMA_VIOLATION),
    (update(entry_id="ten"), RejectReason.SCHEMA_VIOLATION),
    ({"type": "DELETE", "entry_id": 10}, RejectReason.UNKNOWN_ACTION),
    (add(layer="episodic"), RejectReason.UNKNOWN_LAYER),
    (add(owner="GROUP"), RejectReason.SCOPE_MISMATCH),
    (add(layer="interaction", owner="U2"), RejectReason.SCOPE_MISMATCH),
    (add(source="U999"), RejectReason.UNKNOWN_SOURCE),
    (add(owner="Zed"), RejectReason.UNKNOWN_OWNER),
    (update(entry_id=999), RejectReason.UNKNOWN_ENTRY),
    (update(entry_id=5), RejectReason.ENTRY_NOT_ACTIVE),
    (update(entry_id=77), RejectReason.ENTRY_OTHER_CHANNEL),
    (add(refs=[]), RejectReason.MISSING_REFS),
    ({k: v for k, v in add().items() if k != "refs"}, RejectReason.MISSING_REFS),
    (add(refs=["m2", "m99"]), RejectReason.UNKNOWN_REF),
    (
        add(content="Alice adopted a grey cat named Pixel.", owner="U1", source="U1", refs=["m1"]),
        RejectReason.DUPLICATE_OF_HEAD,
    ),
    (update(content="alice works as a TEACHER in Leeds"), RejectReason.DUPLICATE_OF_HEAD),
    (add(content="Bob keeps three pet snakes and breeds tarantulas."), RejectReason.UNGROUNDED),
    (add(content="  ...  "), RejectReason.EMPTY_CONTENT),
    (update(content=""), RejectReason.EMPTY_CONTENT),
    (
        add(layer="profile", source="U1", owner="U2", content="Alice says Bob moves to Berlin."),
        RejectReason.SOURCE_NOT_CITED,
    ),
    (
        add(source="U1", owner="U1", content="Alice moves to Berlin in June for a new job."),
        RejectReason.SELF_REPORT_NOT_CITED,
    ),
    (
        add(
            layer="insight",
            source="GROUP",
            owner="GROUP",
            content="The team standup moves to 10am on Mondays.",
            refs=["m3"],
        ),
        RejectReason.GROUP_ONE_SPEAKER,
    ),
    # HEAD_VIEW keeps its source (Alice): Bob's words cannot carry its update
    (
        update(entry_id=11, content="Alice thinks Bob is moving to Berlin in June.", refs=["m2"]),
        RejectReason.SOURCE_NOT_CITED,
    ),
]


@pytest.mark.parametrize(("item", "reason"), REASON_CASES)
def test_each_reason_code(item, reason: RejectReason) -> None:
    rep = run(item)
    assert reasons(rep) == [reason], rep.rejected
    assert rep.accepted == [] and rep.proposed == 1


def test_superseded_head_passed_in_heads_is_not_active() -> None:
    old = record(5, Layer.CORE, "U1", "U1", "Alice lives in York.", state=RecordState.SUPERSEDED)
    rep = run(update(entry_id=5), heads={5: old, 10: HEAD_JOB})
    assert reasons(rep) == [RejectReason.ENTRY_NOT_ACTIVE]


def test_ref_to_other_channel_message_is_unknown() -> None:
    foreign = msg(50, "U2", "Bob", "I'm moving to Berlin in June", scope=OTHER)
    rep = run(add(refs=[foreign.message_id]))
    assert reasons(rep) == [RejectReason.UNKNOWN_REF]


def test_every_reason_code_is_covered() -> None:
    covered = {
        RejectReason.INVALID_JSON,
        RejectReason.TOO_MANY_ACTIONS,
        RejectReason.DUPLICATE_IN_BATCH,
        RejectReason.ENTRY_NOT_SHOWN,  # test_update_may_target_only_what_the_prompt_showed
    }
    covered |= {reason for _item, reason in REASON_CASES}
    assert covered == set(RejectReason)


# ---------------------------------------------------------------- duplicates


def test_duplicate_in_batch_uses_normalised_content() -> None:
    rep = run(
        add(content="Bob is moving to Berlin in June!"),
        add(content="  bob IS moving to   berlin, in june "),
        add(content="Bob is moving to Berlin in June!", layer="profile"),  # other layer: new key
    )
    assert reasons(rep) == [RejectReason.DUPLICATE_IN_BATCH]
    assert rep.rejected[0].index == 1
    assert len(rep.accepted) == 2
    assert normalize_content("Bob's  NEW job!") == "bob s new job"


def test_second_update_of_same_entry_is_duplicate() -> None:
    rep = run(update(), update(content="Alice now works at the robotics startup (May)."))
    assert reasons(rep) == [RejectReason.DUPLICATE_IN_BATCH]
    assert rep.rejected[0].index == 1


def test_duplicate_of_head_needs_same_owner_and_layer() -> None:
    same_text_other_layer = add(
        layer="profile", source="U1", owner="U1", content="Alice adopted a grey cat named Pixel."
    )
    same_text_other_owner = add(
        layer="core", source="U1", owner="U2", content="Alice adopted a grey cat named Pixel."
    )
    rep = run(
        {**same_text_other_layer, "refs": ["m1"]},
        {**same_text_other_owner, "refs": ["m1"]},
    )
    assert reasons(rep) == []


# ---------------------------------------------------------------- budget and mixed batches


def test_budget_counts_non_noop_actions_in_order() -> None:
    items = [
        {"type": "NOOP"},
        add(),
        {"type": "NOOP"},
        add(content="Bob will work at a robotics startup."),
        add(content="Bob moves to Berlin."),
        {"type": "BOGUS"},
    ]
    rep = run(*items, budget=2)
    assert rep.proposed == 6 and rep.noops == 2
    assert [(r.index, r.reason) for r in rep.rejected] == [
        (4, RejectReason.TOO_MANY_ACTIONS),
        (5, RejectReason.TOO_MANY_ACTIONS),
    ]
    assert [a.index for a in rep.accepted] == [1, 3]


def test_mixed_batch_valid_actions_survive() -> None:
    items = [
        add(),  # ok
        add(layer="episodic"),  # unknown_layer
        update(),  # ok
        add(owner="Nobody"),  # unknown_owner
        add(
            layer="insight",
            source="GROUP",
            owner="GROUP",
            content="The team standup is at 10am on Mondays.",
            refs=["m3", "m4"],
        ),  # ok
        add(content="Bob is a professional chess grandmaster."),  # ungrounded
        add(),  # duplicate_in_batch
        {"type": "NOOP"},
    ]
    rep = run(*items)
    assert [a.index for a in rep.accepted] == [0, 2, 4]
    assert [(r.index, r.reason) for r in rep.rejected] == [
        (1, RejectReason.UNKNOWN_LAYER),
        (3, RejectReason.UNKNOWN_OWNER),
        (5, RejectReason.UNGROUNDED),
        (6, RejectReason.DUPLICATE_IN_BATCH),
    ]
    assert rep.noops == 1 and rep.proposed == 8
    assert rep.reason_counts() == {
        "unknown_layer": 1,
        "unknown_owner": 1,
        "ungrounded": 1,
        "duplicate_in_batch": 1,
    }


def test_noop_only_batch() -> None:
    rep = run({"type": "NOOP"})
    assert rep.accepted == [] and rep.rejected == [] and rep.noops == 1


def test_dense_sim_hook_feeds_gate() -> None:
    seen = []

    def sim(content, cited):
        seen.append((content, tuple(m.message_id for m in cited)))
        return 0.9

    gate = EvidenceGate(lexical_threshold=0.99, dense_threshold=0.5, mode="either")
    rep = run(add(content="Bob relocates to Germany this summer."), gate=gate, dense_sim=sim)
    assert reasons(rep) == []
    assert seen == [("Bob relocates to Germany this summer.", ("mid2",))]
    assert rep.accepted[0].gate.dense == 0.9


def test_proposed_contents() -> None:
    raw = {"actions": [add(content=" x "), {"type": "NOOP"}, update(content="y")]}
    assert proposed_contents(raw) == ["x", "y"]
    assert proposed_contents(None) == []


def test_update_may_restate_target_but_must_ground_the_change() -> None:
    merged = "Alice works at the robotics startup since May; she was a teacher in Leeds."
    assert reasons(run(update(content=merged))) == []
    reworded = "Alice is a Leeds teacher."  # nothing new, and m5 says otherwise
    assert reasons(run(update(content=reworded))) == [RejectReason.UNGROUNDED]


# ---------------------------------------------------------------- attribution


def test_update_may_target_only_what_the_prompt_showed() -> None:
    """A guessed id of a record the prompt never showed takes over nothing, although it is
    an active head of this channel; the records shown stay updatable."""
    hidden = update(
        entry_id=12, content="Alice adopted Pixel, a grey cat, last weekend.", refs=["m1"]
    )
    rep = run(update(), hidden, shown=frozenset({10}))
    assert reasons(rep) == [RejectReason.ENTRY_NOT_SHOWN] and rep.rejected[0].index == 1
    assert [a.target.id for a in rep.accepted if a.target] == [10]
    assert reasons(run(hidden)) == []  # shown (no restriction), the same update commits


def test_a_report_about_someone_else_commits_from_its_source() -> None:
    """Bob's own words about Alice: source Bob, owner Alice, citing Bob's message."""
    rep = run(
        add(
            layer="profile",
            source="U2",
            owner="U1",
            content="Bob agreed the standup moves to 10am on Mondays, as Alice asked.",
            refs=["m4"],
        )
    )
    assert reasons(rep) == []
    assert [(a.source, a.owner) for a in rep.accepted] == [("U2", "U1")]


def test_the_source_and_owner_names_are_no_evidence() -> None:
    """Only the cited speakers' names and the messages' metadata are taken out of the
    count; Carol's name (the owner) must be grounded like any other word."""
    content = "Carol Caz lives in Berlin permanently."
    rep = run(add(layer="profile", source="U2", owner="U3", content=content))
    assert reasons(rep) == [RejectReason.UNGROUNDED]
