"""Commands, declared once and registered by every adapter (Discord slash, Slack slash)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CommandOption(BaseModel):
    name: str
    description: str
    required: bool = True
    max_length: int = 2000


class CommandSpec(BaseModel):
    """A platform-neutral command: adapters turn this into their own registration."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    description: str = Field(max_length=100)
    options: list[CommandOption] = Field(default_factory=list)
    admin_only: bool = False


RECALL = CommandSpec(
    name="recall",
    description="Ask what this channel remembers; the answer cites the messages.",
    options=[CommandOption(name="question", description="What do you want to know?")],
)


class MemorySubcommand(BaseModel):
    """One `/memory` subcommand: adapters build Discord subcommands and Slack help from these."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    args: str = ""
    """Argument syntax as shown to users ('' = none), e.g. 'on|off [purge]'."""
    description: str = Field(max_length=100)
    admin_only: bool = False
    destructive: bool = False
    """Destructive when run as `args` says it may be (e.g. `channel off purge`): confirm first."""


MEMORY_SUBCOMMANDS: tuple[MemorySubcommand, ...] = (
    MemorySubcommand(
        name="channel",
        args="on|off [purge]",
        description="Turn memory on or off in this channel; purge forgets what it holds.",
        admin_only=True,
        destructive=True,
    ),
    MemorySubcommand(
        name="retention",
        args="<days>|off [workspace]",
        description="Keep messages this many days in this channel (or the whole workspace).",
        admin_only=True,
    ),
    MemorySubcommand(
        name="alias",
        args="add|remove <@user> <name>",
        description="Add or remove another name a member goes by.",
        admin_only=True,
    ),
    MemorySubcommand(
        name="forget",
        args="message <link or id> | user <@user> | lift <@user>",
        description="Forget a message, or everything a member said, and what was derived.",
        admin_only=True,
        destructive=True,
    ),
    MemorySubcommand(
        name="export",
        args="user <@user>",
        description="JSON of a member's messages and the records about them, with provenance.",
        admin_only=True,
    ),
    MemorySubcommand(
        name="status",
        description="Counts, Writer queue and last run, LLM reachable, size, channels on/off.",
        admin_only=True,
    ),
    MemorySubcommand(
        name="audit",
        description="The latest admin actions: who, what, when and the receipt.",
        admin_only=True,
    ),
    MemorySubcommand(name="mine", description="What I hold about you, with links."),
    MemorySubcommand(
        name="opt-out",
        args="[forget]",
        description="Stop storing your messages; with forget, remove the past too.",
        destructive=True,
    ),
    MemorySubcommand(name="opt-in", description="Store your messages again."),
    MemorySubcommand(
        name="forget-me",
        description="Forget everything you said here and what was derived from it.",
        destructive=True,
    ),
    MemorySubcommand(name="help", description="Show the memory commands."),
)

MEMORY_SUBCOMMAND_BY_NAME: dict[str, MemorySubcommand] = {s.name: s for s in MEMORY_SUBCOMMANDS}

MEMORY = CommandSpec(
    name="memory",
    description="Control what this bot remembers (admins) or what it holds about you.",
    options=[
        CommandOption(
            name="command",
            description="e.g. status, mine, opt-out, channel off, forget user @bob (or help)",
            required=False,
        )
    ],
)

COMMANDS: tuple[CommandSpec, ...] = (RECALL, MEMORY)

ASK_ABOUT_MESSAGE = "Ask SpeakerMem about this"
"""A message's context-menu command (Discord: Apps): asks what the message is about and
answers only the one who asked."""
