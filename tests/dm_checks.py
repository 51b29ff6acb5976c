"""The check that a direct message to the bot left no trace as memory: not in search, not in
a member's export, not in the full-text index, and no channel was made for it."""

from __future__ import annotations

import json

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance


async def assert_not_stored(
    engine: MemoryEngine, platform: str, workspace: str, user_id: str, word: str, dm_channel: str
) -> None:
    """`word` (unique to the direct message) is nowhere the store can show it."""
    scopes = await engine.workspace_channels(platform, workspace)
    assert dm_channel not in {s.channel for s in scopes}, "a channel was made for the DM"
    hits = await engine.search(word, scopes, limit=50)
    assert not [h for h in hits if word in h.message.text.lower()], "search shows the DM"
    pks = await engine.channel_pks(scopes)
    assert await engine.store.messages.lexical(word, pks, 50) == [], "FTS holds the DM"
    export = await Governance(engine).export_user(platform, workspace, user_id)
    assert word not in json.dumps(export, default=str).lower(), "the export holds the DM"
