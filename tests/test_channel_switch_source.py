"""Whether a channel is on is kept in one place (issue 27, defect 7).

It was stored twice, `channels.enabled` and `channel_policy.enabled`, and catch-up read the
legacy column: with new channels off by default, a channel nobody switched on (the column
still said 1) was caught up after downtime. A new migration folds the column into the
policy and drops it, on both backends; catch-up asks the governance policy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import speakermem.memory.store.pg.schema
import speakermem.memory.store.sqlite.database
from speakermem.bot.catchup import CatchUp
from speakermem.bot.dispatch import Dispatcher
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import make_config, msg

pytestmark = pytest.mark.contract

GENERAL = Scope(platform="test", workspace="w1", channel="general")
QUIET = Scope(platform="test", workspace="w1", channel="quiet")
NEW = Scope(platform="test", workspace="w1", channel="new")


async def test_the_migration_keeps_a_switched_off_channel_off_and_drops_the_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest
) -> None:
    pg = backend == "postgres"
    config = MemoryConfig(  # an empty database (the contract run's are migrated copies)
        store=StoreConfig(
            db_path=tmp_path / "old.db",
            db_url=request.getfixturevalue("pg_url") if pg else None,
        )
    )
    module = speakermem.memory.store.pg.schema if pg else speakermem.memory.store.sqlite.database
    released = module.migrations
    before_this = 10 if pg else 8
    monkeypatch.setattr(
        module, "migrations", lambda *a: released(*a)[:before_this]
    )  # a database of the previous release
    old = await MemoryEngine.open(config)
    try:
        async with old.store.db.transaction() as tx:
            for scope in (GENERAL, QUIET):
                await old.store.channels.ensure(tx, scope)
            # what the previous release's `channel disable` wrote: both places
            # (GovernanceRepo.set_channel_enabled before this change)
            await tx.execute(
                "INSERT INTO channel_policy (platform, workspace, channel, enabled, updated_at,"
                " updated_by) VALUES (?, ?, ?, 0, 0, 'cli')",
                QUIET.key(),
            )
            await tx.execute(
                "UPDATE channels SET enabled = 0 WHERE platform = ? AND workspace = ?"
                " AND channel = ?",
                QUIET.key(),
            )
        rows = await old.store.db.read("SELECT channel, enabled FROM channels ORDER BY 1")
        assert [tuple(r) for r in rows] == [("general", 1), ("quiet", 0)]
    finally:
        await old.close()
    monkeypatch.setattr(module, "migrations", released)
    engine = await MemoryEngine.open(config)
    try:
        gov = Governance(engine)
        assert await gov.channel_enabled(QUIET) is False
        assert await gov.channel_enabled(GENERAL) is True
        with pytest.raises(Exception, match="enabled"):
            await engine.store.db.read("SELECT enabled FROM channels")
        (out,) = await engine.ingest_many([msg(QUIET, "q2", "Ann", "still off", 2)])
        assert out.status.value == "channel_off"
    finally:
        await engine.close()


class History:
    """Every channel has one message newer than what is stored."""

    platform = "test"

    def __init__(self) -> None:
        self.asked: list[Scope] = []

    async def pages(
        self, scope: Scope, *, after_id: str | None, after_ts: float | None
    ) -> AsyncIterator[list[MessageEvent]]:
        self.asked.append(scope)
        yield [msg(scope, f"{scope.channel}-later", "Ann", "posted while down", 60)]


async def test_catch_up_follows_the_policy_not_a_legacy_column(tmp_path: Path) -> None:
    """Messages stored while new channels were on by default; then the operator turns the
    default off (SPEAKERMEM_CHANNEL_DEFAULT_ENABLED=false): only the channel an admin
    switched on explicitly is caught up."""
    first = await MemoryEngine.open(make_config(tmp_path))
    try:
        for scope in (GENERAL, QUIET, NEW):
            await first.ingest(msg(scope, f"{scope.channel}-1", "Ann", "before", 0))
        gov = Governance(first)
        await gov.set_channel(GENERAL, True, actor="test")
        await gov.set_channel(QUIET, False, actor="test")
    finally:
        await first.close()
    config = make_config(tmp_path)
    config.governance.channel_default_enabled = False
    engine = await MemoryEngine.open(config)
    try:
        d = Dispatcher(engine, RecallPipeline(engine))
        history = History()
        runner = CatchUp(d, engine.store.catchup, history)
        starts = await runner.plan(await runner.snapshot())
        assert list(starts) == [GENERAL]
        await runner.run(starts)
        assert history.asked == [GENERAL]
    finally:
        await engine.close()
