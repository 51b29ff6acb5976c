"""Upgrades keep every guarantee: databases written by the project's own earlier schema
versions, opened by today's code.

Each fixture under tests/fixtures/upgrade/ is the database an earlier commit's CLI wrote
from one small scenario (tests/fixtures/upgrade/make_fixture.py: two Discord channels
imported, a channel switched off, a retention limit, an alias, a message and a person
forgotten, an opt-out in the shell), kept as SQL text, with a manifest of what that code
reported and left. Today's code opens it (running every later migration) and must report
the same: message counts per channel, the same search hit and /recall citations, the
channel switch, the retention, the alias; the forgotten message stays a tombstone, and the
forgotten person, the opted-out member and the switched-off channel get nothing stored,
also on a re-import of the same exports. The oldest and newest fixtures also go through
`speakermem backup` and a restore, and `speakermem migrate` into PostgreSQL.

A migration needs a fixture of the schema before it: the first test fails when one lands
without (generate it with make_fixture.py, see CONTRIBUTING.md).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.cli import render
from speakermem.integrations.cli.main import main
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import MessageEvent, Scope
from speakermem.memory.store.messages.outcomes import IngestStatus
from speakermem.memory.store.pg.schema import migrations as pg_migrations
from speakermem.memory.store.sqlite.driver import connect_sync, pick_driver
from speakermem.memory.store.sqlite.schema import migrations as sqlite_migrations
from tests.fixtures.upgrade import make_fixture as scenario

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
PERSON_FORGETS = ("forget-user", "forget-me", "opt-out-forget")

HISTORY_GAPS: dict[str, dict[int, str]] = {
    "sqlite": {
        3: "no commit had migrations 1-2 only: 2 and 3 landed after 4 and 5",
        4: "no commit had migrations 1-3 only: 4 landed before 2 and 3",
        5: "no commit had migrations 1-4 only: 5 landed before 2 and 3",
        13: "no commit had migrations 1-12 only: 12 and 13 landed together (one merge)",
    },
    "postgres": {
        2: "no commit had migration 1 only: 2 came with the backend",
        3: "migrations 1-2 were the newest only before the CLI could select PostgreSQL (2de5690)",
        4: "no commit had migrations 1-3 only: 3 and 4 landed together",
        17: "no commit had migrations 1-16 only: 16 and 17 landed together (one merge)",
    },
}
"""Schemas of which no fixture can be made by the code of their time (they never shipped, or
no CLI wrote them); SQLite's fixtures of {1, 4}, {1, 4, 5} and {1, 2, 4, 5} run migrations 2,
3 and 5 on databases that hold data instead. A new migration gets a fixture of the schema
before it; an entry here only records migrations that landed on main together."""


def manifests(backend: str) -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob(f"{backend}-*.json"))]
    return sorted(found, key=lambda m: (max(m["migrations"]), m["migrations"]))


SQLITE = manifests("sqlite")
POSTGRES = manifests("postgres")


def today(backend: str) -> list[int]:
    if backend == "sqlite":
        return [m.version for m in sqlite_migrations(1024)]
    return [m.version for m in pg_migrations(StoreConfig())]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_every_migration_has_a_fixture_of_the_schema_before_it(kind: str) -> None:
    """For every migration N > 1 a fixture holds exactly the migrations before N."""
    versions = today(kind)
    have = {tuple(m["migrations"]) for m in manifests(kind)}
    missing = [
        n
        for n in versions[1:]
        if tuple(v for v in versions if v < n) not in have and n not in HISTORY_GAPS[kind]
    ]
    assert not missing, (
        f"{kind} migration(s) {missing} have no fixture of the schema before them: run "
        "python tests/fixtures/upgrade/make_fixture.py <last commit at that schema>"
        f"{' --backend postgres' if kind == 'postgres' else ''} (CONTRIBUTING.md)"
    )


# ---- loading a fixture -----------------------------------------------------------------


def load_sqlite(manifest: dict[str, Any], dest: Path) -> Path:
    """The fixture's database file, written from its SQL text."""
    db = dest / "upgraded.db"
    conn = connect_sync(db, pick_driver())
    try:
        conn.executescript((FIXTURES / f"{manifest['name']}.sql").read_text())
    finally:
        conn.close()
    return db


