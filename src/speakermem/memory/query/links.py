"""Links from a cited message back to the platform (adapters may supply better ones)."""

from __future__ import annotations

from collections.abc import Callable

from speakermem.memory.models import Scope

LinkResolver = Callable[[Scope, str, str | None], str | None]


def default_link(scope: Scope, message_id: str, thread_id: str | None = None) -> str | None:
    """Discord jump URLs and Slack archive links are derivable from ids alone."""
    if scope.platform == "discord":
        channel = thread_id or scope.channel
        return f"https://discord.com/channels/{scope.workspace}/{channel}/{message_id}"
    if scope.platform == "slack":
        link = f"https://slack.com/archives/{scope.channel}/p{message_id.replace('.', '')}"
        if thread_id and thread_id != message_id:
            link += f"?thread_ts={thread_id}&cid={scope.channel}"
        return link
    return None
