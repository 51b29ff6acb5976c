"""Backfill of person tombstones for people forgotten before tombstones existed.

Tombstones (`forgotten_people`, `forgotten_names`) arrived with SQLite migration 9 /
PostgreSQL 11, which created the tables empty: a person forgotten by an earlier build had
every row of theirs removed, but nothing kept them out afterwards, so their next message
was stored and exported again. The forget's receipt is still in the audit log (action
`forget-user`, `forget-me` or `opt-out-forget`, target the user id); this backfill writes
the tombstone each such receipt stands for, unless a later `opt-in` or `forget-lift` of the
same person lifted it (an opt-in lifts a tombstone today as well).

Their names can only come from what is left of them (a forget that stopped part-way left
its users, aliases or message rows); a completed old forget deleted them, so its person
has a tombstone without name tombstones, as today's forget of a person the store knew by
no name. Running it again changes nothing (`ON CONFLICT DO NOTHING`).

Forgotten messages need nothing: every earlier forget already kept the row as a tombstone
(channel and message id, no text), which is what keeps a re-import from adding it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from speakermem.memory.governance.tombstones import name_keys, person_key
from speakermem.memory.store.database import Transaction

FORGETS = ("forget-user", "forget-me", "opt-out-forget")
"""Audit actions of a forgotten person (their target is the user id)."""
LIFTS = ("opt-in", "forget-lift")
"""Audit actions after which a person may be remembered again."""


@dataclass(frozen=True)
class ForgottenPerson:
    """Who a forget receipt names, and when (the tombstone's `forgotten_at`)."""

    platform: str
    workspace: str
    user_id: str
    at: float


def still_forgotten(events: list[tuple[int, str, str, str, str, float]]) -> list[ForgottenPerson]:
    """The people whose latest forget or lift (by audit id) is a forget.

    `events` are audit rows (id, platform, workspace, action, target, at)."""
    latest: dict[tuple[str, str, str], tuple[int, str, float]] = {}
    for audit_id, platform, workspace, action, target, at in events:
        if not target or action not in FORGETS + LIFTS:
            continue
        who = (platform, workspace, target)
        if who not in latest or audit_id > latest[who][0]:
            latest[who] = (audit_id, action, at)
    return [
        ForgottenPerson(platform, workspace, user_id, at)
        for (platform, workspace, user_id), (_, action, at) in sorted(latest.items())
        if action in FORGETS
    ]


async def backfill_person_tombstones(tx: Transaction) -> int:
    """Write the tombstones of people forgotten before tombstones existed; returns how many
    were new. Runs inside the migration's transaction."""
    actions = FORGETS + LIFTS
    rows = await tx.fetchall(
        "SELECT id, platform, workspace, action, target, at FROM audit_log"
        f" WHERE action IN ({','.join('?' * len(actions))}) ORDER BY id",
        actions,
    )
    people = still_forgotten([tuple(r) for r in rows])
    if not people:
        return 0
    secret = await tx.fetchone("SELECT value FROM store_secrets WHERE name = 'tombstone_key'")
    key = bytes.fromhex(secret[0])
    added = 0
    for p in people:
        who = person_key(key, p.platform, p.workspace, p.user_id)
        known = await tx.fetchone(
            "SELECT 1 FROM forgotten_people WHERE platform = ? AND workspace = ?"
            " AND person_key = ?",
            (p.platform, p.workspace, who),
        )
        if known is not None:
            continue
        await tx.execute(
            "INSERT INTO forgotten_people (platform, workspace, person_key, forgotten_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (p.platform, p.workspace, who, p.at),
        )
        added += 1
        names = await tx.fetchall(
            "SELECT display_name FROM users WHERE platform = ? AND workspace = ? AND user_id = ?"
            " UNION SELECT alias FROM user_aliases WHERE platform = ? AND workspace = ?"
            " AND user_id = ?"
            " UNION SELECT DISTINCT speaker_name FROM messages WHERE platform = ?"
            " AND workspace = ? AND speaker_id = ? AND speaker_name != ''",
            (p.platform, p.workspace, p.user_id) * 3,
        )
        named = name_keys(key, {r[0] for r in names if r[0] and r[0] != p.user_id})
        await tx.executemany(
            "INSERT INTO forgotten_names (platform, workspace, name_key, person_key)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [(p.platform, p.workspace, n, who) for n in sorted(named)],
        )
    return added
