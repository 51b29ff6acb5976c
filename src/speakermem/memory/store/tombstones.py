"""Tombstones of forgotten people, and the records that still name them.

A person's tombstone (a keyed hash, memory.governance.tombstones) is written first, in a
transaction holding the policy lock exclusively: every ingest or Writer commit that starts
after it reads it, and every one in flight has committed before it, so the cascade that
follows finds their rows. It also takes out the text of early edits they wrote (what the
platform reported before the message arrived).

Lifting a tombstone (the person opts in again, or an admin lifts it) removes the person's
hashes; what was forgotten stays forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from speakermem.memory.governance.tombstones import name_keys, person_key, text_name_keys
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import Database

SCAN_BATCH = 2_000
"""Records read per query when looking for those that name a forgotten person."""


class TombstoneRepo:
    def __init__(self, db: Database, channels: ChannelRepo) -> None:
        self.db = db
        self.channels = channels

    async def names_of(self, platform: str, workspace: str, user_id: str) -> set[str]:
        """Every name the store knows the person by: display name, aliases, the names their
        messages were written under (before any of them are forgotten)."""
        rows = await self.db.read(
            "SELECT display_name FROM users WHERE platform = ? AND workspace = ? AND user_id = ?"
            " UNION SELECT alias FROM user_aliases WHERE platform = ? AND workspace = ?"
            " AND user_id = ?"
            " UNION SELECT DISTINCT speaker_name FROM messages WHERE platform = ?"
            " AND workspace = ? AND speaker_id = ? AND speaker_name != ''",
            (platform, workspace, user_id) * 3,
        )
        return {r[0] for r in rows if r[0] and r[0] != user_id}

    async def bury(
        self, platform: str, workspace: str, user_id: str, names: Iterable[str]
    ) -> set[str]:
        """Write the person's tombstone and their names' (kept until lifted); drop the text
        of early edits they wrote. Returns every name key kept for them (a resumed forget
        finds those of its first attempt, when the names themselves are gone)."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)
            key = await self.channels.policy.key(tx)
            who = person_key(key, platform, workspace, user_id)
            named = name_keys(key, names)
            await tx.execute(
                "INSERT INTO forgotten_people (platform, workspace, person_key, forgotten_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (platform, workspace, who, time.time()),
            )
            await tx.executemany(
                "INSERT INTO forgotten_names (platform, workspace, name_key, person_key)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(platform, workspace, n, who) for n in sorted(named)],
            )
            await tx.execute(
                "DELETE FROM early_changes WHERE platform = ? AND workspace = ?"
                " AND author_id = ? AND deleted_at IS NULL",
                (platform, workspace, user_id),
            )
            rows = await tx.fetchall(
                "SELECT name_key FROM forgotten_names WHERE platform = ? AND workspace = ?"
                " AND person_key = ?",
                (platform, workspace, who),
            )
        return {r[0] for r in rows}

    async def lift(self, platform: str, workspace: str, user_id: str) -> bool:
        """Remove the person's tombstone (and their names'); True when there was one."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)
            key = await self.channels.policy.key(tx)
            who = person_key(key, platform, workspace, user_id)
            await tx.execute(
                "DELETE FROM forgotten_names WHERE platform = ? AND workspace = ?"
                " AND person_key = ?",
                (platform, workspace, who),
            )
            cur = await tx.execute(
                "DELETE FROM forgotten_people WHERE platform = ? AND workspace = ?"
                " AND person_key = ?",
                (platform, workspace, who),
            )
            return bool(cur.rowcount)

    async def is_forgotten(self, platform: str, workspace: str, user_id: str) -> bool:
        key = await self.channels.policy.key()
        rows = await self.db.read(
            "SELECT 1 FROM forgotten_people WHERE platform = ? AND workspace = ?"
            " AND person_key = ?",
            (platform, workspace, person_key(key, platform, workspace, user_id)),
        )
        return bool(rows)

    async def count(self, platform: str | None = None, workspace: str | None = None) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM forgotten_people WHERE (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)",
            (platform, platform, workspace, workspace),
        )
        return int(rows[0][0])

    async def records_naming(
        self, platform: str, workspace: str, names: set[str], *, exclude: Iterable[int] = ()
    ) -> list[int]:
        """Ids of the workspace's records whose content or event names one of the name keys
        (any layer: a GROUP record naming a forgotten person is about them too)."""
        if not names:
            return []
        key = await self.channels.policy.key()
        skip = set(exclude)
        found: list[int] = []
        after = 0
        while True:
            rows = await self.db.read(
                "SELECT id, content, event FROM records WHERE platform = ? AND workspace = ?"
                " AND id > ? ORDER BY id LIMIT ?",
                (platform, workspace, after, SCAN_BATCH),
            )
            if not rows:
                return found
            for rid, content, event in rows:
                if rid in skip:
                    continue
                if (text_name_keys(key, content) | text_name_keys(key, event or "")) & names:
                    found.append(int(rid))
            after = int(rows[-1][0])
