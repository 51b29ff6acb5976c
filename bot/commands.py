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

COMMANDS: tuple[CommandSpec, ...] = (RECALL,)
