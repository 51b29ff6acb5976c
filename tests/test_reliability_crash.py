"""kill -9 inside a Writer commit and inside a forgetting cascade, then restart.

The child process runs the real code on the test's database file. It installs a SQLite
trace callback (`set_trace_callback`, on the store's writer connection) that blocks the
statement it is waiting for, a statement that only runs inside the transaction under test,
after that transaction has already changed rows. It says so on stdout and the test sends
SIGKILL while it is blocked: the process dies mid-transaction, exactly as under kill -9.

After the kill: SQLite's integrity check passes, nothing of the open transaction is visible
(no half-applied commit or cascade batch), and running the same work again completes it
once: the result equals a control database where the work ran without a crash.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import GovernanceConfig, MemoryConfig, StoreConfig, WriterConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Layer, NewRecord, RecordScope, Scope
from speakermem.memory.store.sqlite.driver import connect_sync, pick_driver
from speakermem.memory.writer.runner import Writer
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder
from tests.llm_server import LLMServer, Reply

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
GENERAL = Scope(platform="test", workspace="w1", channel="general")
FAST = WriterConfig(retry_base_s=0.01, retry_max_s=0.05)

BLOCKER = """
import sys, time

def blocker(prefix, nth):
    # SQLite traces a statement again each time it resumes after a trigger or virtual
    # table call; the expanded text (with its bound values) tells executions apart.
    seen = set()
    def trace(sql):
        if sql.lstrip().startswith(prefix) and sql not in seen:
            seen.add(sql)
            if len(seen) == nth:
                sys.stdout.write("blocked\\n")
                sys.stdout.flush()
                time.sleep(600)  # inside the transaction: the parent sends SIGKILL now
    return trace
"""

WRITER_CHILD = BLOCKER + textwrap.dedent(
    """
    import asyncio
    from pathlib import Path
    from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
    from speakermem.memory.config import MemoryConfig, StoreConfig, WriterConfig
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.writer.runner import Writer

    async def main(db, url, prefix):
        engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=Path(db))))
        await engine.store.db.writer.set_trace_callback(blocker(prefix, 1))
        llm = OpenAICompatLLM(url, "k", "test-model", 5.0, max_retries=0)
        writer = Writer(engine, llm, WriterConfig(retry_base_s=0.01, retry_max_s=0.05))
        print("finished", await writer.flush_due())

    asyncio.run(main(*sys.argv[1:4]))
    """
)

CASCADE_CHILD = BLOCKER + textwrap.dedent(
    """
    import asyncio
    from pathlib import Path
    from speakermem.memory.config import GovernanceConfig, MemoryConfig, StoreConfig
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.governance.service import Governance

    async def main(db, action, now, prefix, nth):
        cfg = MemoryConfig(
            store=StoreConfig(db_path=Path(db)), governance=GovernanceConfig(forget_batch=2)
        )
        engine = await MemoryEngine.open(cfg)
        await engine.store.db.writer.set_trace_callback(blocker(prefix, int(nth)))
        gov = Governance(engine)
        if action == "forget-user":
            await gov.forget_user("test", "w1", "alice", actor="admin")
        else:
            await gov.apply_retention(actor="admin", now=float(now))
        print("finished")

    asyncio.run(main(*sys.argv[1:6]))
    """
)


async def kill_inside(script: str, *args: str) -> None:
    """Run the child until its trace callback blocks, then SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line != b"blocked\n":
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            raise AssertionError(f"child did not block: {line!r} {err.decode()[-2000:]}")
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


# --- the Writer's commit --------------------------------------------------------------------

SMALL = [
    ("Alice", "I work as a nurse at the city hospital."),
    ("Bob", "I adopted a dog named Rex."),
    ("Alice", "Nice, see you Friday."),
]
ACTIONS = [
    {
        "type": "ADD",
        "layer": "core",
        "source": "alice",
        "owner": "alice",
        "content": "Alice works as a nurse at the city hospital.",
        "refs": ["m1"],
    },
    {
        "type": "ADD",
        "layer": "core",
        "source": "bob",
        "owner": "bob",
        "content": "Bob adopted a dog named Rex.",
        "refs": ["m2"],
    },
]


