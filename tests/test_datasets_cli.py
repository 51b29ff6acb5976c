"""Dataset importers (own fixtures) and the System 1 CLI: import, search, stats, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakermem.integrations.cli.main import main
from speakermem.memory.datasets.friendsqa import read_friendsqa
from speakermem.memory.datasets.locomo import parse_session_time, read_locomo

FIXTURES = Path(__file__).parent / "fixtures"


def test_locomo_mapping() -> None:
    ds = read_locomo(FIXTURES / "locomo_small.json")
    assert {m.scope.channel for m in ds.messages} == {"conv-test"}
    assert [m.message_id for m in ds.messages] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    d12 = ds.messages[1]
    assert d12.speaker_id == "ben" and d12.speaker_name == "Ben"
    assert d12.text.endswith("[shares image: a photo of a beagle on a sofa]")
    assert d12.addressees == ("ana",)
    assert [m.session_break for m in ds.messages] == [True, False, False, True, False]
    assert ds.messages[0].ts == parse_session_time("1:56 pm on 8 May, 2023")
    assert (ds.messages[1].ts - ds.messages[0].ts).total_seconds() == 30
    q = {x.question: x for x in ds.questions}
    assert q["What hobby did Ben pick up after climbing?"].evidence == ["D1:3", "D2:1"]
    assert q["Where does Ana volunteer?"].evidence == ["D1:1"]  # D9:99 resolves to no turn
    assert q["What is the name of Ben's dog?"].category == "single-hop"
    assert q["What did Ana paint?"].evidence == [] and q["What did Ana paint?"].answer == "nothing"
    assert [(o.speaker_id, o.evidence, o.session) for o in ds.observations] == [
        ("ana", ["D1:1"], 1),
        ("ben", ["D1:2"], 1),
        ("ben", ["D2:1"], 2),
    ]


def test_friendsqa_mapping() -> None:
    ds = read_friendsqa(FIXTURES / "friendsqa_small.json")
    # scenes in title order, one channel, ids <title>:<uid>, a session per scene
    assert [m.message_id for m in ds.messages] == [
        "s09_e01_c01:0",
        "s09_e01_c01:1",
        "s09_e01_c02:0",
        "s09_e01_c02:1",
        "s09_e01_c02:2",
    ]
    assert {m.scope.channel for m in ds.messages} == {"friendsqa"}
    assert [m.session_break for m in ds.messages] == [True, False, True, False, False]
    assert ds.messages[4].speaker_id == "theo_park"  # the first of several speakers
    q = {x.id: x for x in ds.questions}
    assert q["s09_e01_c02_Where"].evidence == ["s09_e01_c02:2"] and q["s09_e01_c02_Where"].any_of
    assert q["s09_e01_c01_Who_Paraphrased"].evidence == ["s09_e01_c01:0", "s09_e01_c01:1"]
    assert q["s09_e01_c01_Who_Paraphrased"].category == "who"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_import_search_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "cli.db")
    code, _, err = run_cli(
        capsys, "--db", db, "import", "locomo", str(FIXTURES / "locomo_small.json"), "--no-embed"
    )
    assert code == 0 and "imported 5 messages" in err
    code, _, err = run_cli(
        capsys, "import", "locomo", str(FIXTURES / "locomo_small.json"), "--no-embed", "--db", db
    )
    assert code == 0 and "imported 0 messages (5 already present)" in err
    code, out, _ = run_cli(
        capsys, "--db", db, "search", "beagle Pixel", "--channel", "conv-test", "--mode", "lexical"
    )
    assert code == 0
    assert "D1:2" in out and "Ben" in out and "2023-05-08" in out
    code, out, _ = run_cli(capsys, "--db", db, "stats", "--json")
    assert code == 0 and '"messages": 5' in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["import", "locomo", "/nonexistent/x.json"], "no such file"),
        (["import", "friendsqa", "BAD"], "invalid JSON"),
        (["search", "x", "--channel", "nope"], "unknown channel"),
        (["import", "friendsqa", "LOCOMO"], "FriendsQA format"),
    ],
)
def test_readable_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = [
        str(bad) if a == "BAD" else str(FIXTURES / "locomo_small.json") if a == "LOCOMO" else a
        for a in args
    ]
    code, out, err = (
        run_cli(capsys, "--db", str(tmp_path / "e.db"), *args, "--no-embed")
        if args[0] == "import"
        else run_cli(capsys, "--db", str(tmp_path / "e.db"), *args)
    )
    assert code == 2
    assert expected in err
    assert "Traceback" not in err + out
