"""SocialMemBench: the loader (own fixture networks), reply links in the store's interaction
graph, the eval command, and the dev set where it is present."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from speakermem.integrations.cli.main import main
from speakermem.memory.datasets import DatasetError, read_dataset
from speakermem.memory.datasets.socialmembench import INTERLEAVED, interleave, read_socialmembench
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.eval.harness import ABLATIONS
from speakermem.memory.interactions import interaction_names
from tests.conftest import make_config, shared_file
from tests.fakes import HashEmbedder

FIXTURES = Path(__file__).parent / "fixtures" / "socialmembench_small"
ALPHA = FIXTURES / "net_alpha.json"


def test_network_mapping() -> None:
    ds = read_socialmembench(ALPHA)
    assert {m.scope.channel for m in ds.messages} == {"grp_alpha"}
    assert {m.scope.platform for m in ds.messages} == {"socialmembench"}
    ids = [m.message_id for m in ds.messages]
    assert ids[:2] == ["grp_alpha_s01_t000", "grp_alpha_s01_t001"] and len(ids) == 7
    first, reply = ds.messages[0], ds.messages[1]
    assert (first.speaker_id, first.speaker_name) == ("p_ines", "Ines")
    assert first.ts == datetime(2025, 3, 3, 18, 0, tzinfo=UTC)
    # a reply is stored as a platform reply: the parent's id, its author as addressee
    assert first.reply_to is None and first.addressees == ()
    assert reply.reply_to == "grp_alpha_s01_t000" and reply.addressees == ("p_ines",)
    assert reply.thread_id is None
    # replying to oneself links the turns but addresses nobody
    own = ds.messages[3]
    assert own.reply_to == "grp_alpha_s01_t002" and own.addressees == ()
    assert [m.session_break for m in ds.messages] == [True, False, False, False, True, False, False]
    assert [(s.index, s.topic, s.start.date().isoformat()) for s in ds.sessions] == [
        (1, "Picking a climbing gym", "2025-03-03"),
        (2, "After the first climb", "2025-03-10"),
    ]
    assert ds.sessions[1].first_message_id == "grp_alpha_s02_t000"
    q = {x.id: x for x in ds.questions}
    change = q["grp_alpha:Q8_alpha1"]
    # gold = the anchors' turn ids; an anchor naming no turn of the file is dropped
    assert change.evidence == ["grp_alpha_s01_t002", "grp_alpha_s02_t001"]
    assert not change.any_of
    assert (change.category, change.difficulty, change.answer_format) == (
        "Q8",
        "medium",
        "long_form",
    )
    assert change.options == {} and change.correct_option is None
    choice = q["grp_alpha:Q4_alpha2"]
    assert choice.answer_format == "multiple_choice"
    assert choice.options == {"A": "Ines", "B": "Ravi", "C": "Tomas"}
    assert choice.correct_option == "A"
    short = q["grp_alpha:Q1_alpha3"]
    assert (short.answer_format, short.correct_option) == ("short_answer", "shoulder injury")


def test_folder_reads_every_network_as_its_own_channel() -> None:
    ds = read_dataset("socialmembench", [FIXTURES])
    assert [s.channel for s in ds.scopes] == ["grp_alpha", "grp_beta"]
    assert len(ds.messages) == 9 and len(ds.questions) == 4
    # files and folders mix; a network named twice is one network
    again = read_dataset("socialmembench", [FIXTURES, ALPHA])
    assert len(again.messages) == 9
    no_markers = read_socialmembench(ALPHA, sessions=False)
    assert not any(m.session_break for m in no_markers.messages)


def test_readable_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_socialmembench(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match=r"no \.json network files"):
        read_socialmembench(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(DatasetError, match="expected a SocialMemBench network"):
        read_socialmembench(bad)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"sessions": [{"turns": [{"speaker": "A"}]}]}))
    with pytest.raises(DatasetError, match="malformed"):
        read_socialmembench(broken)
    twin = tmp_path / "twin.json"
    twin.write_text(ALPHA.read_text())
    with pytest.raises(DatasetError, match="already read"):
        read_socialmembench([ALPHA, twin])
    with pytest.raises(DatasetError, match="reads one file"):
        read_dataset("locomo", [ALPHA, twin])


@pytest.mark.contract
async def test_replies_become_explicit_links_in_the_interaction_graph(tmp_path: Path) -> None:
    ds = read_socialmembench(ALPHA)
    engine = await MemoryEngine.open(make_config(tmp_path), HashEmbedder())
    try:
        await engine.ingest_many(ds.messages)
        (scope,) = ds.scopes
        (pk,) = await engine.channel_pks([scope])
        names = interaction_names(await engine.members(scope))
        while await engine.store.interactions.update(pk, names):
            pass
        stored = await engine.store.messages.by_ids(scope, [m.message_id for m in ds.messages])
        by_mid = {mid: m.pk for mid, m in stored.items()}
        parents = await engine.store.interactions.parents(list(by_mid.values()))
        for m in ds.messages:
            if m.reply_to:
                assert parents[by_mid[m.message_id]] == (by_mid[m.reply_to], "explicit")
        assert stored["grp_alpha_s01_t001"].reply_to == "grp_alpha_s01_t000"
    finally:
        await engine.close()


@pytest.mark.contract
def test_eval_cli_reports_categories_and_difficulty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.delenv("SPEAKERMEM_LLM_BASE_URL", raising=False)
    out = tmp_path / "smb.json"
    db = str(tmp_path / "e.db")
    beta = str(FIXTURES / "net_beta.json")
    code = main(["--db", db, "eval", "socialmembench", str(ALPHA), beta, "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["dataset"] == "socialmembench" and report["questions"] == 4
    for name in ("speakermem", "bm25", "bm25_speaker", "dense", "hybrid"):
        system = report["systems"][name]
        assert set(system["by_category"]) == {"Q1", "Q3", "Q4", "Q8"}
        assert list(system["by_difficulty"]) == ["easy", "medium", "hard"]
        assert {"evidence_recall", "all_hit", "n"} <= set(system["by_difficulty"]["medium"])
    assert "by difficulty" in out.with_suffix(".md").read_text()
    assert "| speakermem |" in capsys.readouterr().out


def test_dev_set_counts() -> None:
    folder = shared_file("socialmembench")
    ds = read_dataset("socialmembench", [folder])
    assert len(ds.scopes) == 10 and len(ds.messages) == 582 and len(ds.questions) == 77
    assert len(ds.sessions) == 50 and all(s.topic for s in ds.sessions)
    assert all(q.evidence for q in ds.questions)
    formats = [q.answer_format for q in ds.questions]
    assert (formats.count("long_form"), formats.count("multiple_choice")) == (46, 21)
    # every reply in the files points to a turn that exists: each became a reply link
    assert sum(1 for m in ds.messages if m.reply_to) == 500


def _network(nid: str, dates: list[str], speakers: list[str]) -> dict[str, object]:
    sessions = []
    for i, day in enumerate(dates, start=1):
        turns = [
            {
                "turn": f"{nid}_s{i:02d}_t{n:03d}",
                "speaker": name.title(),
                "speaker_id": name,
                "content": f"{name} in session {i}",
                "ts": f"{day}T18:0{n}:00",
                "reply_to": f"{nid}_s{i:02d}_t000" if n else "",
            }
            for n, name in enumerate(speakers)
        ]
        sessions.append(
            {
                "session_id": f"{nid}_s{i:02d}",
                "session_index": i,
                "topic": "t",
                "ts": day,
                "turns": turns,
            }
        )
    qa = [
        {
            "id": "Q8_x",
            "category": "Q8",
            "question": "what changed?",
            "evidence_anchors": [{"session_index": 1, "turn_id": f"{nid}_s01_t001"}],
        }
    ]
    return {"sessions": sessions, "qa_pairs": qa, "meta": {"network_id": nid}}


def test_interleave_puts_every_network_in_one_channel_by_session_date(tmp_path: Path) -> None:
    small, larger = tmp_path / "small", tmp_path / "larger"
    small.mkdir()
    larger.mkdir()
    (small / "a.json").write_text(
        json.dumps(_network("grp_a", ["2025-03-01", "2025-03-20"], ["ana", "bo"]))
    )
    (larger / "b.json").write_text(json.dumps(_network("grp_b", ["2025-03-10"], ["ana", "cy"])))
    ds = read_socialmembench([small, larger])
    assert {q.id: q.group for q in ds.questions} == {"grp_a:Q8_x": "small", "grp_b:Q8_x": "larger"}
    mixed = interleave(ds)
    assert {m.scope.channel for m in mixed.messages} == {INTERLEAVED}
    # whole sessions, ordered by their start: a's first, b's, then a's second
    assert [m.message_id for m in mixed.messages] == [
        "grp_a_s01_t000",
        "grp_a_s01_t001",
        "grp_b_s01_t000",
        "grp_b_s01_t001",
        "grp_a_s02_t000",
        "grp_a_s02_t001",
    ]
    # "ana" of network a and "ana" of network b stay two people, their replies linked
    assert [m.speaker_id for m in mixed.messages[:3]] == ["grp_a:ana", "grp_a:bo", "grp_b:ana"]
    assert mixed.messages[1].reply_to == "grp_a_s01_t000"
    assert mixed.messages[1].addressees == ("grp_a:ana",)
    assert [m.session_break for m in mixed.messages] == [True, False, True, False, True, False]
    assert {q.scope.channel for q in mixed.questions} == {INTERLEAVED}
    assert [q.evidence for q in mixed.questions] == [q.evidence for q in ds.questions]
    assert [q.group for q in mixed.questions] == ["small", "larger"]


@pytest.mark.contract
def test_eval_cli_reports_parts_channels_ablations_and_the_interleaved_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    monkeypatch.delenv("SPEAKERMEM_LLM_BASE_URL", raising=False)
    out = tmp_path / "smb.json"
    db = str(tmp_path / "e.db")
    args = ["eval", "socialmembench", str(FIXTURES), "--interleave", "--ablate", "--out", str(out)]
    code = main(["--db", db, *args])
    assert code == 0
    report = json.loads(out.read_text())
    part = report["parts"]["socialmembench_small"]
    assert part["questions"] == 4 and set(part["by_channel"]) == {"grp_alpha", "grp_beta"}
    assert set(part["channel_spread"]) == {"min", "max", "mean", "stdev"}
    assert part["by_channel"]["grp_alpha"]["n"] == 3
    assert set(report["ablations"]) == set(ABLATIONS)
    people = report["ablations"]["people_rank"]
    assert people["switched_off_by"] == {"people_rank": False}
    assert set(people["by_channel"]) == {"grp_alpha", "grp_beta"}
    mixed = report["interleaved"]
    assert mixed["questions"] == 4
    assert set(mixed["parts"]["socialmembench_small"]["by_channel"]) == {INTERLEAVED}
    assert report["fitted"]["people_weights"]["named_speaker"] > 0
