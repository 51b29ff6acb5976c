"""What may be remembered, read where it is enforced: inside the write transaction that
stores a message (the admission gate) or commits a Writer record (the commit-time check),
and outside one for the Writer's prompt.

Reading the switches, opt-outs and tombstones in the same transaction as the write is what
makes the gate race-free: on SQLite the one writer orders it after any forget or switch
that returned; on PostgreSQL `Transaction.policy_lock` (shared here, exclusive in the
policy writes of `GovernanceRepo`) does.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from speakermem.memory.governance.policy import Refusal, admission, commit_refusal
from speakermem.memory.governance.tombstones import Exclusions
from speakermem.memory.models import GROUP, MessageEvent, NewRecord, Scope
from speakermem.memory.store.database import IN_CHUNK, Database, Transaction
from speakermem.memory.store.errors import StoreError
from speakermem.memory.store.inlists import in_list

log = logging.getLogger(__name__)

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

    async def deleted_early(self, scope: Scope, message_id: str) -> bool:
        """Whether a delete of this message arrived before the message itself (an early
        tombstone in `early_changes`): its create is stored forgotten when it comes."""
        rows = await self.db.read(
            "SELECT 1 FROM early_changes WHERE platform = ? AND workspace = ? AND channel = ?"
            " AND message_id = ? AND deleted_at IS NOT NULL",
            (*scope.key(), message_id),
        )
        return bool(rows)

    # ---- the two checks -------------------------------------------------------------------

    async def refusals(
        self,
        tx: Transaction,
        events: Sequence[MessageEvent],
        candidates: list[int],
        channel_default: bool,
    ) -> dict[int, Refusal]:
        """The admission gate over the new messages of an ingest batch (indexes into
        `events`): why each one turned away is (memory.governance.policy.admission)."""
        if not candidates:
            return {}
        await tx.policy_lock(shared=True)
        on = await self.channels_on((events[i].scope for i in candidates), channel_default, tx)
        people = await self.exclusions_for(
            ((events[i].scope.platform, events[i].scope.workspace) for i in candidates), tx
        )
        out: dict[int, Refusal] = {}
        for i in candidates:
            ev = events[i]
            found = people[(ev.scope.platform, ev.scope.workspace)]
            refusal = admission(
                is_bot=ev.speaker_is_bot,
                channel_on=on[ev.scope],
                author=None if found.empty else found.reason(ev.speaker_id),
            )
            if refusal is not None:
                out[i] = refusal
        return out

    async def admissible(
        self,
        tx: Transaction,
        channel_pk: int,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        *,
        lock_rows: str = "",
    ) -> tuple[list[NewRecord], np.ndarray | None, dict[str, int]]:
        """The commit-time check, inside the commit's transaction: keep the records whose
        every cited message is live, whose owner and source were neither forgotten nor opted
        out, whose text names no forgotten person, whose update target still exists and whose
        source wrote what it cites, read from the stored messages' author ids
        (memory.governance.policy.commit_refusal). `lock_rows` locks the cited messages
        (PostgreSQL's " FOR SHARE"). Returns the kept records, their vectors and the dropped
        counts by reason."""
        if not records:
            return list(records), vectors, {}
        await tx.policy_lock(shared=True)
        cited = sorted({mid for rec in records for mid in rec.from_ids})
        author: dict[str, str] = {}
        for start in range(0, len(cited), IN_CHUNK):
            marks, part = in_list(cited[start : start + IN_CHUNK])
            rows = await tx.fetchall(
                "SELECT message_id, speaker_id FROM messages WHERE channel_pk = ?"
                f" AND deleted_at IS NULL AND message_id IN ({marks}) ORDER BY id{lock_rows}",
                (channel_pk, *part),
            )
            author.update((r[0], r[1]) for r in rows)
        live = set(author)
        people = await self.exclusions(scope.platform, scope.workspace, tx)
        targets = sorted({rec.supersedes for rec in records if rec.supersedes is not None})
        present: set[int] = set()
        if targets:
            target_marks, ids = in_list(targets)
            rows = await tx.fetchall(f"SELECT id FROM records WHERE id IN ({target_marks})", ids)
            present = {int(r[0]) for r in rows}
        kept: list[int] = []
        dropped: Counter[str] = Counter()
        for i, rec in enumerate(records):
            reason = commit_refusal(
                from_ids=rec.from_ids,
                live=live,
                people=[people.reason(u) for u in (rec.owner, rec.source) if u != GROUP],
                names_forgotten=people.names_in(rec.content, rec.event),
                target_present=rec.supersedes is None or rec.supersedes in present,
                source=rec.source,
                owner=rec.owner,
                speakers=[author[mid] for mid in rec.from_ids if mid in author],
            )
            if reason is None:
                kept.append(i)
            else:
                dropped[reason] += 1
        if not dropped:
            return list(records), vectors, {}
        log.warning(
            "commit in %s: dropped %d record(s) the commit-time check refused: %s",
            scope,
            sum(dropped.values()),
            dict(dropped),
        )
        return (
            [records[i] for i in kept],
            None if vectors is None else vectors[kept],
            dict(dropped),
        )