async def writer_state(engine: MemoryEngine) -> dict[str, Any]:
    db = engine.store.db
    one = {
        "segments": "SELECT group_concat(state) FROM segments",
        "records": "SELECT count(*) FROM records",
        "record_sources": "SELECT count(*) FROM record_sources",
        "writer_runs": "SELECT count(*) FROM writer_runs",
        "fts_nurse": "SELECT count(*) FROM records_fts WHERE records_fts MATCH 'nurse'",
        "fts_rex": "SELECT count(*) FROM records_fts WHERE records_fts MATCH 'rex'",
    }
    return {k: (await db.read(sql))[0][0] for k, sql in one.items()}


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT OR IGNORE INTO record_sources",
        "UPDATE segments SET state = 'done'",
        "INSERT INTO writer_runs",
    ],
    ids=["after-first-record", "marking-done", "logging-the-run"],
)
async def test_kill_9_inside_the_writer_commit_then_restart_commits_once(
    engine: MemoryEngine, llm_server: LLMServer, statement: str
) -> None:
    await engine.ingest_many(
        [msg(GENERAL, f"g{i}", who, text, i) for i, (who, text) in enumerate(SMALL)]
    )
    await engine.store.segments.close_channel(GENERAL)
    llm_server.default = Reply(content=json.dumps({"actions": ACTIONS}))
    await kill_inside(WRITER_CHILD, str(engine.store.db.path), llm_server.base_url, statement)
    assert len(llm_server.requests) == 1  # the reply came; the commit was under way

    assert integrity(engine.store.db.path) == "ok"
    assert await writer_state(engine) == {
        "segments": "pending",
        "records": 0,
        "record_sources": 0,
        "writer_runs": 0,
        "fts_nurse": 0,
        "fts_rex": 0,
    }
    async with OpenAICompatLLM(llm_server.base_url, "k", "test-model", 5.0, max_retries=0) as llm:
        writer = Writer(engine, llm, FAST)
        (again,) = await writer.flush_due()
        assert again.status == "committed" and again.accepted == 2
        assert await writer.flush_due() == []
    assert len(llm_server.requests) == 2
    assert await writer_state(engine) == {
        "segments": "done",
        "records": 2,
        "record_sources": 2,
        "writer_runs": 1,
        "fts_nurse": 1,
        "fts_rex": 1,
    }


# --- the forgetting cascade -----------------------------------------------------------------


def rec(
    content: str, from_ids: tuple[str, ...], owner: str, source: str, supersedes: int | None = None
) -> NewRecord:
    return NewRecord(
        layer=Layer.PROFILE,
        record_scope=RecordScope.GROUP if owner == "GROUP" else RecordScope.PERSON,
        content=content,
        source=source,
        owner=owner,
        event="",
        time=T0,
        session_id=0,
        from_ids=from_ids,
        supersedes=supersedes,
        writer_model="test",
        prompt_version="t1",
    )


async def seed(db: Path, *, retention: bool) -> None:
    """Twelve messages (Alice on even minutes, Bob on odd) with vectors, and records with
    chains whose links cross the cascade's batches."""
    embedder = HashEmbedder()
    engine = await MemoryEngine.open(MemoryConfig(store=StoreConfig(db_path=db)), embedder)
    try:
        await engine.ingest_many(
            [
                msg(GENERAL, f"{'ab'[i % 2]}{i // 2}", ("Alice", "Bob")[i % 2], f"note{i} w{i}", i)
                for i in range(12)
            ]
        )
        await engine.embed_pending()
        records = engine.store.records

        async def add(r: NewRecord) -> int:
            (rid,) = await records.add_records(GENERAL, [r], embedder.embed_sync([r.content]))
            return rid

        v1 = await add(rec("alice one", ("a0",), "alice", "alice"))
        v2 = await add(rec("alice two", ("a0", "a2"), "alice", "alice", v1))
        await add(rec("alice three", ("a4", "b1"), "alice", "alice", v2))
        await add(rec("group plan", ("a1", "b2"), "GROUP", "bob"))
        await add(rec("bob alone", ("b3",), "bob", "bob"))
        await add(rec("bob on alice", ("b4",), "alice", "bob"))
        b1 = await add(rec("bob one", ("b0", "a3"), "bob", "bob"))
        await add(rec("bob two", ("b5", "a5"), "bob", "bob", b1))
        if retention:
            await Governance(engine).set_retention("test", "w1", "general", 1, actor="admin")
    finally:
        await engine.close()


