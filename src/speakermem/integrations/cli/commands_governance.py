"""`speakermem channel|retention|alias|forget|export|status|audit`: governance from the shell.

The same `memory.governance.Governance` the `/memory` commands use; the CLI acts as admin
with actor "cli" in the audit log. Destructive commands ask first, or need `--yes` when
stdin is not a terminal.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HANDLERS = "speakermem.integrations.cli.governance"
"""Where the commands' handlers live (imported only when one runs)."""


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    def command(
        parent: argparse._SubParsersAction,  # type: ignore[type-arg]
        name: str,
        handler: str | None,
        *,
        help: str,
        description: str,
    ) -> argparse.ArgumentParser:
        """A (sub)command with the common options and the handler it runs (a group has none)."""
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=description)
        common(p)
        if handler is not None:
            p.set_defaults(handler=f"{HANDLERS}:{handler}")
        return p

    # -- channel
    p = command(
        sub,
        "channel",
        "cmd_channel",
        help="turn memory on or off in a channel (admin)",
        description="Memory on or off in a channel; off stops ingestion and answers there. "
        "--purge also forgets everything the channel holds.",
    )
    p.add_argument("action", choices=["enable", "disable"], help="enable or disable memory")
    _channel_option(p)
    p.add_argument("--purge", action="store_true", help="with disable: forget the channel's data")
    _yes_json(p)

    # -- retention
    p = command(
        sub,
        "retention",
        None,
        help="keep messages N days per channel or workspace, and apply it",
        description="`retention set DAYS|off` stores the limit (a channel's overrides its "
        "workspace's); `retention apply` forgets what is past it now (the bot runs it daily).",
    )
    rsub = p.add_subparsers(dest="retention_action", metavar="ACTION", required=True)
    q = command(
        rsub,
        "set",
        "cmd_retention_set",
        help="set the limit in days, or off",
        description="Set how many days messages are kept.",
    )
    q.add_argument("days", help="number of days, or off")
    q.add_argument("--channel", default=None, help="this channel only (id or name)")
    q.add_argument("--workspace", default=None, help="the whole workspace (id)")
    q.add_argument("--platform", default=None, help="platform, when the id is ambiguous")
    q = command(
        rsub,
        "apply",
        "cmd_retention_apply",
        help="forget every message past its limit now",
        description="Apply retention now through the forgetting cascade.",
    )
    q.add_argument("--json", action="store_true", help="print the receipt as JSON")

    # -- alias
    p = command(
        sub,
        "alias",
        "cmd_alias",
        help="add or remove another name a member goes by",
        description="Aliases are used by /recall's Project step and by the Writer's roster.",
    )
    p.add_argument("action", choices=["add", "remove"], help="add or remove")
    _user(p)
    p.add_argument("alias", metavar="ALIAS", help="the other name")
    _workspace(p)

    # -- forget
    p = command(
        sub,
        "forget",
        None,
        help="forget a message or a person, with everything derived from them",
        description="Forgetting removes the text from messages, FTS5 and the vectors, "
        "withdraws every record built from it, and prints a receipt.",
    )
    fsub = p.add_subparsers(dest="forget_what", metavar="WHAT", required=True)
    q = command(
        fsub,
        "message",
        "cmd_forget_message",
        help="forget one message",
        description="Forget one message and every record citing it.",
    )
    q.add_argument("id", metavar="ID", help="the platform's message id (Slack: its ts)")
    _channel_option(q)
    _yes_json(q)
    q = command(
        fsub,
        "user",
        "cmd_forget_user",
        help="forget a person",
        description="Forget a person's messages, every record built from or "
        "about them, their name and aliases.",
    )
    _user(q)
    _workspace(q)
    _yes_json(q)
    q = command(
        fsub,
        "lift",
        "cmd_forget_lift",
        help="let a forgotten person be remembered again",
        description="A forgotten person stays out (their new messages, their names) until "
        "they opt in again or an admin lifts it here. What was forgotten stays forgotten; "
        "the lift is in the audit log. Their name is gone, so give their user id.",
    )
    q.add_argument("user", metavar="USER_ID", help="the forgotten person's user id")
    _workspace(q)
    q.add_argument("--json", action="store_true", help="print the receipt as JSON")

    # -- export
    p = command(
        sub,
        "export",
        None,
        help="export a person's data as JSON",
        description="JSON of a person's messages and of every record they are source or owner "
        "of, with provenance (cited message ids, update chain).",
    )
    esub = p.add_subparsers(dest="export_what", metavar="WHAT", required=True)
    q = command(
        esub,
        "user",
        "cmd_export_user",
        help="export one person",
        description="Write a person's messages and records to a JSON file.",
    )
    _user(q)
    q.add_argument("--out", required=True, type=Path, help="JSON file to write")
    _workspace(q)

    # -- status / audit
    p = command(
        sub,
        "status",
        "cmd_status",
        help="counts, Writer queue, LLM reachable, DB size, channels on/off",
        description="What the store holds and whether the bot's parts are healthy.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(
        sub,
        "audit",
        "cmd_audit",
        help="the latest admin actions with their receipts",
        description="Who did what, when, and the receipt of what changed.",
    )
    p.add_argument("--limit", type=int, default=20, help="how many entries (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _channel_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--channel", required=True, help="channel id or name")
    p.add_argument("--platform", default=None, help="platform, when the channel is ambiguous")


def _user(p: argparse.ArgumentParser) -> None:
    p.add_argument("user", metavar="USER", help="user id, or an unambiguous display name/alias")


def _yes_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print the receipt as JSON")


def _workspace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", default=None, help="workspace (guild/team) id, if several")
    p.add_argument("--platform", default=None, help="platform, if several")
