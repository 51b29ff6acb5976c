"""The demo conversation: shipped as package data, loaded through the real ingest path.

`demo_conversation.json` was written for this project (fictional people and product): six
people over two weeks, a public and a private channel, proposals and opinions about each
other's proposals, a launch date decided three times, a late joiner, an alias, a thread, an
edited and a deleted message. `to_events` turns it into the same events an adapter emits;
`load` sends them through the `Dispatcher`, so edits and deletes are events, not fixtures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speakermem.bot.events import (
    DeleteEvent,
    EditEvent,
    Event,
    MessageEvent,
    RosterAction,
    RosterEvent,
    Scope,
)
from speakermem.integrations.shell.session import LocalBot
from speakermem.integrations.shell.translate import DEFAULT_CHANNEL
from speakermem.memory.query.pipeline import RecallRequest, RecallResult
from speakermem.memory.writer.replay import ScriptedRecord, replay_script
from speakermem.memory.writer.runner import FlushOutcome

DATA_FILE = "demo_conversation.json"
SCRIPTED_WRITER = "replay:demo-records"
"""The writer model named on the demo's records when no LLM wrote them."""
SCRIPTED_PROMPT_VERSION = "demo-records-v1"


class DemoPerson(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    aliases: tuple[str, ...] = ()
    role: str = ""


class DemoChannel(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    private: bool = False
    topic: str = ""


class DemoEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["join", "alias", "message", "edit", "delete"]
    at: datetime
    channel: str = DEFAULT_CHANNEL
    user: str | None = None
    id: str | None = None
    text: str | None = None
    name: str | None = None
    thread: str | None = None
    reply_to: str | None = None


class DemoExample(BaseModel):
    """A question the demo asks, as whom, where, and the message ids that support the answer."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    asker: str = Field(alias="as")
    channel: str
    question: str
    cites: tuple[str, ...]


class DemoRecord(ScriptedRecord):
    """What a Writer would derive from the demo, written down with the conversation, so that
    System 2 (people, the group, how the launch date changed) shows without an LLM."""

    channel: str = DEFAULT_CHANNEL


class DemoConversation(BaseModel):
    title: str
    about: str = ""
    platform: str
    workspace: str
    people: list[DemoPerson]
    channels: list[DemoChannel]
    events: list[DemoEvent]
    examples: list[DemoExample]
    records: list[DemoRecord] = Field(default_factory=list)

    def scope(self, channel: str) -> Scope:
        return Scope(platform=self.platform, workspace=self.workspace, channel=channel)

    def person(self, user_id: str) -> DemoPerson:
        for p in self.people:
            if p.id == user_id:
                return p
        raise ValueError(f"demo data names an unknown person {user_id!r}")


def load_conversation() -> DemoConversation:
    text = resources.files("speakermem.integrations.shell").joinpath(DATA_FILE).read_text("utf-8")
    return DemoConversation.model_validate_json(text)


def to_events(conv: DemoConversation) -> list[Event]:
    """The conversation as platform-neutral events, in time order (pure)."""
    out: list[Event] = []
    for e in conv.events:
        scope = conv.scope(e.channel)
        if e.kind == "join":
            assert e.user is not None
            person = conv.person(e.user)
            out.append(
                RosterEvent(
                    scope=scope,
                    action=RosterAction.JOIN,
                    user_id=person.id,
                    name=person.name,
                    at=e.at,
                )
            )
        elif e.kind == "alias":
            assert e.user is not None and e.name is not None
            out.append(
                RosterEvent(
                    scope=scope, action=RosterAction.ALIAS, user_id=e.user, name=e.name, at=e.at
                )
            )
        elif e.kind == "message":
            assert e.user is not None and e.id is not None and e.text is not None
            out.append(
                MessageEvent(
                    scope=scope,
                    message_id=e.id,
                    speaker_id=e.user,
                    speaker_name=conv.person(e.user).name,
                    text=e.text,
                    ts=e.at,
                    thread_id=e.thread,
                    reply_to=e.reply_to,
                )
            )
        elif e.kind == "edit":
            assert e.id is not None and e.text is not None
            out.append(EditEvent(scope=scope, message_id=e.id, text=e.text, edited_at=e.at))
        else:
            assert e.id is not None
            out.append(DeleteEvent(scope=scope, message_id=e.id))
    return out


@dataclass
class DemoLoad:
    messages: int = 0
    new_messages: int = 0
    edits: int = 0
    deletes: int = 0
    roster: int = 0
    errors: int = 0


@dataclass
class MemoryBuild:
    """What `build_memory` did: embeddings, and the Writer's work when an LLM is configured
    (else the demo's written records, replayed: `replayed`)."""

    embedded: int = 0
    writer: str | None = None
    replayed: int = 0
    segments: int = 0
    records: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


async def load(bot: LocalBot, conv: DemoConversation) -> DemoLoad:
    """Send the conversation through the dispatcher (idempotent: ids are never stored twice)."""
    for ch in conv.channels:
        await bot.engine.set_channel_meta(conv.scope(ch.id), name=ch.id, is_private=ch.private)
    stats = bot.dispatcher.stats
    errors_before = sum(stats.errors.values())
    stored_before = stats.handled["message_stored"]
    result = DemoLoad()
    for event in to_events(conv):
        await bot.dispatcher.handle(event)
        if isinstance(event, MessageEvent):
            result.messages += 1
        elif isinstance(event, EditEvent):
            result.edits += 1
        elif isinstance(event, DeleteEvent):
            result.deletes += 1
        else:
            result.roster += 1
    result.new_messages = stats.handled["message_stored"] - stored_before
    result.errors = sum(stats.errors.values()) - errors_before
    return result


async def build_memory(bot: LocalBot, conv: DemoConversation) -> MemoryBuild:
    """Embed every message, then let the Writer write every segment if an LLM is configured;
    without one, replay the demo's written records through the same validation and commit."""
    out = MemoryBuild(embedded=await bot.engine.embed_pending())
    if bot.writer is None:
        for ch in conv.channels:
            script = [r for r in conv.records if r.channel == ch.id]
            report = await replay_script(
                bot.engine,
                conv.scope(ch.id),
                script,
                model=SCRIPTED_WRITER,
                prompt_version=SCRIPTED_PROMPT_VERSION,
            )
            out.replayed += report.accepted
        return out
    out.writer = getattr(bot.llm, "model", "llm")
    for ch in conv.channels:
        await bot.engine.segments.close_channel(conv.scope(ch.id))
    outcomes: list[FlushOutcome] = await bot.writer.flush_due(limit=10_000)
    out.segments = len(outcomes)
    out.records = sum(o.accepted for o in outcomes if o.status == "committed")
    out.outcomes = Counter(o.status for o in outcomes)
    return out


async def ask(bot: LocalBot, conv: DemoConversation) -> list[tuple[DemoExample, RecallResult]]:
    """Run the example questions as their askers, with the access rules of /recall."""
    results = []
    for ex in conv.examples:
        request = RecallRequest(ex.question, conv.scope(ex.channel), asker=ex.asker)
        results.append((ex, await bot.pipeline.run(request)))
    return results