def cascade_state(db: Path) -> dict[str, Any]:
    conn = connect_sync(db, pick_driver("auto"))  # a driver that loads sqlite-vec
    try:

        def q(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]

        messages = q(
            "SELECT message_id, text, speaker_name, deleted_at IS NOT NULL FROM messages"
            " ORDER BY id"
        )
        fts = {
            mid: q("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (f"w{i}",))[0][0]
            for i, (mid, *_rest) in enumerate(messages)
        }
        vectors = q(
            "SELECT m.message_id, (SELECT count(*) FROM message_vectors v WHERE v.id = m.id),"
            " (SELECT count(*) FROM messages_vec b WHERE b.rowid = m.id) FROM messages m"
            " ORDER BY m.id"
        )
        records = q(
            "SELECT id, content, state, from_ids, supersedes, superseded_by, chain_root"
            " FROM records ORDER BY id"
        )
        return {
            "messages": messages,
            "fts": fts,
            "vectors": vectors,
            "records": records,
            "record_sources": q("SELECT record_id, message_pk FROM record_sources ORDER BY 1, 2"),
            "records_fts": q("SELECT count(*) FROM records_fts")[0][0],
            "records_vec": sorted(r[0] for r in q("SELECT rowid FROM records_vec")),
            "rederive": q("SELECT owner, source, from_ids, reason FROM rederive_queue ORDER BY id"),
            "users": q("SELECT user_id FROM users ORDER BY 1"),
            "audit": q("SELECT actor, action FROM audit_log ORDER BY id"),
        }
    finally:
        conn.close()


def assert_whole_batches(state: dict[str, Any], targets: list[str], batch: int) -> int:
    """Each target message is wholly forgotten or wholly intact; returns how many went."""
    vectors = {r[0]: (r[1], r[2]) for r in state["vectors"]}
    gone = 0
    for mid, text, name, deleted in state["messages"]:
        if mid not in targets:
            assert not deleted and text and state["fts"][mid] == 1, mid
            continue
        if deleted:
            gone += 1
            assert (text, name, state["fts"][mid], vectors[mid]) == ("", "", 0, (0, 0)), mid
        else:
            assert text and name and state["fts"][mid] == 1 and vectors[mid] == (1, 1), mid
    assert gone % batch == 0 or gone == len(targets)
    # every chain still has one head and links that point both ways
    by_id = {r[0]: r for r in state["records"]}
    heads: dict[int, int] = {}
    for rid, _content, st, _from, sup, sup_by, root in state["records"]:
        if st == "active":
            heads[root] = heads.get(root, 0) + 1
            assert sup_by is None
        if sup is not None:
            assert by_id[sup][5] == rid
        if sup_by is not None:
            assert by_id[sup_by][4] == rid
    assert all(n == 1 for n in heads.values())
    assert set(heads) == {r[6] for r in state["records"]}
    # no record names a forgotten message of its channel
    forgotten = {m[0] for m in state["messages"] if m[3]}
    for r in state["records"]:
        assert not forgotten & set(json.loads(r[3])), r
    return gone


# (action, the messages it forgets, `now` for retention)
CASCADES = {
    "forget-user": (["a0", "a1", "a2", "a3", "a4", "a5"], 0.0),
    # one-day retention at T0 + 1 day + 9 min: the messages of minutes 0-8 expire
    "retention": (
        ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3", "a4"],
        (T0 + timedelta(days=1, minutes=9)).timestamp(),
    ),
}


@pytest.mark.parametrize(
    ("action", "statement", "nth", "committed"),
    [
        # batch 2 has withdrawn its records and dropped its vectors, the text is next
        ("forget-user", "UPDATE messages SET text = ''", 2, 2),
        ("forget-user", "DELETE FROM records WHERE", 1, 0),  # batch 1, sources already gone
        ("retention", "UPDATE messages SET text = ''", 3, 4),
        ("retention", "UPDATE records SET supersedes", 2, 0),  # batch 1, relinking a chain
    ],
)
async def test_kill_9_inside_a_cascade_then_rerun_completes_it_once(
    tmp_path: Path, action: str, statement: str, nth: int, committed: int
) -> None:
    targets, now = CASCADES[action]
    control, crashed = tmp_path / "control.db", tmp_path / "crashed.db"
    await seed(control, retention=action == "retention")
    await seed(crashed, retention=action == "retention")
    before = cascade_state(crashed)
    assert assert_whole_batches(before, targets, 2) == 0

    await kill_inside(CASCADE_CHILD, str(crashed), action, str(now), statement, str(nth))
    assert integrity(crashed) == "ok"
    partial = cascade_state(crashed)
    # the batches committed before the kill stay; the open one left nothing behind
    assert assert_whole_batches(partial, targets, 2) == committed
    forgotten = {m[0] for m in partial["messages"] if m[3]}
    kept = [r for r in before["records"] if not forgotten & set(json.loads(r[3]))]
    assert [r[0] for r in partial["records"]] == [r[0] for r in kept]
    assert partial["records_vec"] == [r[0] for r in kept] and partial["records_fts"] == len(kept)
    assert partial["audit"] == before["audit"]  # the action never finished, so not logged

    cfg = GovernanceConfig(forget_batch=2)
    for db in (control, crashed):
        engine = await MemoryEngine.open(
            MemoryConfig(store=StoreConfig(db_path=db), governance=cfg)
        )
        try:
            gov = Governance(engine)
            if action == "forget-user":
                await gov.forget_user("test", "w1", "alice", actor="admin")
            else:
                await gov.apply_retention(actor="admin", now=now)
        finally:
            await engine.close()
    final = cascade_state(crashed)
    assert assert_whole_batches(final, targets, 2) == len(targets)
    assert final == cascade_state(control)
    assert integrity(crashed) == "ok"
