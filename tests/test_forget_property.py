"""Forgetting holds under any interleaving (issue 27): a hypothesis state machine.

Random sequences of: posting messages (live, through the dispatcher), edits, platform
deletes, forgetting a message or a person, opting out and in, switching a channel off and
on, a store another process holds locked (events wait in the spill) and the replay,
Writer commits (some with the
LLM's answer held until a forget has returned), re-imports and catch-up (redelivery of the
channel's history), embedding, and restarts (the store closed and opened again).

After every step, against a model of what must hold:
- the live messages are exactly those the model admitted (the admission gate on every path);
- no word of a forgotten or deleted message, nor of an edit the gate refused, is reachable:
  messages, records, the full-text index, early edits, the spill file, `export user`,
  `/recall`; no vector is left without its live message or record;
- every record cites live messages only, nothing is owned by or sourced from a forgotten
  person (or an opted-out one, after they opted out), and no record names a forgotten
  person whose name the store knew; a forgotten person has no name row.

The full suite runs a bounded number of examples (about a minute on a busy machine; the
module is `slow`, out of the fast tier); the longer run is
`python -m pytest -m slow tests/test_forget_property.py`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from speakermem.bot.catchup import CatchUp
from speakermem.bot.dispatch import Dispatcher
from speakermem.bot.spill import Spill
from speakermem.integrations.llm.openai_compat import OpenAICompatLLM
from speakermem.memory.config import (
    IngestConfig,
    MemoryConfig,
    RecallConfig,
    StoreConfig,
    WriterConfig,
)
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import DeleteEvent, EditEvent, MessageEvent, Scope
from speakermem.memory.query.pipeline import AccessDenied, RecallPipeline, RecallRequest
from speakermem.memory.writer.runner import Writer
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder
from tests.llm_server import Handler, Item, LLMServer, Reply
from tests.test_commit_check import HeldAnswer, derive_everything
from tests.test_forget_failures import History
from tests.test_reliability_store import hold_write_lock

pytestmark = pytest.mark.slow

PEOPLE = {"alice": "Alice", "bob": "Bob", "carol": "Carol"}
CHANNELS = ("general", "side")
T = TypeVar("T")


def scope_of(channel: str) -> Scope:
    return Scope(platform="test", workspace="w1", channel=channel)


def derive_and_mention(body: dict[str, Any]) -> Item:
    """The derive-everything Writer, plus a GROUP record that names every member, quoting
    the first message only (so it names people whose messages it does not cite); and, as a
    gullible model would, the first message pinned on the last speaker and on the group."""
    reply = derive_everything(body)
    actions = json.loads(reply.content or "{}")["actions"]
    first = next((a for a in actions if a.get("type") == "ADD"), None)
    last = next((a for a in reversed(actions) if a.get("layer") == "core"), None)
    if first is not None and last is not None:
        borrowed = {**first, "source": last["source"], "owner": last["source"]}
        one_voice = {**first, "layer": "insight", "source": "GROUP", "owner": "GROUP"}
        # first: the action budget (two a message) cuts what comes last
        actions[:0] = [borrowed, {**one_voice, "content": f"All agreed: {first['content']}"}]
    if first is not None:
        actions.append(
            {
                "type": "ADD",
                "layer": "insight",
                "source": first["source"],
                "owner": "GROUP",
                "content": f"Alice, Bob and Carol came up: {first['content']}",
                "refs": first["refs"],
            }
        )
    return Reply(content=json.dumps({"actions": actions}))


class HeldMention(HeldAnswer):
    async def __call__(self, body: dict[str, Any]) -> Item:
        self.arrived.set()
        await self.release.wait()
        return derive_and_mention(body)


@dataclass
class Posted:
    event: MessageEvent
    words: set[str] = field(default_factory=set)
    state: str = "absent"
    """absent (never stored, may still arrive), live, gone (a tombstone: forever)."""


class ForgetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="speakermem-forget-"))
        self.n = 0
        self.posted: dict[str, Posted] = {}
        self.forbidden: set[str] = set()
        self.forgotten: set[str] = set()
        self.named: set[str] = set()  # people whose name the store has learnt (a message)
        self.names_forgotten: set[str] = set()  # forgotten people whose names it knew
        self.deleted_early: set[str] = set()  # deleted before the store held them
        self.opted_out: dict[str, int] = {}  # person -> newest record id when they opted out
        self.off: set[str] = set()
        self.queue: list[str] = []  # message ids of the creates waiting in the spill
        self.full = False
        self.holder: subprocess.Popen[str] | None = None
        self.server = LLMServer()
        self.run(self.server.start())
        self.run(self._open())

    # ---- plumbing -----------------------------------------------------------------------

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _open(self) -> None:
        config = MemoryConfig(
            # a held write lock fails a write within a tenth of a second
            store=StoreConfig(db_path=self.dir / "t.db", busy_timeout_ms=10, lock_wait_s=0.05),
            ingest=IngestConfig(segment_window=2),
            recall=RecallConfig(interaction_catchup=0),  # /recall only reads
            writer=WriterConfig(retry_base_s=0.01, retry_max_s=0.02, gate_lexical_threshold=0.0),
        )
        self.engine = await MemoryEngine.open(config, HashEmbedder())
        self.gov = Governance(self.engine)
        self.spill_path = self.dir / "t.db.spill.jsonl"
        self.d = Dispatcher(
            self.engine,
            RecallPipeline(self.engine),
            governance=self.gov,
            spill=Spill(self.spill_path),
            spill_retry_s=1e9,  # replays only when a rule says so
        )
        self.llm = OpenAICompatLLM(
            self.server.base_url, "test-key", "test-model", 30.0, "json_schema", max_retries=0
        )
        self.writer = Writer(self.engine, self.llm, config.writer)
        if not self.full:  # what the bot does at start: the spill left behind goes in first
            await self.d.replay_spill()

    async def _close(self) -> None:
        await self.llm.aclose()
        await self.engine.close()

    def teardown(self) -> None:
        try:
            self._unlock()
            self.run(self._close())
            self.run(self.server.stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def excluded(self, person: str) -> bool:
        return person in self.forgotten or person in self.opted_out

    def admit(self, ids: list[str]) -> None:
        """The model's admission gate, for creates reaching the store now (in order)."""
        for mid in ids:
            p = self.posted[mid]
            ev = p.event
            if p.state != "absent":
                continue  # a duplicate (a tombstone stays a tombstone)
            if ev.scope.channel in self.off or self.excluded(ev.speaker_id):
                continue
            p.state = "live"
            self.named.add(ev.speaker_id)

    def gone(self, mid: str) -> None:
        p = self.posted[mid]
        if p.state == "absent":
            self.deleted_early.add(mid)
        p.state = "gone"
        self.forbidden |= p.words
        self.queue = [q for q in self.queue if q != mid]

    def live_ids(self) -> set[str]:
        return {mid for mid, p in self.posted.items() if p.state == "live"}

    # ---- rules --------------------------------------------------------------------------

    @rule(
        people=st.lists(st.sampled_from(sorted(PEOPLE)), min_size=1, max_size=3),
        channel=st.sampled_from(CHANNELS),
    )
    def post(self, people: list[str], channel: str) -> None:
        for person in people:
            self.n += 1
            word = f"zq{self.n}vk"
            mid = f"m{self.n}"
            ev = msg(scope_of(channel), mid, PEOPLE[person], f"note {word} here", self.n)
            self.posted[mid] = Posted(ev, {word})
            before = self.d.spill.count if self.d.spill else 0
            assert self.run(self.d.handle(ev))
            if self.d.spill is not None and self.d.spill.count > before:
                self.queue.append(mid)  # kept: the store was full, or earlier events wait
            else:
                self.admit([mid])

    @precondition(lambda self: not self.full and not self.queue and bool(self.live_ids()))
    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        live = sorted(self.live_ids())
        mid = data.draw(st.sampled_from(live))
        p = self.posted[mid]
        self.n += 1
        word = f"ed{self.n}vk"
        ev = EditEvent(
            scope=p.event.scope,
            message_id=mid,
            text=f"edited {word} now",
            edited_at=T0,
            author_id=p.event.speaker_id,
        )
        assert self.run(self.d.handle(ev))
        if self.excluded(p.event.speaker_id):
            self.forbidden.add(word)  # the gate keeps no text of it
        else:
            p.words.add(word)

    @precondition(lambda self: not self.full and bool(self.posted))
    @rule(data=st.data())
    def platform_delete(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.posted)))
        ev = DeleteEvent(scope=self.posted[mid].event.scope, message_id=mid)
        assert self.run(self.d.handle(ev))
        self.gone(mid)

    @precondition(lambda self: not self.full and bool(self.live_ids()))
    @rule(data=st.data())
    def forget_message(self, data: st.DataObject) -> None:
        live = sorted(self.live_ids())
        mid = data.draw(st.sampled_from(live))
        self.run(self.gov.forget_message(self.posted[mid].event.scope, mid, actor="test"))
        self.gone(mid)

    def _forgot(self, person: str) -> None:
        self.forgotten.add(person)
        if person in self.named:  # a name the store never saw cannot be recognised
            self.names_forgotten.add(person)
        for mid, p in self.posted.items():
            if p.event.speaker_id == person:
                if p.state == "live":
                    self.gone(mid)
                self.queue = [q for q in self.queue if q != mid]

    @precondition(lambda self: not self.full)
    @rule(person=st.sampled_from(sorted(PEOPLE)))
    def forget_person(self, person: str) -> None:
        self.run(self.gov.forget_user("test", "w1", person, actor="test"))
        self._forgot(person)

    @precondition(lambda self: not self.full)
    @rule(person=st.sampled_from(sorted(PEOPLE)))
    def opt_out(self, person: str) -> None:
        self.run(self.gov.opt_out("test", "w1", person, forget=False, actor="test"))
        newest = self.run(self.engine.store.db.read("SELECT coalesce(max(id), 0) FROM records"))
        self.opted_out.setdefault(person, int(newest[0][0]))

    @precondition(lambda self: not self.full)
    @rule(person=st.sampled_from(sorted(PEOPLE)))
    def opt_in(self, person: str) -> None:
        self.run(self.gov.opt_in("test", "w1", person, actor="test"))
        self.opted_out.pop(person, None)
        self.forgotten.discard(person)
        self.names_forgotten.discard(person)

    @precondition(lambda self: not self.full)
    @rule(channel=st.sampled_from(CHANNELS), on=st.booleans())
    def switch_channel(self, channel: str, on: bool) -> None:
        self.run(self.gov.set_channel(scope_of(channel), on, actor="test"))
        (self.off.discard if on else self.off.add)(channel)

    @precondition(lambda self: not self.full)
    @rule()
    def store_locked(self) -> None:
        """Another process holds the write lock: writes fail (StoreBusy) and events wait
        in the spill, as when the disk is full."""
        self.holder = hold_write_lock(self.dir / "t.db", 600.0)
        self.full = True

    @precondition(lambda self: self.full)
    @rule()
    def store_unlocked(self) -> None:
        self._unlock()

    def _unlock(self) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait(10)
            self.holder = None
        self.full = False

    @precondition(lambda self: not self.full)
    @rule(
        people=st.lists(st.sampled_from(sorted(PEOPLE)), min_size=1, max_size=3),
        channel=st.sampled_from(CHANNELS),
        how=st.sampled_from(["person", "delete"]),
        data=st.data(),
    )
    def spill_then_forget(
        self, people: list[str], channel: str, how: str, data: st.DataObject
    ) -> None:
        """Messages wait in the spill while the store cannot take them; it can again, and one
        of them (or its author) is forgotten before any replay."""
        self.store_locked()
        first = self.n + 1
        self.post(people, channel)
        self.store_unlocked()
        mid = f"m{data.draw(st.integers(first, self.n))}"
        if how == "person":
            self.forget_person(self.posted[mid].event.speaker_id)
        else:
            assert self.run(self.d.handle(DeleteEvent(scope=scope_of(channel), message_id=mid)))
            self.gone(mid)

    @precondition(lambda self: not self.full and bool(self.queue))
    @rule()
    def replay(self) -> None:
        self.run(self.d.replay_spill())
        waiting, self.queue = self.queue, []
        self.admit(waiting)
        assert self.d.spill is not None and self.d.spill.count == 0

    @precondition(lambda self: not self.full)
    @rule(
        people=st.lists(st.sampled_from(sorted(PEOPLE)), min_size=1, max_size=3),
        channel=st.sampled_from(CHANNELS),
        race=st.sampled_from(["none", "message", "person", "delete"]),
        data=st.data(),
    )
    def writer_commits(
        self, people: list[str], channel: str, race: str, data: st.DataObject
    ) -> None:
        """A few new messages, then the Writer writes the oldest pending segment; with a
        race, something of it is forgotten while the LLM's answer is held, and the answer
        arrives after the forget returned."""
        self.post(people, channel)
        store = self.engine.store
        self.run(store.segments.close_idle(0.0))
        due = self.run(store.segments.due(limit=1))
        if not due:
            return
        segment = due[0]
        shown = [m.message_id for m in self.run(store.messages.in_segment(segment.id))]
        if race == "none" or not shown:
            self.server.default = Handler(derive_and_mention)
            self.run(self.writer.flush(segment))
            return
        mid = data.draw(st.sampled_from(shown))
        held = HeldMention()
        self.server.default = Handler(held)

        async def race_it() -> bool:
            task = asyncio.ensure_future(self.writer.flush(segment))
            arrived = asyncio.ensure_future(held.arrived.wait())
            await asyncio.wait({task, arrived}, timeout=30, return_when="FIRST_COMPLETED")
            if not arrived.done():  # no LLM call (nothing of the segment may be shown)
                arrived.cancel()
                await task
                return False
            if race == "message":
                await self.gov.forget_message(self.posted[mid].event.scope, mid, actor="test")
            elif race == "delete":
                await self.d.handle(DeleteEvent(scope=self.posted[mid].event.scope, message_id=mid))
            else:
                await self.gov.forget_user(
                    "test", "w1", self.posted[mid].event.speaker_id, actor="t"
                )
            held.release.set()
            await asyncio.wait_for(task, 30)
            return True

        if not self.run(race_it()):
            return
        if race == "person":
            self._forgot(self.posted[mid].event.speaker_id)
        else:
            self.gone(mid)

    @precondition(lambda self: not self.full and bool(self.posted))
    @rule(data=st.data())
    def reimport(self, data: st.DataObject) -> None:
        """An export imported again: the engine's ingest, no dispatcher."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.posted)), min_size=1, max_size=6))
        self.run(self.engine.ingest_many([self.posted[i].event for i in ids]))
        self.admit(ids)

    @precondition(lambda self: not self.full and bool(self.posted))
    @rule(channel=st.sampled_from(CHANNELS))
    def catch_up(self, channel: str) -> None:
        """The channel's whole history redelivered through the dispatcher."""
        events = [p.event for p in self.posted.values() if p.event.scope.channel == channel]
        if not events:
            return
        queued = bool(self.queue)
        runner = CatchUp(self.d, self.engine.store.catchup, History(events))
        (prog,) = self.run(runner.run({scope_of(channel): (None, None)}))
        assert prog.done, prog.error
        ids = [e.message_id for e in events]
        if queued:  # behind the events already waiting; what the store holds already, or
            # the gate would refuse, gets no copy in the spill
            self.queue.extend(
                mid
                for mid in ids
                if self.posted[mid].state == "absent"
                and mid not in self.deleted_early
                and channel not in self.off
                and not self.excluded(self.posted[mid].event.speaker_id)
            )
        else:
            self.admit(ids)

    @precondition(lambda self: not self.full)
    @rule()
    def embed(self) -> None:
        self.run(self.engine.embed_pending())

    @precondition(lambda self: not self.full)
    @rule()
    def restart(self) -> None:
        self.run(self._close())
        self.run(self._open())
        waiting, self.queue = self.queue, []
        self.admit(waiting)

    # ---- what must hold -------------------------------------------------------------------

    async def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return await self.engine.store.db.read(sql, params)

    @invariant()
    def the_store_holds_what_was_admitted(self) -> None:
        rows = self.run(self._read("SELECT message_id FROM messages WHERE deleted_at IS NULL"))
        assert {r[0] for r in rows} == self.live_ids()

    @invariant()
    def the_spill_holds_what_waits(self) -> None:
        """Exactly the creates the model says wait there: a forget took its own out."""
        lines = self.spill_path.read_text().splitlines() if self.spill_path.exists() else []
        waiting = [
            json.loads(line)["event"]["message_id"]
            for line in lines
            if json.loads(line)["kind"] == "message"
        ]
        assert waiting == self.queue

    @invariant()
    def nothing_forgotten_is_reachable(self) -> None:
        if not self.forbidden:
            return
        words = sorted(self.forbidden)
        found = self.run(self._places(words))
        assert not found, found

    async def _places(self, words: list[str]) -> list[str]:
        hits: list[str] = []

        def check(where: str, texts: list[Any]) -> None:
            blob = " ".join(str(t) for t in texts if t)
            hits.extend(f"{where}: {w}" for w in words if w in blob)

        check("messages", [r[0] for r in await self._read("SELECT text FROM messages")])
        records = await self._read("SELECT content, event FROM records")
        check("records", [c for r in records for c in r])
        check("early edits", [r[0] for r in await self._read("SELECT text FROM early_changes")])
        match = " OR ".join(f'"{w}"' for w in words)
        for table in ("messages_fts", "records_fts"):
            rows = await self._read(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (match,))
            hits.extend(f"{table}: row {r[0]}" for r in rows)
        if self.spill_path.exists():
            check("spill", [self.spill_path.read_text()])
        for person in PEOPLE:
            export = await self.gov.export_user("test", "w1", person)
            check(f"export of {person}", [json.dumps(export)])
        question = "what about " + " ".join(words[-2:]) + "?"
        for channel in CHANNELS:
            try:
                result = await RecallPipeline(self.engine).run(
                    RecallRequest(question, scope_of(channel))
                )
            except AccessDenied:
                continue
            rows_text = [rr.record.content for r in result.rows for rr in r.records]
            excerpts = [e.text for e in result.pack.excerpts]
            check(f"/recall in {channel}", [result.answer.text, *rows_text, *excerpts])
        return hits

    @invariant()
    def vectors_and_records_follow_what_is_live(self) -> None:
        self.run(self._records_check())

    async def _records_check(self) -> None:
        live_pks = {
            r[0] for r in await self._read("SELECT id FROM messages WHERE deleted_at IS NULL")
        }
        for table, col in (("message_vectors", "id"), ("messages_vec", "rowid")):
            pks = {r[0] for r in await self._read(f"SELECT {col} FROM {table}")}
            assert pks <= live_pks, (table, pks - live_pks)
        record_ids = {r[0] for r in await self._read("SELECT id FROM records")}
        assert {r[0] for r in await self._read("SELECT rowid FROM records_vec")} <= record_ids
        live = self.live_ids()
        for rid, owner, source, content, from_ids in await self._read(
            "SELECT id, owner, source, content, from_ids FROM records"
        ):
            assert set(json.loads(from_ids)) <= live, (rid, from_ids)
            assert owner not in self.forgotten and source not in self.forgotten, rid
            for person, since in self.opted_out.items():
                if rid > since:
                    assert person not in (owner, source), (rid, person)
            for person in self.names_forgotten:
                assert PEOPLE[person] not in content, (rid, content)
        names = {r[0] for r in await self._read("SELECT user_id FROM users")}
        assert not names & self.forgotten
        await self._attribution_check()

    async def _attribution_check(self) -> None:
        """Every record's source wrote at least one message it cites, or the source is
        GROUP and its cited messages span two or more speakers (issue 39)."""
        author = {
            (r[0], r[1]): r[2]
            for r in await self._read("SELECT channel_pk, message_id, speaker_id FROM messages")
        }
        for rid, pk, source, from_ids in await self._read(
            "SELECT id, channel_pk, source, from_ids FROM records"
        ):
            spoke = {author.get((pk, mid)) for mid in json.loads(from_ids)} - {None, ""}
            if source == "GROUP":
                assert len(spoke) >= 2, (rid, spoke)
            else:
                assert source in spoke, (rid, source, spoke)


BASE = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def test_forgetting_holds_under_random_interleavings() -> None:
    run_state_machine_as_test(
        ForgetMachine,
        settings=settings(BASE, max_examples=20, stateful_step_count=30),
    )


def test_forgetting_holds_under_random_interleavings_long_run(
    request: pytest.FixtureRequest,
) -> None:
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the long run: python -m pytest -m slow tests/test_forget_property.py")
    run_state_machine_as_test(
        ForgetMachine,
        settings=settings(BASE, max_examples=300, stateful_step_count=50),
    )
