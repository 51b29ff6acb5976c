"""Duplicate and out-of-order delivery: any order of create/edit/delete ends in one state.

Every sequence runs through the dispatcher (the path platform events take) into a real
SQLite store, each in its own channel of one database, with vectors made after every event
so the vector paths (an edit drops the vector, a delete removes it) are exercised too. A
record naming the message in its from_ids is committed before any event, as a Writer run
that saw the message elsewhere would: whichever way the delete arrives, it must go.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
import zipfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.events import DeleteEvent, EditEvent, Event, MessageEvent
from speakermem.integrations.cli.main import main
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Layer, NewRecord, RecordScope, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import T0
from tests.fakes import HashEmbedder

pytestmark = pytest.mark.contract

MID = "m1"
# One distinctive word per version of the text, to look each up in the FTS5 index.
WORDS = {"C": "zebrafin", "E1": "yakhorn", "E2": "walrusket"}


def events(scope: Scope) -> dict[str, Event]:
    return {
        "C": MessageEvent(
            scope=scope,
            message_id=MID,
            speaker_id="ann",
            speaker_name="Ann",
            text=f"the {WORDS['C']} plan",
            ts=T0,
        ),
        "E1": EditEvent(
            scope=scope,
            message_id=MID,
            text=f"the {WORDS['E1']} plan",
            edited_at=T0 + timedelta(minutes=1),
        ),
        "E2": EditEvent(
            scope=scope,
            message_id=MID,
            text=f"the {WORDS['E2']} plan",
            edited_at=T0 + timedelta(minutes=2),
        ),
        "D": DeleteEvent(scope=scope, message_id=MID),
    }


def citing_record() -> NewRecord:
    return NewRecord(
        layer=Layer.PROFILE,
        record_scope=RecordScope.PERSON,
        content="Ann has a plan",
        source="ann",
        owner="ann",
        event="",
        time=T0,
        session_id=0,
        from_ids=(MID,),
        writer_model="test",
        prompt_version="t1",
    )


async def run_sequence(
    dispatcher: Dispatcher, engine: MemoryEngine, scope: Scope, seq: Sequence[str]
) -> None:
    evs = events(scope)
    cited = False
    for name in seq:
        await dispatcher.handle(evs[name])
        if name == "C" and not cited:
            # records cite stored messages (the commit-time check drops any other): one
            # derived from the message as soon as it is there, forgotten with it after a D
            await engine.store.records.add_records(scope, [citing_record()], None)
            cited = True
        await engine.embed_pending()


async def state(engine: MemoryEngine, embedder: HashEmbedder, scope: Scope) -> dict[str, Any]:
    """Everything a message leaves behind in its channel, the primary key aside."""
    pk = await engine.store.channels.lookup(scope)
    assert pk is not None
    db = engine.store.db
    rows = await db.read(
        "SELECT id, message_id, text, speaker_id, speaker_name, deleted_at IS NOT NULL,"
        " edited_at, embedded, session_id, turn_index FROM messages WHERE channel_pk = ?",
        (pk,),
    )
    fts = {
        word: (
            await db.read(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?",
                (f"{word} AND channel_tag : c{pk}",),
            )
        )[0][0]
        for word in WORDS.values()
    }
    ids = [r[0] for r in rows]
    vectors = await engine.store.messages.vectors(ids)
    bits = await db.read_in("SELECT rowid FROM messages_vec WHERE rowid IN ({marks})", ids)
    # the float vector, where there is one, must be the current text's
    for r in rows:
        if r[0] in vectors:
            want = embedder.embed_sync([f"{r[4]}: {r[2]}"])[0]
            assert (vectors[r[0]] == want).all()
    records = await db.read(
        "SELECT count(*) FROM records r, json_each(r.from_ids) j"
        " WHERE r.channel_pk = ? AND j.value = ?",
        (pk, MID),
    )
    citing_deleted = await db.read(
        "SELECT count(*) FROM record_sources s JOIN messages m ON m.id = s.message_pk"
        " WHERE m.channel_pk = ? AND m.deleted_at IS NOT NULL",
        (pk,),
    )
    early = await db.read(
        "SELECT count(*) FROM early_changes WHERE platform = ? AND workspace = ? AND channel = ?",
        scope.key(),
    )
    return {
        "messages": [tuple(r[1:]) for r in rows],
        "fts": fts,
        "vectors": len(vectors),
        "vec_bits": len(bits),
        "records_citing": records[0][0],
        "record_sources_on_deleted": citing_deleted[0][0],
        "early": early[0][0],
    }


def sequences(names: Sequence[str], sample_all_doubled: int, seed: int) -> list[tuple[str, ...]]:
    """Every order of the events; every order with one event delivered twice; and a seeded
    sample of the orders with every event delivered twice."""
    out: set[tuple[str, ...]] = set(itertools.permutations(names))
    for dup in names:
        out.update(itertools.permutations([*names, dup]))
    doubled = sorted(set(itertools.permutations([*names, *names])))
    out.update(random.Random(seed).sample(doubled, min(sample_all_doubled, len(doubled))))
    return sorted(out)


@pytest.fixture
async def dispatcher(engine: MemoryEngine) -> Dispatcher:
    return Dispatcher(engine, RecallPipeline(engine))


@pytest.mark.slow
@pytest.mark.sqlite_only(
    "state() reads FTS5 MATCH and json_each (PostgreSQL twin: test_pg_search.py)"
)
@pytest.mark.parametrize("with_delete", [True, False], ids=["create-edits-delete", "create-edits"])
async def test_any_order_with_duplicates_ends_in_the_in_order_state(
    engine: MemoryEngine, embedder: HashEmbedder, dispatcher: Dispatcher, with_delete: bool
) -> None:
    names = ["C", "E1", "E2", "D"] if with_delete else ["C", "E1", "E2"]
    base = Scope(platform="test", workspace="w1", channel="in-order")
    await run_sequence(dispatcher, engine, base, names)
    expected = await state(engine, embedder, base)
    if with_delete:
        assert [m[1:5] for m in expected["messages"]] == [("", "", "", True)]
        assert expected["fts"] == dict.fromkeys(WORDS.values(), 0)
        assert expected["vectors"] == expected["vec_bits"] == 0
        assert expected["records_citing"] == 0
    else:  # the newest edit's text, indexed and embedded; the record stands
        assert [m[1] for m in expected["messages"]] == [f"the {WORDS['E2']} plan"]
        assert expected["fts"] == {WORDS["C"]: 0, WORDS["E1"]: 0, WORDS["E2"]: 1}
        assert expected["vectors"] == expected["vec_bits"] == 1
        assert expected["records_citing"] == 1
    assert expected["early"] == 0

    cases = sequences(names, sample_all_doubled=80, seed=9)
    assert len(cases) > (200 if with_delete else 100)
    for i, seq in enumerate(cases):
        scope = Scope(platform="test", workspace="w1", channel=f"case{i}")
        await run_sequence(dispatcher, engine, scope, seq)
        got = await state(engine, embedder, scope)
        assert got == expected, f"order {seq}"
    assert not dispatcher.stats.errors
    # the FTS5 index as a whole still matches its content
    await engine.store.db.writer.execute(
        "INSERT INTO messages_fts(messages_fts, rank) VALUES('integrity-check', 1)"
    )


async def test_the_newest_edit_wins_whatever_arrives_last(
    engine: MemoryEngine, dispatcher: Dispatcher
) -> None:
    """Edits at five times in every order, before and after the create."""
    names = ["C", *(f"E{k}" for k in range(5))]
    for i, seq in enumerate(itertools.permutations(names)):
        if i % 7:  # a spread of the 720 orders keeps the test short
            continue
        scope = Scope(platform="test", workspace="w1", channel=f"edits{i}")
        evs: dict[str, Event] = dict(events(scope))
        for k in range(5):
            evs[f"E{k}"] = EditEvent(
                scope=scope,
                message_id=MID,
                text=f"version {k}",
                edited_at=T0 + timedelta(minutes=1 + k),
            )
        for name in seq:
            await dispatcher.handle(evs[name])
        stored = await engine.store.messages.get(scope, MID)
        assert stored is not None, seq
        assert (stored.text, stored.edited_at) == ("version 4", T0 + timedelta(minutes=5)), seq


async def test_an_edit_repeating_the_text_moves_only_the_time(
    engine: MemoryEngine, dispatcher: Dispatcher, scope: Scope
) -> None:
    evs = events(scope)
    same = [
        EditEvent(
            scope=scope, message_id=MID, text="the same words", edited_at=T0 + timedelta(minutes=k)
        )
        for k in (1, 2)
    ]
    finals: list[tuple[str, Any]] = []
    for order in ([same[0], same[1]], [same[1], same[0]]):
        s = Scope(platform="test", workspace="w1", channel=f"same{len(finals)}")
        await dispatcher.handle(evs["C"].model_copy(update={"scope": s}))
        for ev in order:
            await dispatcher.handle(ev.model_copy(update={"scope": s}))
        stored = await engine.store.messages.get(s, MID)
        assert stored is not None
        finals.append((stored.text, stored.edited_at))
    assert finals == [("the same words", T0 + timedelta(minutes=2))] * 2


async def test_an_early_edit_after_its_early_delete_keeps_no_text(
    engine: MemoryEngine, dispatcher: Dispatcher, scope: Scope
) -> None:
    evs = events(scope)
    await dispatcher.handle(evs["D"])
    await dispatcher.handle(evs["E2"])
    rows = await engine.store.db.read("SELECT deleted_at IS NOT NULL, text FROM early_changes")
    assert [tuple(r) for r in rows] == [(1, None)]
    await dispatcher.handle(evs["C"])
    assert dispatcher.stats.handled["message_deleted"] == 1
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    stored = await engine.store.messages.get(scope, MID)
    assert stored is not None and stored.deleted and stored.text == ""


async def test_early_edit_text_is_kept_a_day_at_most(
    engine: MemoryEngine, dispatcher: Dispatcher, scope: Scope
) -> None:
    evs = events(scope)
    await dispatcher.handle(evs["E1"])
    db = engine.store.db
    assert (await db.read("SELECT count(*) FROM early_changes"))[0][0] == 1
    async with db.transaction() as tx:  # as if it had arrived a day and a minute ago
        await tx.execute("UPDATE early_changes SET received_at = received_at - 86460")
    other = evs["C"].model_copy(update={"message_id": "m0"})
    await dispatcher.handle(other)  # any ingest clears expired early edits
    assert (await db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    await dispatcher.handle(evs["C"])
    stored = await engine.store.messages.get(scope, MID)
    assert stored is not None and stored.text == f"the {WORDS['C']} plan"


async def test_memory_off_keeps_no_early_edit_but_still_edits_what_it_holds(
    engine: MemoryEngine, dispatcher: Dispatcher, scope: Scope
) -> None:
    evs = events(scope)
    await dispatcher.handle(evs["C"])
    waiting = EditEvent(scope=scope, message_id="m8", text="early words", edited_at=T0)
    await dispatcher.handle(waiting)
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 1
    await dispatcher.governance.set_channel(scope, False, actor="admin")  # drops its text
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    unknown = EditEvent(scope=scope, message_id="m9", text="secret words", edited_at=T0)
    await dispatcher.handle(unknown)
    assert (await engine.store.db.read("SELECT count(*) FROM early_changes"))[0][0] == 0
    assert dispatcher.stats.ignored["channel_off"] == 1
    await dispatcher.handle(evs["E2"])  # the held message still takes its edit
    stored = await engine.store.messages.get(scope, MID)
    assert stored is not None and stored.text == f"the {WORDS['E2']} plan"


# --- imports run twice ----------------------------------------------------------------------

SLACK_DIR = Path(__file__).parent / "fixtures" / "slack_export_small"


@pytest.mark.sqlite_only("reads the imported SQLite file directly with sqlite3")
def test_slack_export_imported_twice_stores_nothing_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(The Discord export's second run is covered in test_reliability_import.py.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEAKERMEM_EMBEDDER", "none")
    archive = tmp_path / "slack-export.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(SLACK_DIR.rglob("*.json")):
            zf.write(path, path.relative_to(SLACK_DIR).as_posix())
    db = tmp_path / "s.db"
    assert main(["--db", str(db), "import", "slack-export", str(archive)]) == 0
    first = " ".join(capsys.readouterr().err.split())
    assert "imported 5 messages" in first

    def snapshot() -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(db)
        try:
            return (
                conn.execute(
                    "SELECT channel, message_id, text, session_id, turn_index, segment_id"
                    " FROM messages ORDER BY id"
                ).fetchall()
                + conn.execute(
                    "SELECT 'segments', count(*), sum(n_messages), 0, 0, 0 FROM segments"
                ).fetchall()
            )
        finally:
            conn.close()

    before = snapshot()
    assert main(["--db", str(db), "import", "slack-export", str(archive)]) == 0
    second = " ".join(capsys.readouterr().err.split())
    assert "imported 0 messages" in second
    assert snapshot() == before
