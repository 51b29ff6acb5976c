"""The values derived from a channel's roster (its name index above all) are built once per
roster list, however many channels a server is asked about, as long as the store keeps those
lists cached; and rebuilt once a roster changes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

import speakermem.memory.query.roster_index as roster_index_module
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import RosterAction, RosterEvent, RosterMember, Scope
from speakermem.memory.query.pipeline import RecallPipeline, RecallRequest
from speakermem.memory.roster_cache import ROSTERS, DerivedCache
from tests.conftest import T0, make_config, msg

CHANNELS = 12
"""More channels than the cache held before (32 entries for five kinds a roster: six)."""


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = await MemoryEngine.open(make_config(tmp_path / "s.db"))
    try:
        yield eng
    finally:
        await eng.close()


async def seed(engine: MemoryEngine, scope: Scope, n: int) -> None:
    people = [f"Person{n}x{k}" for k in range(3)]
    await engine.ingest_many(
        [
            msg(scope, f"m{i}", people[i % 3], f"the budget review moves to week {i}", i)
            for i in range(6)
        ]
    )
    for who in people:
        await engine.roster(
            RosterEvent(scope=scope, action=RosterAction.JOIN, user_id=who.lower(), name=who, at=T0)
        )


async def test_each_channels_name_index_is_built_once_across_many_channels(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CHANNELS <= ROSTERS
    scopes = [Scope(platform="slack", workspace="T1", channel=f"C{n:02d}") for n in range(CHANNELS)]
    for n, scope in enumerate(scopes):
        await seed(engine, scope, n)
    built: list[tuple[str, ...]] = []
    real = roster_index_module.build_index

    def counting(sig: Sequence[tuple[str, str, tuple[str, ...]]]) -> object:
        built.append(tuple(uid for uid, _, _ in sig))
        return real(sig)  # type: ignore[arg-type]

    monkeypatch.setattr(roster_index_module, "build_index", counting)
    pipeline = RecallPipeline(engine)
    for _ in range(3):  # members asking in every channel in turn
        for scope in scopes:
            result = await pipeline.run(RecallRequest("When is the budget review?", scope))
            assert result.pack.s1_message_ids(), scope
    assert len(built) == CHANNELS, built
    assert len(set(built)) == CHANNELS  # one index per channel's own roster

    # a roster change is a new list: that channel's index is built again, once
    await engine.roster(
        RosterEvent(
            scope=scopes[0], action=RosterAction.JOIN, user_id="newbie", name="Newbie", at=T0
        )
    )
    for _ in range(2):
        await pipeline.run(RecallRequest("When is the budget review?", scopes[0]))
    assert len(built) == CHANNELS + 1 and "newbie" in built[-1]


def members(n: int, tag: str) -> list[RosterMember]:
    return [RosterMember(user_id=f"{tag}{i}", display_name=f"{tag} {i}") for i in range(n)]


def test_large_rosters_are_bounded_by_their_members_together() -> None:
    cache = DerivedCache(lists=10, members=100)
    a, b, c = members(40, "a"), members(40, "b"), members(40, "c")
    for roster in (a, b, a, b):
        cache.get(roster, "names", len)
    assert cache.builds == 2
    cache.get(c, "names", len)  # 120 members: the least recently used list (a) goes
    cache.get(b, "names", len)
    assert cache.builds == 3
    cache.get(a, "names", len)
    assert cache.builds == 4  # a was built again; c goes now (b was used after it)
    big = members(500, "big")
    assert cache.get(big, "names", len) == 500  # over the budget alone: kept while the latest
    assert cache.get(big, "index", len) == 500 and cache.builds == 6
    cache.get(a, "names", len)
    assert cache.builds == 7


def test_a_list_that_changed_length_is_derived_again() -> None:
    cache = DerivedCache()
    roster = members(3, "m")
    assert cache.get(roster, "names", len) == 3
    roster.append(RosterMember(user_id="late", display_name="Late"))
    assert cache.get(roster, "names", len) == 4 and cache.builds == 2
