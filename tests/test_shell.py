"""`speakermem shell`: scripted sessions through the real dispatcher, store and /recall."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from speakermem.bot.events import MessageEvent, RosterAction
from speakermem.bot.settings import Settings
from speakermem.integrations.shell.adapter import StreamLines, line_source
from speakermem.integrations.shell.commands import open_shell
from speakermem.integrations.shell.session import DEMO_DB, local_bot, local_settings
from speakermem.integrations.shell.translate import (
    ShellError,
    command,
    message_event,
    parse_line,
    scope_of,
)


def settings_for(tmp_path: Path, **extra: object) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        db_path=tmp_path / "shell.db",
        embedder="none",
        **extra,  # type: ignore[arg-type]
    )


async def session(tmp_path: Path, script: str, *, offer_demo: bool = True) -> str:
    """Run the shell on `script` (one line per input) and return everything it printed."""
    out = io.StringIO()
    async with local_bot(settings_for(tmp_path), background=False) as bot:
        await open_shell(
            bot, io.StringIO(script), out, "you", "general", "local", offer_demo=offer_demo
        )
    return out.getvalue()


def block_after(output: str, prompt_line: str) -> str:
    """What the shell printed after the line `prompt_line` and before the next prompt."""
    start = output.index(prompt_line) + len(prompt_line)
    rest = output[start:]
    nxt = re.search(r"^\S+ in #\S+> ", rest, re.M)
    return rest[: nxt.start()] if nxt else rest


# ---- pure translation -------------------------------------------------------------------


def test_parse_line_commands_and_posts() -> None:
    assert parse_line("hello there").kind == "say"
    assert parse_line("//recall is a word").model_dump() == {
        "kind": "say",
        "arg": "/recall is a word",
        "private": False,
    }
    assert parse_line("/as @Bobby").arg == "Bobby"
    line = parse_line("/channel #Leads private")
    assert (line.kind, line.arg, line.private) == ("channel", "leads", True)
    assert parse_line("/recall what did we decide?").arg == "what did we decide?"
    assert parse_line("   ").kind == "empty"
    assert parse_line("/EXIT").kind == "quit"
    for bad in ("/channel", "/channel #a b", "/as two words", "/nope", "/recall", "/as #"):
        with pytest.raises(ShellError):
            parse_line(bad)


def test_events_carry_the_shell_platform_and_admin_flag() -> None:
    from datetime import UTC, datetime

    scope = scope_of("local", "design")
    ev = message_event(scope, "m1", "alice", "Alice", "hi", datetime(2025, 1, 1, tzinfo=UTC))
    assert isinstance(ev, MessageEvent) and ev.scope.platform == "shell"
    inv = command(scope, "memory", "alice", "Alice", "status", admin=True)
    assert inv.is_admin and inv.command == "memory"
    assert command(scope, "recall", "a", "A", "q?", admin=False).options == {"question": "q?"}


def test_line_source_reads_pipes_plainly() -> None:
    out = io.StringIO()
    assert isinstance(line_source(io.StringIO("x\n"), out), StreamLines)


async def test_prompt_toolkit_reads_lines_and_keeps_history(tmp_path: Path) -> None:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from speakermem.integrations.shell.adapter import PromptLines

    history = tmp_path / "hist" / "shell_history"
    with create_pipe_input() as pipe:
        lines = PromptLines(history, input=pipe, output=DummyOutput())
        pipe.send_text("/as alice\r")
        assert await lines.read("> ") == "/as alice"
        pipe.send_text("hello there\r")
        assert await lines.read("> ") == "hello there"
        pipe.close()
        assert await lines.read("> ") is None  # end of input ends the shell
    assert "hello there" in history.read_text()


def test_demo_db_is_the_default_only_when_none_was_chosen(tmp_path: Path) -> None:
    assert local_settings(Settings(_env_file=None)).db_path == DEMO_DB  # type: ignore[call-arg]
    chosen = Settings(_env_file=None, db_path=tmp_path / "mine.db")  # type: ignore[call-arg]
    assert local_settings(chosen).db_path == tmp_path / "mine.db"


# ---- scripted sessions ------------------------------------------------------------------

SCRIPT = """\
n
/as alice
/channel #design
I propose we hold the launch party on the rooftop terrace.
/as bob
Alice's rooftop terrace plan is great, but we need a rain backup.
/as carol
/join
/recall what did Bob think of the rooftop terrace plan?
/as alice
/channel #payroll private
The bonus pool this year is 40k, announced in June.
/as bob
This should not be stored.
/as carol
/recall what is the bonus pool?
/channel #design
/recall what is the bonus pool this year?
/as alice
/channel #payroll
/invite bob
/as bob
/recall what is the bonus pool?
/who
/quit
never read
"""


async def test_scripted_session_posts_recalls_and_keeps_private_channels_private(
    tmp_path: Path,
) -> None:
    out = await session(tmp_path, SCRIPT)
    assert "is empty. Load the demo conversation" in out  # offered on an empty store

    # two people posted; carol gets a cited answer with speaker, time and channel
    cited = block_after(out, "/recall what did Bob think of the rooftop terrace plan?\n")
    assert "rain backup" in cited
    heads = re.findall(
        r"^\[(\d+)\] (\w+) · #(\w+) · \w{3} \d{4}-\d\d-\d\d \d\d:\d\d · id (\S+)$", cited, re.M
    )
    assert ("Bob", "design") in {(h[1], h[2]) for h in heads}
    assert all(f"[{h[0]}]" in cited.split("\n\n")[0] for h in heads)

    # bob is not a member of the private channel, so his post there is refused
    assert "Bob is not a member of the private #payroll" in out
    # carol, a member of #design only: refused in #payroll, nothing from it in #design
    refused = block_after(out, "Carol in #payroll> /recall what is the bonus pool?\n")
    assert "cannot read payroll" in refused and "40k" not in refused
    public = block_after(out, "Carol in #design> /recall what is the bonus pool this year?\n")
    assert "40k" not in public and "#payroll" not in public
    # once invited, bob reads it
    invited = block_after(out, "Bob in #payroll> /recall what is the bonus pool?\n")
    assert "40k" in invited and "Alice · #payroll" in invited
    roster = block_after(out, "Bob in #payroll> /who\n")
    assert "#payroll (private): Alice, Bob" in roster
    assert "never read" not in out.split("/quit")[-1]

    async with local_bot(settings_for(tmp_path), background=False) as bot:
        stored = await bot.engine.store.messages.counts()
        assert stored["messages"] == 3  # bob's refused post never reached the store
        members = await bot.engine.members(scope_of("local", "payroll"))
        assert {m.user_id for m in members} == {"alice", "bob"}


async def test_shell_loads_the_demo_on_request_and_resolves_aliases(tmp_path: Path) -> None:
    script = "y\n/as bobby\n/as frank\n/recall What did Bobby propose for offline sync?\n"
    out = await session(tmp_path, script)
    assert "Loaded 227 messages, 1 edit, 1 delete" in out
    assert "you are now Bob (bob)" in out
    answer = block_after(
        out, "Frank in #general> /recall What did Bobby propose for offline sync?\n"
    )
    assert "id g031" in answer  # Bob's proposal, found through his alias


async def test_shell_does_not_offer_the_demo_twice(tmp_path: Path) -> None:
    await session(tmp_path, "n\nhello\n")
    out = await session(tmp_path, "/who\n")
    assert "Load the demo" not in out
    assert "#general (public): You" in out


async def test_events_go_through_the_dispatcher_funnel(tmp_path: Path) -> None:
    async with local_bot(settings_for(tmp_path), background=False) as bot:
        out = io.StringIO()
        await open_shell(
            bot, io.StringIO("/as dan\nhi\n/invite erin\n"), out, "you", "general", "local"
        )
        handled = bot.dispatcher.stats.handled
        assert handled["message_stored"] == 1
        assert handled[f"roster_{RosterAction.JOIN.value}"] == 1
        assert not bot.dispatcher.stats.errors


MEMORY_SCRIPT = """\
n
/as alice
The offsite budget is 30k and I think Lisbon is best.
/as bob
Lisbon sounds fine to me, the offsite should be cheap.
/memory status
/memory channel off purge
N
/as alice
/memory forget-me
y
/as bob
/recall what did Alice say about the offsite budget?
"""


async def test_memory_commands_run_as_admin_and_destructive_ones_ask_first(
    tmp_path: Path,
) -> None:
    out = await session(tmp_path, MEMORY_SCRIPT)
    status = block_after(out, "Bob in #general> /memory status\n")
    assert "2 messages" in status
    # a destructive command asks y/N; N changes nothing
    assert "Cancelled; nothing was changed." in block_after(
        out, "Bob in #general> /memory channel off purge\n"
    )
    # y runs it: alice's message is gone, bob's stays, and recall no longer finds 30k
    assert "Forgotten." in block_after(out, "Alice in #general> /memory forget-me\n")
    answer = block_after(
        out, "Bob in #general> /recall what did Alice say about the offsite budget?\n"
    )
    assert "30k" not in answer
    async with local_bot(settings_for(tmp_path), background=False) as bot:
        counts = await bot.engine.store.messages.counts()
        assert counts["messages"] == 1
        assert await bot.engine.store.channels.is_private(scope_of("local", "general")) is False


@pytest.mark.e2e
def test_speakermem_shell_reads_a_piped_script(tmp_path: Path) -> None:
    env = {**os.environ, "SPEAKERMEM_EMBEDDER": "none", "SPEAKERMEM_LLM_BASE_URL": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakermem.integrations.cli.main",
            "--db",
            str(tmp_path / "s.db"),
            "shell",
        ],
        input="/as alice\nThe offsite is in Lisbon.\n/recall where is the offsite?\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Lisbon" in proc.stdout and "[1] Alice · #general" in proc.stdout


def _shell_cmd(db: Path) -> list[str]:
    return [sys.executable, "-m", "speakermem.integrations.cli.main", "--db", str(db), "shell"]


SHELL_ENV = {"SPEAKERMEM_EMBEDDER": "none", "SPEAKERMEM_LLM_BASE_URL": ""}


@pytest.mark.e2e
def test_piped_script_on_an_empty_database_runs_its_first_line(tmp_path: Path) -> None:
    """`speakermem shell < session.txt`: no demo offer eats the first command."""
    proc = subprocess.run(
        _shell_cmd(tmp_path / "empty.db"),
        input="/as carol\nThe offsite is in Lisbon.\n/who\n",
        capture_output=True,
        text=True,
        env={**os.environ, **SHELL_ENV},
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Load the demo" not in proc.stdout
    assert "you are now Carol (carol)" in proc.stdout
    assert "#general (public): Carol" in proc.stdout


@pytest.mark.e2e
def test_terminal_on_an_empty_database_is_offered_the_demo(tmp_path: Path) -> None:
    """On a terminal the shell still asks, and the answer line is taken as the answer."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            _shell_cmd(tmp_path / "empty.db"),
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **SHELL_ENV},
            cwd=tmp_path,
        )
        os.close(follower)
        os.write(leader, b"n\n/as carol\n/quit\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert proc.returncode == 0, err
    assert "is empty. Load the demo conversation" in out
    assert "you are now Carol (carol)" in out
    assert "Loaded 227 messages" not in out  # "n" declined it
