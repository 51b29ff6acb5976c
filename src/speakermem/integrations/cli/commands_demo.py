"""`speakermem demo` and `speakermem shell`: their options. The commands themselves are in
shell/commands.py, imported only when one of them runs.

Both use `./speakermem-demo.db` unless --db or SPEAKERMEM_DB_PATH names another file, so
trying the demo never touches the bot's own database.
"""

from __future__ import annotations

import argparse
from typing import Any

from speakermem.integrations.shell.translate import (
    DEFAULT_CHANNEL,
    DEFAULT_SPEAKER,
    DEFAULT_WORKSPACE,
)


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="load the demo conversation, answer three questions, then open the shell",
        description="Load a two-week conversation of a six-person team (shipped with the "
        "package) through the real ingest path, build memory (the Writer too when an LLM is "
        "configured), print three /recall answers with citations and --explain summaries, "
        "then open `speakermem shell`. Uses ./speakermem-demo.db unless --db is given.",
    )
    common(p)
    p.add_argument("--no-input", action="store_true", help="do not open the shell (for CI)")
    p.add_argument(
        "--as",
        dest="speaker",
        default=DEFAULT_SPEAKER,
        help="who you speak as in the shell (default: %(default)s)",
    )
    p.set_defaults(handler="speakermem.integrations.shell.commands:cmd_demo")

    p = sub.add_parser(
        "shell",
        help="chat in the terminal: post as anyone, in any channel, and ask /recall",
        description="A terminal chat adapter on the same events, dispatcher, Writer scheduler "
        "and /recall as Slack and Discord. Reads lines from stdin, so it can be scripted. "
        "Uses ./speakermem-demo.db unless --db is given; on a terminal, offers the demo on an "
        "empty one.",
    )
    common(p)
    p.add_argument(
        "--as",
        dest="speaker",
        default=DEFAULT_SPEAKER,
        help="who you speak as (default: %(default)s)",
    )
    p.add_argument(
        "--channel", default=DEFAULT_CHANNEL, help="the channel to start in (default: %(default)s)"
    )
    p.add_argument(
        "--workspace", default=DEFAULT_WORKSPACE, help="shell workspace id (default: %(default)s)"
    )
    p.set_defaults(handler="speakermem.integrations.shell.commands:cmd_shell")
