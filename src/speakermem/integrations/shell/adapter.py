"""`speakermem shell`: a terminal chat, the third adapter beside Slack and Discord.

Lines become the same platform-neutral events (`bot.events`) and go through the same
`Dispatcher` as the network adapters' payloads; `/recall` is `Dispatcher.recall` and
`/memory` is `Dispatcher.memory_command`. Input comes from a `LineSource`: prompt-toolkit
on a terminal (history, editing), plain line reading otherwise, so a test or a pipe can
script a session. Output goes to a text stream; logs stay on stderr.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from speakermem.bot.dispatch import Dispatcher
from speakermem.integrations.shell import render
from speakermem.integrations.shell.translate import (
    DEFAULT_CHANNEL,
    DEFAULT_SPEAKER,
    DEFAULT_WORKSPACE,
    HELP,
    PLATFORM,
    ShellError,
    command,
    join_event,
    message_event,
    new_user,
    parse_line,
    scope_of,
)
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope

log = logging.getLogger(__name__)

HISTORY_FILE = Path("~/.local/share/speakermem/shell_history")


class LineSource(Protocol):
    async def read(self, prompt: str) -> str | None:
        """The next line without its newline, or None at end of input."""
        ...


class StreamLines:
    """Lines from any text stream (a pipe, a file, a test's StringIO), echoed after the prompt
    so a scripted session's output reads like a transcript."""

    def __init__(self, stream: TextIO, out: TextIO) -> None:
        self.stream = stream
        self.out = out

    async def read(self, prompt: str) -> str | None:
        line = await asyncio.to_thread(self.stream.readline)
        if line == "":
            return None
        line = line.rstrip("\r\n")
        self.out.write(f"{prompt}{line}\n")
        return line


class PromptLines:
    """prompt-toolkit on a terminal: line editing and a history file."""

    def __init__(self, history: Path = HISTORY_FILE, **session: Any) -> None:
        """`session` goes to PromptSession (tests pass a pipe input and a dummy output)."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory

        path = history.expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._session: Any = PromptSession(history=FileHistory(str(path)), **session)

    async def read(self, prompt: str) -> str | None:
        try:
            text: str = await self._session.prompt_async(prompt)
        except EOFError:
            return None
        except KeyboardInterrupt:
            return ""
        return text


def line_source(stdin: TextIO, out: TextIO) -> LineSource:
    """prompt-toolkit when both ends are a terminal and it is installed, else plain lines."""
    if stdin.isatty() and out.isatty():
        try:
            return PromptLines()
        except ImportError:
            pass
    return StreamLines(stdin, out)


class ShellAdapter:
    """One operator at a terminal, speaking as anyone in any channel of one workspace."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        engine: MemoryEngine,
        lines: LineSource,
        out: TextIO,
        *,
        workspace: str = DEFAULT_WORKSPACE,
        speaker: str = DEFAULT_SPEAKER,
        channel: str = DEFAULT_CHANNEL,
        admin: bool = True,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.dispatcher = dispatcher
        self.engine = engine
        self.lines = lines
        self.out = out
        self.workspace = workspace
        self.user_id, self.user_name = new_user(speaker)
        self.channel = channel
        self.admin = admin
        self.clock = clock
        self._seq = 0
        self._stopped = False

    # ---- Adapter protocol (integrations.runtime) ----------------------------------------

    async def start(self) -> None:
        if not await self.engine.channel_pks([self.scope]):
            await self.engine.set_channel_meta(self.scope, name=self.channel, is_private=False)
        self.say(
            f"SpeakerMem shell: workspace {self.workspace!r}. You are {self.user_name} in "
            f"#{self.channel}. /help lists the commands."
        )

    async def stop(self) -> None:
        self._stopped = True

    # ---- the loop ------------------------------------------------------------------------

    @property
    def scope(self) -> Scope:
        return scope_of(self.workspace, self.channel)

    def say(self, text: str) -> None:
        self.out.write(text.rstrip("\n") + "\n")
        self.out.flush()

    async def serve(self) -> None:
        """Read and handle lines until /quit, end of input or stop()."""
        while not self._stopped:
            line = await self.lines.read(render.prompt(self.user_name, self.channel))
            if line is None or not await self.handle(line):
                break
        self._stopped = True

    async def ask_yes_no(self, question: str) -> bool:
        answer = await self.lines.read(f"{question} [y/N] ")
        return (answer or "").strip().lower() in ("y", "yes")

    async def handle(self, raw: str) -> bool:
        """Handle one line; False means the operator asked to leave."""
        try:
            line = parse_line(raw)
        except ShellError as exc:
            self.say(f"! {exc}")
            return True
        try:
            if line.kind == "quit":
                return False
            if line.kind == "say":
                await self.post(line.arg)
            elif line.kind == "as":
                await self.switch_speaker(line.arg)
            elif line.kind == "channel":
                await self.switch_channel(line.arg, private=line.private)
            elif line.kind == "join":
                await self.join(self.user_id, self.user_name)
            elif line.kind == "invite":
                uid, name = await self.resolve(line.arg)
                await self.join(uid, name)
            elif line.kind == "recall":
                await self.recall(line.arg)
            elif line.kind == "memory":
                await self.memory(line.arg)
            elif line.kind == "who":
                await self.who()
            elif line.kind == "help":
                self.say(HELP)
        except ShellError as exc:
            self.say(f"! {exc}")
        return True

    # ---- commands ------------------------------------------------------------------------

    async def post(self, text: str) -> None:
        scope = self.scope
        if await self.engine.channel_is_private(scope) and not await self._member(
            scope, self.user_id
        ):
            raise ShellError(
                f"{self.user_name} is not a member of the private #{self.channel}: "
                f"/invite {self.user_name.lower()} first"
            )
        at = self.clock()
        self._seq += 1
        message_id = f"sh{at.timestamp():.6f}-{self._seq}"
        await self.dispatcher.handle(
            message_event(scope, message_id, self.user_id, self.user_name, text, at)
        )

    async def switch_speaker(self, name: str) -> None:
        self.user_id, self.user_name = await self.resolve(name)
        self.say(f"you are now {self.user_name} ({self.user_id})")

    async def switch_channel(self, channel: str, *, private: bool) -> None:
        scope = scope_of(self.workspace, channel)
        known = await self.engine.channel_pks([scope])
        if private and known and not await self.engine.channel_is_private(scope):
            raise ShellError(f"#{channel} already exists and is public")
        if not known:  # switching to a new channel creates it, as on a chat platform
            await self.engine.set_channel_meta(scope, name=channel, is_private=private)
        self.channel = channel
        if private and not known:
            await self.join(self.user_id, self.user_name)
        kind = "private" if await self.engine.channel_is_private(scope) else "public"
        self.say(f"now in #{channel} ({kind}{'' if known or private else ', new'})")

    async def join(self, user_id: str, name: str) -> None:
        await self.dispatcher.handle(join_event(self.scope, user_id, name, self.clock()))
        self.say(f"{name} joined #{self.channel}")

    async def who(self) -> None:
        members = await self.engine.members(self.scope)
        private = await self.engine.channel_is_private(self.scope)
        self.say(render.render_roster(self.channel, private, members))

    async def recall(self, question: str) -> None:
        inv = command(self.scope, "recall", self.user_id, self.user_name, question, admin=False)
        answer = await self.dispatcher.recall(inv)
        texts: dict[tuple[str, str], str] = {}
        by_scope: dict[Scope, list[str]] = {}
        for c in answer.citations:
            by_scope.setdefault(c.scope, []).append(c.message_id)
        for scope, ids in by_scope.items():
            found = await self.engine.messages_by_id(scope, ids)
            texts.update({(scope.channel, mid): m.text for mid, m in found.items()})
        self.say(render.render_answer(answer, texts))

    async def memory(self, text: str) -> None:
        """`/memory …` as the current speaker; the shell's operator is admin. A destructive
        command asks y/N here, where a chat platform would show Confirm and Cancel buttons."""
        inv = command(self.scope, "memory", self.user_id, self.user_name, text, admin=self.admin)
        reply = await self.dispatcher.memory_command(inv)
        self.say(reply.text)
        if reply.confirm is None:
            return
        yes = await self.ask_yes_no(f"{reply.confirm.confirm_label}?")
        done = await self.dispatcher.confirm(
            reply.confirm.token, user_id=self.user_id, is_admin=self.admin, accept=yes
        )
        self.say(done.text)

    # ---- people --------------------------------------------------------------------------

    async def resolve(self, name: str) -> tuple[str, str]:
        """(user id, display name) of a name, alias or id in this workspace; new names are new
        users."""
        ids = await self.engine.find_user(PLATFORM, self.workspace, name)
        if len(ids) > 1:
            raise ShellError(f"{name!r} is ambiguous ({', '.join(ids)}): use the id")
        if not ids:
            return new_user(name)
        return ids[0], await self._display_name(ids[0]) or new_user(name)[1]

    async def _display_name(self, user_id: str) -> str | None:
        for scope in await self.engine.workspace_channels(PLATFORM, self.workspace):
            for m in await self.engine.members(scope, include_left=True):
                if m.user_id == user_id:
                    return m.display_name
        return None

    async def _member(self, scope: Scope, user_id: str) -> bool:
        return any(m.user_id == user_id for m in await self.engine.members(scope))
