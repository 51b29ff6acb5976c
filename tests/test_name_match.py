"""Name finding over a large roster gives exactly the full regex alternation's matches."""

from __future__ import annotations

import random
import re

import pytest

from speakermem.memory.models import RosterMember
from speakermem.memory.query import projection as P
from speakermem.memory.query import roster_index as R
from speakermem.memory.query.project_words import name_key
from speakermem.memory.search.name_match import SMALL, NameAlternation, alternation

SYLLABLES = ["al", "bo", "ka", "ri", "zed", "nor", "vel", "mi", "to", "sha", "o'", "ne", "ß"]
FILLER = ["what", "did", "say", "about", "the", "plan", "@", "'s", ",", "?", "(", "-"]


def _name(rng: random.Random) -> str:
    parts = [
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        for _ in range(rng.randint(1, 3))
    ]
    name = rng.choice([" ", "_", "-", "."]).join(parts)
    if rng.random() < 0.3:
        name = name.title()
    if rng.random() < 0.1:
        name += str(rng.randint(1, 99))
    return name


def _question(rng: random.Random, roster: list[RosterMember]) -> str:
    toks = []
    for _ in range(rng.randint(3, 12)):
        if rng.random() < 0.4:
            m = rng.choice(roster)
            name = rng.choice([m.display_name, m.user_id, *m.aliases])
            if rng.random() < 0.3:
                name = name.lower()
            if rng.random() < 0.2:
                name = name.replace(" ", rng.choice(["_", "-", "", "  "]))
            toks.append(name)
        else:
            toks.append(rng.choice(FILLER))
    return rng.choice([" ", "", " "]).join(toks) if rng.random() < 0.2 else " ".join(toks)


def _spans(matches: object) -> list[tuple[tuple[int, int], dict[str, str | None]]]:
    return [(m.span(), m.groupdict()) for m in matches]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def roster() -> list[RosterMember]:
    rng = random.Random(7)
    return [
        RosterMember(
            user_id=f"U{i:04d}{rng.choice(['', 'x', 'AB'])}",
            display_name=_name(rng),
            aliases=tuple(_name(rng) for _ in range(rng.randint(0, 1))),
        )
        for i in range(400)
    ]


def test_filtered_matching_equals_the_full_alternation(roster: list[RosterMember]) -> None:
    idx = R.roster_index(roster)
    assert idx.name_re is not None and idx.id_re is not None
    assert len(idx.name_re.keys) > SMALL  # the filtered path, not the small-set shortcut
    full_name = re.compile(
        idx.name_re.template.replace("{alt}", alternation(idx.name_re.keys, R.key_pattern)),
        re.IGNORECASE,
    )
    full_id = re.compile(
        idx.id_re.template.replace("{alt}", alternation(idx.id_re.keys, R.key_pattern))
    )
    rng = random.Random(11)
    found = 0
    for _ in range(300):
        q = _question(rng, roster)
        expected = _spans(full_name.finditer(q))
        assert _spans(idx.name_re.finditer(q)) == expected, q
        assert _spans(idx.id_re.finditer(q)) == _spans(full_id.finditer(q)), q
        found += len(expected)
    assert found > 200  # the questions do name people


def test_common_words_overlay_equals_a_fresh_build(roster: list[RosterMember]) -> None:
    sig = tuple((m.user_id, m.display_name, tuple(m.aliases)) for m in roster)
    rng = random.Random(3)
    for _ in range(30):
        common = frozenset(
            name_key(rng.choice(roster).display_name.split()[0]) for _ in range(rng.randint(1, 3))
        )
        fresh = R.build_index.__wrapped__(sig, common)
        overlay = R.roster_index(roster, common)
        assert overlay.caps_only == fresh.caps_only
        assert overlay.squashed == fresh.squashed
        assert overlay.common == fresh.common
        q = _question(rng, roster)
        assert P._analyse(q, overlay) == P._analyse(q, fresh)


class _CountingRoster(list[RosterMember]):
    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.walks += 1
        return super().__iter__()


def test_the_roster_index_is_built_once_per_roster_list(roster: list[RosterMember]) -> None:
    counted = _CountingRoster(roster)
    first = R.roster_index(counted)
    walks = counted.walks
    assert walks >= 1
    for _ in range(5):
        assert R.roster_index(counted) is first
        P.fallback_projection("what did Bob say about the plan?", counted)
    assert counted.walks == walks  # not walked again per question
    grown = [*roster, RosterMember(user_id="Unew", display_name="Newcomer Person")]
    assert "unew" in R.roster_index(grown).ids_fold


def test_small_key_sets_compile_the_alternation_once() -> None:
    alt = NameAlternation(["bob", "bobby"], r"(?<!\w)(?P<name>{alt})(?!\w)", re.escape)
    assert [m["name"] for m in alt.finditer("bobby and bob")] == ["bobby", "bob"]