def load_postgres(manifest: dict[str, Any], url: str, pg_bin: Path) -> None:
    subprocess.run(
        [str(pg_bin / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", "-"],
        input=(FIXTURES / f"{manifest['name']}.sql").read_text(),
        check=True,
        capture_output=True,
        text=True,
    )


# ---- what today's code must report -----------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.chdir(tmp_path)
    for name in ("SPEAKERMEM_LLM_BASE_URL", "SPEAKERMEM_DB_PATH", "SPEAKERMEM_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    for con in (render.console, render.err_console):
        monkeypatch.setattr(con, "_width", 200)
    yield monkeypatch


Cli = Callable[..., str]


def cli_runner(capsys: pytest.CaptureFixture[str]) -> Cli:
    def run(*argv: str) -> str:
        capsys.readouterr()
        code = main(list(argv))
        out = capsys.readouterr().out
        assert code == 0, (argv, out)
        return out

    return run


def discord(channel: str) -> Scope:
    return Scope(platform="discord", workspace=scenario.GUILD, channel=channel)


def event(scope: Scope, who: str, name: str, text: str, n: int) -> MessageEvent:
    return MessageEvent(
        scope=scope,
        message_id=f"upgrade-new-{n}",
        speaker_id=who,
        speaker_name=name,
        text=text,
        ts=datetime(2026, 12, 1, 12, n, tzinfo=UTC),
    )


def person_forgets(m: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(p, w, target) for p, w, action, target in m["audit"] if action in PERSON_FORGETS}


def check_reports(m: dict[str, Any], cli: Cli, *, reimport: bool) -> None:
    """`status`, `search` and `recall` report what the old code reported; a re-import of
    the scenario's exports adds nothing."""
    live_total = sum(len(ids) for ids in m["live"].values())
    if reimport:
        for name in ("general.json", "random.json"):
            cli("import", "discord-export", name)
    status = json.loads(cli("status", "--json"))
    assert status["messages"] == live_total
    channels = {c["channel"]: c for c in status["channels"]}
    for channel, ids in m["live"].items():
        assert channels[channel]["messages"] == len(ids), channel
    for channel in m["channels_off"]:
        assert channels[channel]["on"] is False, channel
    for platform, workspace, channel, _, days in m["policy"]:
        if days is not None:
            assert channels[f"{platform}/{workspace}/{channel}"]["retention_days"] == days
    assert status["opted_out_members"] == len(m["opted_out"])
    assert status["forgotten_people"] == len(person_forgets(m))
    if "search" in m:
        hits = json.loads(
            cli(
                "search",
                m["search"]["query"],
                "--channel",
                "general",
                "--platform",
                "discord",
                "--json",
            )
        )
        assert [h["message_id"] for h in hits] == m["search"]["message_ids"]
    if "recall" in m:
        answer = json.loads(
            cli(
                "recall",
                m["recall"]["question"],
                "--channel",
                "general",
                "--platform",
                "discord",
                "--json",
            )
        )
        assert sorted({c["message_id"] for c in answer["citations"]}) == m["recall"]["cited"]


async def check_store(m: dict[str, Any], config: MemoryConfig) -> None:
    """The rows and the admission gate: what was live is live, what was forgotten is a
    tombstone, and nobody excluded before the upgrade gets a message stored after it."""
    engine = await MemoryEngine.open(config, None)
    try:
        db = engine.store.db
        for channel in set(m["live"]) | set(m["forgotten_messages"]):
            platform, workspace, name = channel.split("/")
            rows = await db.read(
                "SELECT message_id, deleted_at IS NOT NULL, text FROM messages"
                " WHERE platform = ? AND workspace = ? AND channel = ?",
                (platform, workspace, name),
            )
            assert sorted(r[0] for r in rows if not r[1]) == sorted(m["live"].get(channel, []))
            gone = sorted(r[0] for r in rows if r[1])
            assert gone == sorted(m["forgotten_messages"].get(channel, []))
            assert all(r[2] == "" for r in rows if r[1])
        for platform, workspace, user_id, alias in m["aliases"]:
            assert await engine.store.channels.find_user(platform, workspace, alias) == [user_id]
        general = discord(scenario.GENERAL)
        n = 0
        for platform, workspace, user_id in sorted(person_forgets(m)):
            n += 1
            (got,) = await engine.ingest_many(
                [
                    event(
                        Scope(platform=platform, workspace=workspace, channel=scenario.GENERAL),
                        user_id,
                        "Carl",
                        "Carl is back and wants to hike",
                        n,
                    )
                ]
            )
            assert got.status is IngestStatus.FORGOTTEN
            left = await db.read(
                "SELECT count(*) FROM messages WHERE platform = ? AND workspace = ?"
                " AND speaker_id = ? AND deleted_at IS NULL",
                (platform, workspace, user_id),
            )
            assert left[0][0] == 0
        for platform, workspace, user_id in m["opted_out"]:
            n += 1
            channel = next(c for c in m["live"] if c.startswith(f"{platform}/{workspace}/"))
            scope = Scope(platform=platform, workspace=workspace, channel=channel.split("/")[2])
            (got,) = await engine.ingest_many([event(scope, user_id, "Dana", "back again", n)])
            assert got.status is IngestStatus.OPTED_OUT
        for channel in m["channels_off"]:
            n += 1
            platform, workspace, name = channel.split("/")
            scope = Scope(platform=platform, workspace=workspace, channel=name)
            alice = scenario.PEOPLE["alice"][0]
            (got,) = await engine.ingest_many([event(scope, alice, "Ally", "off-channel", n)])
            assert got.status is IngestStatus.CHANNEL_OFF
        # the gate refuses those people, not everyone
        alice = scenario.PEOPLE["alice"][0]
        (got,) = await engine.ingest_many([event(general, alice, "Ally", "new plan", n + 1)])
        assert got.status is IngestStatus.STORED
    finally:
        await engine.close()


def write_exports(where: Path) -> None:
    """The scenario's exports, as the generator imported them."""
    for channel, name, lines in (
        (scenario.GENERAL, "general", scenario.GENERAL_LINES),
        (scenario.RANDOM, "random", scenario.RANDOM_LINES),
    ):
        (where / f"{name}.json").write_text(json.dumps(scenario.export(channel, name, lines)))


def check_exports(m: dict[str, Any], cli: Cli, where: Path) -> None:
    """`export user` of a forgotten person (after their refused new message) writes nothing;
    a remembered member's export still holds their live messages."""
    for platform, workspace, user_id in sorted(person_forgets(m)):
        out = where / f"export-{user_id}.json"
        argv = ["export", "user", user_id, "--platform", platform, "--workspace", workspace]
        assert main([*argv, "--out", str(out)]) != 0
        assert not out.exists()
    alice = scenario.PEOPLE["alice"][0]
    out = where / "export-alice.json"
    cli("export", "user", alice, "--platform", "discord", "--out", str(out))
    exported = {x["message_id"] for x in json.loads(out.read_text())["messages"]}
    live = {
        mid
        for key, speaker in m["speakers"].items()
        if speaker == alice
        for mid in [key.rsplit("/", 1)[1]]
    }
    assert live <= exported


def check_all(m: dict[str, Any], config: MemoryConfig, cli: Cli, where: Path) -> None:
    write_exports(where)
    check_reports(m, cli, reimport=m["steps"]["import_general"] == "ok")
    asyncio.run(check_store(m, config))
    check_exports(m, cli, where)


def ids(ms: list[dict[str, Any]]) -> list[str]:
    return [m["name"] for m in ms]


@pytest.mark.parametrize("m", SQLITE, ids=ids(SQLITE))
def test_sqlite_fixture_upgrades_and_keeps_every_guarantee(
    m: dict[str, Any],
    tmp_path: Path,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = load_sqlite(m, tmp_path)
    cli_env.setenv("SPEAKERMEM_DB_PATH", str(db))
    check_all(m, MemoryConfig(store=StoreConfig(db_path=db)), cli_runner(capsys), tmp_path)
    latest = max(today("sqlite"))
    conn = connect_sync(db, pick_driver())
    try:
        (version,) = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
    finally:
        conn.close()
    assert version == latest


BEFORE_TOMBSTONES = [m for m in SQLITE if 9 not in m["migrations"]]
ENDS = [SQLITE[0], BEFORE_TOMBSTONES[-1], SQLITE[-1]] if SQLITE else []
"""The oldest fixture, the newest from before tombstones (the issue's upgrade), the newest."""


@pytest.mark.slow
@pytest.mark.parametrize("m", ENDS, ids=ids(ENDS))
def test_sqlite_fixture_restored_from_a_backup_keeps_every_guarantee(
    m: dict[str, Any],
    tmp_path: Path,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`speakermem backup` of an upgraded old database, restored as the guide says (the
    file copied into place), answers as the old code did."""
    db = load_sqlite(m, tmp_path)
    cli_env.setenv("SPEAKERMEM_DB_PATH", str(db))
    cli = cli_runner(capsys)
    cli("backup", str(tmp_path / "backup.db"))
    db.unlink()
    restored = tmp_path / "restored.db"
    shutil.copyfile(tmp_path / "backup.db", restored)
    cli_env.setenv("SPEAKERMEM_DB_PATH", str(restored))
    check_all(m, MemoryConfig(store=StoreConfig(db_path=restored)), cli, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("m", ENDS, ids=ids(ENDS))
def test_sqlite_fixture_migrated_to_postgres_keeps_every_guarantee(
    m: dict[str, Any],
    tmp_path: Path,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
) -> None:
    """`speakermem migrate` of an old SQLite database into PostgreSQL: the copy answers
    as the old code did (tombstones, switches, opt-outs and aliases included)."""
    db = load_sqlite(m, tmp_path)
    cli = cli_runner(capsys)
    cli("migrate", "--from", f"sqlite:{db}", "--to", pg_url)
    cli_env.setenv("SPEAKERMEM_DB_URL", pg_url)
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "unused.db", db_url=pg_url))
    check_all(m, config, cli, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("m", POSTGRES, ids=ids(POSTGRES))
def test_postgres_fixture_upgrades_and_keeps_every_guarantee(
    m: dict[str, Any],
    tmp_path: Path,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
    pg_bin: Path,
) -> None:
    load_postgres(m, pg_url, pg_bin)
    cli_env.setenv("SPEAKERMEM_DB_URL", pg_url)
    config = MemoryConfig(store=StoreConfig(db_path=tmp_path / "unused.db", db_url=pg_url))
    check_all(m, config, cli_runner(capsys), tmp_path)
