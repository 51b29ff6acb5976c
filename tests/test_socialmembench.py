"""SocialMemBench: the loader (own fixture networks), reply links in the store's interaction
graph, the eval command, and the dev set where it is present."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from integrations.cli.main import main
from memory.datasets import DatasetError, read_dataset
from memory.datasets.socialmembench import read_socialmembench
from memory.engine import MemoryEngine
from memory.interactions import interaction_names
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
