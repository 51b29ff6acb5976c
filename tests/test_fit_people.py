"""The leave-one-network-out choice of bench/quality/fit_people.py (pure)."""

from __future__ import annotations

import sys
from pathlib import Path

QUALITY = Path(__file__).resolve().parents[1] / "bench" / "quality"
if str(QUALITY) not in sys.path:
    sys.path.insert(0, str(QUALITY))

from fit_people import lono  # noqa: E402


def test_each_network_is_scored_by_the_value_chosen_without_it() -> None:
    # value "a" wins on n1 alone by a lot; "b" wins everywhere else
    scores = {
        "a": {"n1": 30.0, "n2": 0.0, "n3": 0.0},
        "b": {"n1": 5.0, "n2": 10.0, "n3": 10.0},
    }
    fit = lono(scores, shipped="a")
    assert fit["chosen"] == "a"  # on all three: 10.0 vs 8.33
    # held out, n1 is scored by "b" (chosen on n2, n3), n2 and n3 by "a" (chosen with n1)
    assert {n: h["chosen"] for n, h in fit["held_out"].items()} == {"n1": "b", "n2": "a", "n3": "a"}
    # so the cross-validated margin shows how little "a" carries over: (5 + 0 + 0) / 3
    assert fit["cross_validated_margin"] == round(5.0 / 3, 2)
    assert fit["by_value"] == {"a": 10.0, "b": 8.33}


def test_a_tie_goes_to_the_shipped_value() -> None:
    scores = {"x": {"n1": 1.0, "n2": 1.0}, "y": {"n1": 1.0, "n2": 1.0}}
    assert lono(scores, shipped="y")["chosen"] == "y"
    assert lono(scores, shipped="z")["chosen"] == "x"
