"""What may be remembered, read where it is enforced: inside the write transaction that
stores a message (the admission gate) or commits a Writer record (the commit-time check),
and outside one for the Writer's prompt.

Reading the switches, opt-outs and tombstones in the same transaction as the write is what
makes the gate race-free: on SQLite the one writer orders it after any forget or switch
that returned; on PostgreSQL `Transaction.policy_lock` (shared here, exclusive in the
policy writes of `GovernanceRepo`) does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from memory.governance.tombstones import Exclusions
from memory.models import Scope
from memory.store.database import Database, StoreError, Transaction
from memory.store.inlists import in_list

_EXCLUSIONS_SQL = (
    "SELECT 'o', user_id FROM user_prefs WHERE platform = ? AND workspace = ? AND opted_out = 1"
    " UNION ALL SELECT 'p', person_key FROM forgotten_people WHERE platform = ? AND workspace = ?"
    " UNION ALL SELECT 'n', name_key FROM forgotten_names WHERE platform = ? AND workspace = ?"
)


class PolicyRepo:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._key: bytes | None = None

    async def _rows(self, tx: Transaction | None, sql: str, params: Sequence[Any]) -> list[Any]:
        if tx is None:
            return await self.db.read(sql, list(params))
        return await tx.fetchall(sql, list(params))

    async def key(self, tx: Transaction | None = None) -> bytes:
        """The database's tombstone key (made by its migration; it never changes)."""
        if self._key is None:
            rows = await self._rows(
                tx, "SELECT value FROM store_secrets WHERE name = 'tombstone_key'", ()
            )
            if not rows:
                raise StoreError("the database has no tombstone key: run its migrations")
            self._key = bytes.fromhex(rows[0][0])
        return self._key

    async def exclusions(
        self, platform: str, workspace: str, tx: Transaction | None = None
    ) -> Exclusions:
        """Opted-out members and forgotten people (with their names) of one workspace."""
        rows = await self._rows(tx, _EXCLUSIONS_SQL, (platform, workspace) * 3)
        found: dict[str, set[str]] = {"o": set(), "p": set(), "n": set()}
        for tag, value in rows:
            found[tag].add(value)
        return Exclusions(
            key=await self.key(tx),
            platform=platform,
            workspace=workspace,
            opted_out=frozenset(found["o"]),
            forgotten=frozenset(found["p"]),
            names=frozenset(found["n"]),
        )

    async def exclusions_for(
        self, workspaces: Iterable[tuple[str, str]], tx: Transaction | None = None
    ) -> dict[tuple[str, str], Exclusions]:
        return {ws: await self.exclusions(*ws, tx=tx) for ws in dict.fromkeys(workspaces)}

    async def channels_on(
        self, scopes: Iterable[Scope], default: bool, tx: Transaction | None = None
    ) -> dict[Scope, bool]:
        """Whether memory is on in each channel: its switch in channel_policy (the one place
        it is kept), else `default`."""
        by_ws: dict[tuple[str, str], list[Scope]] = {}
        for scope in dict.fromkeys(scopes):
            by_ws.setdefault((scope.platform, scope.workspace), []).append(scope)
        out: dict[Scope, bool] = {}
        for (platform, workspace), group in by_ws.items():
            switches: dict[str, bool] = {}
            channels = [s.channel for s in group]
            for start in range(0, len(channels), 256):
                marks, part = in_list(channels[start : start + 256])
                for channel, enabled in await self._rows(
                    tx,
                    "SELECT channel, enabled FROM channel_policy WHERE platform = ?"
                    f" AND workspace = ? AND enabled IS NOT NULL AND channel IN ({marks})",
                    (platform, workspace, *part),
                ):
                    switches[channel] = bool(enabled)
            out.update({s: switches.get(s.channel, default) for s in group})
        return out
