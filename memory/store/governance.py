"""Governance SQL: channel/workspace policy, preferences, the audit log, the re-derivation
queue, and the one forgetting cascade every path uses.

The cascade works on batches of message row ids, one transaction per batch, so a crash
leaves each batch either fully applied or untouched, and running it again finishes the job:
- every System 2 record citing a forgotten message is withdrawn (its row, FTS5 and vector
  rows, record_sources), the chain is relinked so the newest survivor is the head, and a
  withdrawn head with other live support is queued for re-derivation;
- the message keeps only its channel and message id (a tombstone, so a replayed event does
  not add it again); its text leaves FTS5 (trigger) and both vector tables.
Decisions (relinking, what to re-derive) are the pure functions of `memory.governance.policy`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memory.config import GovernanceConfig
from memory.governance.policy import Receipt, relink_chain, remaining_support, should_rederive
from memory.models import DerivedRecord, Scope
from memory.store.channels import ChannelRepo, normalise_alias
from memory.store.database import IN_CHUNK, Database, Transaction
from memory.store.rows import RECORD_COLUMNS, record_from_row


@dataclass(frozen=True)
class ChannelPolicy:
    scope: Scope
    enabled: bool | None
    """None = never set: the default applies."""
    retention_days: int | None
    notice_posted_at: float | None


FORGET_BATCH: int = GovernanceConfig.model_fields["forget_batch"].default
"""Messages per transaction when no batch is given (a platform delete): the config's default."""


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    platform: str
    workspace: str
    actor: str
    action: str
    target: str
    args: dict[str, Any]
    receipt: dict[str, Any]


@dataclass(frozen=True)
class RederiveItem:
    id: int
    scope: Scope
    layer: str
    owner: str
    source: str
    from_ids: tuple[str, ...]
    attempts: int


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


class GovernanceRepo:
    _FOR_UPDATE = ""
    """Row locks of the cascade's messages (PostgreSQL; SQLite's one writer needs none)."""

    def __init__(self, db: Database, channels: ChannelRepo) -> None:
        self.db = db
        self.channels = channels

    # ---- channel and workspace policy ---------------------------------------------------

    async def channel_policy(self, scope: Scope) -> ChannelPolicy:
        rows = await self.db.read(
            "SELECT enabled, retention_days, notice_posted_at FROM channel_policy"
            " WHERE platform = ? AND workspace = ? AND channel = ?",
            scope.key(),
        )
        if not rows:
            return ChannelPolicy(scope, None, None, None)
        r = rows[0]
        return ChannelPolicy(scope, None if r[0] is None else bool(r[0]), r[1], r[2])

    async def channel_switches(
        self, platform: str, workspace: str, channels: Sequence[str]
    ) -> dict[str, bool]:
        """The explicit on/off switch of each channel that has one (one query for a burst)."""
        rows = await self.db.read_in(
            "SELECT channel, enabled FROM channel_policy WHERE platform = ? AND workspace = ?"
            " AND enabled IS NOT NULL AND channel IN ({marks})",
            list(dict.fromkeys(channels)),
            before=(platform, workspace),
        )
        return {r[0]: bool(r[1]) for r in rows}

    async def is_enabled(self, scope: Scope, *, default: bool) -> bool:
        """Whether memory is on in a channel (its explicit switch, else the default)."""
        policy = await self.channel_policy(scope)
        return default if policy.enabled is None else policy.enabled

    async def record_source_channels(self, record_ids: Sequence[int]) -> dict[int, set[int]]:
        """Record id -> channel pks of the live messages it cites (empty set: none left)."""
        out: dict[int, set[int]] = {rid: set() for rid in record_ids}
        rows = await self.db.read_in(
            "SELECT s.record_id, m.channel_pk FROM record_sources s JOIN messages m"
            " ON m.id = s.message_pk WHERE m.deleted_at IS NULL AND s.record_id IN ({marks})",
            list(record_ids),
        )
        for rid, channel_pk in rows:
            out[rid].add(channel_pk)
        return out

    async def channel_policies(self) -> list[ChannelPolicy]:
        rows = await self.db.read(
            "SELECT platform, workspace, channel, enabled, retention_days, notice_posted_at"
            " FROM channel_policy ORDER BY platform, workspace, channel"
        )
        return [
            ChannelPolicy(
                Scope(platform=r[0], workspace=r[1], channel=r[2]),
                None if r[3] is None else bool(r[3]),
                r[4],
                r[5],
            )
            for r in rows
        ]

    async def _upsert_channel(
        self, tx: Transaction, scope: Scope, column: str, value: Any, actor: str
    ) -> None:
        await tx.execute(
            f"INSERT INTO channel_policy (platform, workspace, channel, {column}, updated_at,"
            f" updated_by) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (platform, workspace, channel)"
            f" DO UPDATE SET {column} = excluded.{column}, updated_at = excluded.updated_at,"
            " updated_by = excluded.updated_by",
            (*scope.key(), value, time.time(), actor),
        )

    async def set_channel_enabled(self, scope: Scope, enabled: bool, actor: str) -> bool | None:
        """Switch a channel; returns the explicit value it had before (None = default)."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)  # ingests in flight finish first
            row = await tx.fetchone(
                "SELECT enabled FROM channel_policy WHERE platform = ? AND workspace = ?"
                " AND channel = ?",
                scope.key(),
            )
            await self._upsert_channel(tx, scope, "enabled", int(enabled), actor)
            if not enabled:  # text of edits waiting for messages that will not be stored now
                await tx.execute(
                    "DELETE FROM early_changes WHERE platform = ? AND workspace = ?"
                    " AND channel = ? AND deleted_at IS NULL",
                    scope.key(),
                )
        return None if row is None or row[0] is None else bool(row[0])

    async def set_channel_retention(self, scope: Scope, days: int | None, actor: str) -> None:
        async with self.db.transaction() as tx:
            await self._upsert_channel(tx, scope, "retention_days", days, actor)

    async def set_workspace_retention(
        self, platform: str, workspace: str, days: int | None, actor: str
    ) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO workspace_policy (platform, workspace, retention_days, updated_at,"
                " updated_by) VALUES (?, ?, ?, ?, ?) ON CONFLICT (platform, workspace) DO UPDATE"
                " SET retention_days = excluded.retention_days,"
                " updated_at = excluded.updated_at, updated_by = excluded.updated_by",
                (platform, workspace, days, time.time(), actor),
            )

    async def workspace_retention(self) -> dict[tuple[str, str], int | None]:
        rows = await self.db.read(
            "SELECT platform, workspace, retention_days FROM workspace_policy"
        )
        return {(r[0], r[1]): r[2] for r in rows}

    async def claim_notice(self, scope: Scope) -> bool:
        """Mark the channel's notice as posted; True only for the first caller ever."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO channel_policy (platform, workspace, channel, updated_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (*scope.key(), time.time()),
            )
            cur = await tx.execute(
                "UPDATE channel_policy SET notice_posted_at = ? WHERE platform = ?"
                " AND workspace = ? AND channel = ? AND notice_posted_at IS NULL",
                (time.time(), *scope.key()),
            )
            return bool(cur.rowcount)

    async def release_notice(self, scope: Scope) -> None:
        """Undo a claim whose post failed, so the notice is tried again later."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE channel_policy SET notice_posted_at = NULL WHERE platform = ?"
                " AND workspace = ? AND channel = ?",
                scope.key(),
            )

    # ---- member preferences -------------------------------------------------------------

    async def set_opted_out(
        self, platform: str, workspace: str, user_id: str, opted_out: bool
    ) -> None:
        """Opting out also drops the text of early edits they wrote (stored nowhere else)."""
        async with self.db.transaction() as tx:
            await tx.policy_lock(shared=False)  # ingests and commits in flight finish first
            if opted_out:
                await tx.execute(
                    "DELETE FROM early_changes WHERE platform = ? AND workspace = ?"
                    " AND author_id = ? AND deleted_at IS NULL",
                    (platform, workspace, user_id),
                )
            await tx.execute(
                "INSERT INTO user_prefs (platform, workspace, user_id, opted_out, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (platform, workspace, user_id) DO UPDATE"
                " SET opted_out = excluded.opted_out, updated_at = excluded.updated_at",
                (platform, workspace, user_id, int(opted_out), time.time()),
            )

    async def is_opted_out(self, platform: str, workspace: str, user_id: str) -> bool:
        rows = await self.db.read(
            "SELECT opted_out FROM user_prefs WHERE platform = ? AND workspace = ? AND user_id = ?",
            (platform, workspace, user_id),
        )
        return bool(rows and rows[0][0])

    async def opted_out_count(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM user_prefs WHERE opted_out = 1 AND (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)",
            (platform, platform, workspace, workspace),
        )
        return int(rows[0][0])

    # ---- aliases ------------------------------------------------------------------------

    async def add_alias(self, platform: str, workspace: str, user_id: str, alias: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO user_aliases (platform, workspace, user_id, alias, alias_norm)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (platform, workspace, user_id, alias.strip(), normalise_alias(alias)),
            )
            return bool(cur.rowcount)

    async def remove_alias(self, platform: str, workspace: str, user_id: str, alias: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM user_aliases WHERE platform = ? AND workspace = ? AND user_id = ?"
                " AND alias_norm = ?",
                (platform, workspace, user_id, normalise_alias(alias)),
            )
            return bool(cur.rowcount)

    async def user_candidates(
        self, platform: str, workspace: str, name_or_id: str
    ) -> list[tuple[str, str]]:
        """(user id, display name) of users whose id, display name or alias is this text."""
        norm = normalise_alias(name_or_id)
        rows = await self.db.read(
            "SELECT u.user_id, u.display_name FROM users u WHERE u.platform = ?"
            " AND u.workspace = ? AND (u.user_id = ? OR lower(u.display_name) = ?"
            " OR u.user_id IN (SELECT a.user_id FROM user_aliases a WHERE a.platform = u.platform"
            " AND a.workspace = u.workspace AND a.alias_norm = ?))"
            " UNION SELECT a.user_id, a.user_id FROM user_aliases a WHERE a.platform = ?"
            " AND a.workspace = ? AND a.alias_norm = ? AND a.user_id NOT IN"
            " (SELECT user_id FROM users WHERE platform = ? AND workspace = ?)"
            " ORDER BY 1",
            (
                platform,
                workspace,
                name_or_id,
                norm,
                norm,
                platform,
                workspace,
                norm,
                platform,
                workspace,
            ),
        )
        return [(r[0], r[1]) for r in rows]

    async def user_names(self, platform: str, workspace: str, user_id: str) -> dict[str, Any]:
        rows = await self.db.read(
            "SELECT display_name, is_bot FROM users WHERE platform = ? AND workspace = ?"
            " AND user_id = ?",
            (platform, workspace, user_id),
        )
        aliases = await self.db.read(
            "SELECT alias FROM user_aliases WHERE platform = ? AND workspace = ? AND user_id = ?"
            " ORDER BY alias",
            (platform, workspace, user_id),
        )
        return {
            "display_name": rows[0][0] if rows else None,
            "is_bot": bool(rows and rows[0][1]),
            "aliases": [a[0] for a in aliases],
        }

    # ---- audit --------------------------------------------------------------------------

    async def log(
        self,
        *,
        platform: str,
        workspace: str,
        actor: str,
        action: str,
        target: str = "",
        args: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
    ) -> int:
        async with self.db.transaction() as tx:
            return await tx.insert(
                "INSERT INTO audit_log (at, platform, workspace, actor, action, target, args,"
                " receipt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    platform,
                    workspace,
                    actor,
                    action,
                    target,
                    json.dumps(args or {}, sort_keys=True),
                    json.dumps(receipt.counts if receipt else {}, sort_keys=True),
                ),
            )

    async def audit(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[AuditEntry]:
        rows = await self.db.read(
            "SELECT id, at, platform, workspace, actor, action, target, args, receipt"
            " FROM audit_log WHERE (? IS NULL OR platform IN (?, '*'))"
            " AND (? IS NULL OR workspace IN (?, '*'))"
            " ORDER BY id DESC LIMIT ?",
            (platform, platform, workspace, workspace, limit),
        )
        return [
            AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), json.loads(r[8]))
            for r in rows
        ]

    # ---- re-derivation queue ------------------------------------------------------------

    async def rederive_depth(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int:
        rows = await self.db.read(
            "SELECT count(*) FROM rederive_queue WHERE (? IS NULL OR platform = ?)"
            " AND (? IS NULL OR workspace = ?)",
            (platform, platform, workspace, workspace),
        )
        return int(rows[0][0])

    async def due_rederive(
        self, limit: int = 50, *, now: float | None = None
    ) -> list[RederiveItem]:
        now = time.time() if now is None else now
        rows = await self.db.read(
            "SELECT id, platform, workspace, channel, layer, owner, source, from_ids, attempts"
            " FROM rederive_queue WHERE next_attempt_at IS NULL OR next_attempt_at <= ?"
            " ORDER BY id LIMIT ?",
            (now, limit),
        )
        return [
            RederiveItem(
                r[0],
                Scope(platform=r[1], workspace=r[2], channel=r[3]),
                r[4],
                r[5],
                r[6],
                tuple(json.loads(r[7])),
                r[8],
            )
            for r in rows
        ]

    async def defer_rederive(self, item_id: int, error: str, delay_s: float) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rederive_queue SET attempts = attempts + 1, next_attempt_at = ?,"
                " last_error = ? WHERE id = ?",
                (time.time() + delay_s, error[:300], item_id),
            )

    async def finish_rederive(self, tx: Transaction, item_id: int) -> None:
        await tx.execute("DELETE FROM rederive_queue WHERE id = ?", (item_id,))

    async def drop_rederive(self, item_id: int) -> None:
        async with self.db.transaction() as tx:
            await self.finish_rederive(tx, item_id)

    # ---- selections for the cascade -----------------------------------------------------

    _NEEDS_WORK = (
        "(deleted_at IS NULL OR speaker_name != '' OR text != ''"
        " OR id IN (SELECT message_pk FROM record_sources))"
    )
    """A message the cascade still has to clean (a finished tombstone is left alone)."""

    async def message_pks(self, scope: Scope, message_ids: Sequence[str]) -> list[int]:
        pk = await self.channels.lookup(scope)
        if pk is None or not message_ids:
            return []
        rows = await self.db.read_in(
            "SELECT id FROM messages WHERE channel_pk = ? AND message_id IN ({marks})",
            message_ids,
            before=(pk,),
        )
        return sorted(r[0] for r in rows)

    async def find_message(
        self, platform: str, workspace: str | None, message_id: str
    ) -> list[Scope]:
        """Channels holding a message id (Discord ids are unique, thread links vary)."""
        rows = await self.db.read(
            "SELECT DISTINCT platform, workspace, channel FROM messages WHERE message_id = ?"
            " AND platform = ? AND (? IS NULL OR workspace = ?)",
            (message_id, platform, workspace, workspace),
        )
        return [Scope(platform=r[0], workspace=r[1], channel=r[2]) for r in rows]

    async def user_message_pks(self, platform: str, workspace: str, user_id: str) -> list[int]:
        rows = await self.db.read(
            "SELECT id FROM messages WHERE platform = ? AND workspace = ? AND speaker_id = ?"
            f" AND {self._NEEDS_WORK} ORDER BY id",
            (platform, workspace, user_id),
        )
        return [r[0] for r in rows]

    async def channel_message_pks(self, scope: Scope) -> list[int]:
        pk = await self.channels.lookup(scope)
        if pk is None:
            return []
        rows = await self.db.read(
            f"SELECT id FROM messages WHERE channel_pk = ? AND {self._NEEDS_WORK} ORDER BY id",
            (pk,),
        )
        return [r[0] for r in rows]

    async def expired_message_pks(self, channel_pk: int, cutoff: float) -> list[int]:
        rows = await self.db.read(
            f"SELECT id FROM messages WHERE channel_pk = ? AND ts < ? AND {self._NEEDS_WORK}"
            " ORDER BY id",
            (channel_pk, cutoff),
        )
        return [r[0] for r in rows]

    async def channels_with_pk(self) -> list[tuple[int, Scope]]:
        rows = await self.db.read("SELECT id, platform, workspace, channel FROM channels")
        return [(r[0], Scope(platform=r[1], workspace=r[2], channel=r[3])) for r in rows]

    async def user_record_ids(self, platform: str, workspace: str, user_id: str) -> list[int]:
        rows = await self.db.read(
            "SELECT id FROM records WHERE platform = ? AND workspace = ?"
            " AND (owner = ? OR source = ?) ORDER BY id",
            (platform, workspace, user_id, user_id),
        )
        return [r[0] for r in rows]

    async def channel_record_ids(self, scope: Scope) -> list[int]:
        """Ids of every record stored in the channel, in any state (a purge's final sweep)."""
        pk = await self.channels.lookup(scope)
        if pk is None:
            return []
        rows = await self.db.read("SELECT id FROM records WHERE channel_pk = ? ORDER BY id", (pk,))
        return [r[0] for r in rows]

    async def records_citing(self, message_pks: Sequence[int]) -> list[int]:
        rows = await self.db.read_in(
            "SELECT DISTINCT record_id FROM record_sources WHERE message_pk IN ({marks})",
            message_pks,
        )
        return sorted(r[0] for r in rows)

    # ---- the cascade --------------------------------------------------------------------

    async def forget_messages(
        self,
        message_pks: Sequence[int],
        receipt: Receipt,
        *,
        reason: str,
        forgotten_people: set[str] | None = None,
        batch: int = FORGET_BATCH,
    ) -> Receipt:
        """Forget these messages and everything derived from them, one transaction per batch.
        The receipt counts a batch once it committed (a batch rolled back counts nothing)."""
        pks = sorted(set(message_pks))
        for start in range(0, len(pks), batch):
            part = pks[start : start + batch]
            done = Receipt(action=receipt.action)
            async with self.db.transaction() as tx:
                await self._forget_batch(tx, part, done, reason, forgotten_people or set())
            receipt.merge(done)
        return receipt

    async def forget_in(
        self, tx: Transaction, message_pks: list[int], receipt: Receipt, *, reason: str
    ) -> None:
        """The same cascade inside a caller's transaction (a create whose delete came first
        is stored and forgotten atomically)."""
        if message_pks:
            await self._forget_batch(tx, sorted(set(message_pks)), receipt, reason, set())

    async def withdraw(
        self,
        record_ids: Sequence[int],
        receipt: Receipt,
        *,
        reason: str,
        forgotten_people: set[str] | None = None,
        requeue: bool = True,
    ) -> Receipt:
        """Withdraw records (not their messages): chains relinked, heads re-queued if supported."""
        ids = sorted(set(record_ids))
        for start in range(0, len(ids), IN_CHUNK):
            done = Receipt(action=receipt.action)
            async with self.db.transaction() as tx:
                await self._withdraw_tx(
                    tx,
                    ids[start : start + IN_CHUNK],
                    {},
                    forgotten_people or set(),
                    reason,
                    done,
                    requeue=requeue,
                )
            receipt.merge(done)
        return receipt

    async def delete_user_rows(
        self, platform: str, workspace: str, user_id: str, receipt: Receipt
    ) -> Receipt:
        """The user's name row and aliases (roster membership stays: it is access, not memory)."""
        done = Receipt(action=receipt.action)
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM users WHERE platform = ? AND workspace = ? AND user_id = ?",
                (platform, workspace, user_id),
            )
            done.add("users", cur.rowcount)
            cur = await tx.execute(
                "DELETE FROM user_aliases WHERE platform = ? AND workspace = ? AND user_id = ?",
                (platform, workspace, user_id),
            )
            done.add("user_aliases", cur.rowcount)
            if await self._has_table(tx, "message_addressees"):
                cur = await tx.execute(
                    "DELETE FROM message_addressees WHERE addressee = ? AND message_pk IN"
                    " (SELECT id FROM messages WHERE platform = ? AND workspace = ?)",
                    (user_id, platform, workspace),
                )
                done.add("message_addressees", cur.rowcount)
            cur = await tx.execute(
                "DELETE FROM rederive_queue WHERE platform = ? AND workspace = ?"
                " AND (owner = ? OR source = ?)",
                (platform, workspace, user_id, user_id),
            )
            done.add("rederive_queue_dropped", cur.rowcount)
        receipt.merge(done)
        return receipt

    @staticmethod
    async def _has_table(tx: Transaction, name: str) -> bool:
        """Tables of later migrations (the interaction graph) are cleaned when present."""
        row = await tx.fetchone(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        )
        return row is not None

    async def _forget_batch(
        self,
        tx: Transaction,
        pks: list[int],
        receipt: Receipt,
        reason: str,
        forgotten_people: set[str],
    ) -> None:
        marks = _marks(pks)
        # Locked first (PostgreSQL): a Writer commit citing these messages either commits
        # before (and its records are found below) or reads them forgotten (and drops them).
        rows = await tx.fetchall(
            f"SELECT id, channel_pk, message_id, deleted_at, text, speaker_name FROM messages"
            f" WHERE id IN ({marks}) ORDER BY id{self._FOR_UPDATE}",
            pks,
        )
        if not rows:
            return
        forgotten: dict[int, set[str]] = {}
        for r in rows:
            forgotten.setdefault(r[1], set()).add(r[2])
        citing = {
            r[0]
            for r in await tx.fetchall(
                f"SELECT DISTINCT record_id FROM record_sources WHERE message_pk IN ({marks})",
                pks,
            )
        }
        # Records whose from_ids name a forgotten message even where record_sources missed it
        # (a record committed before the message arrived): from_ids are per channel.
        for channel_pk, mids in forgotten.items():
            ids = sorted(mids)
            for start in range(0, len(ids), IN_CHUNK):
                part = ids[start : start + IN_CHUNK]
                citing.update(
                    r[0]
                    for r in await tx.fetchall(
                        self._records_naming_sql(len(part)), (channel_pk, *part)
                    )
                )
        if citing:
            await self._withdraw_tx(
                tx, sorted(citing), forgotten, forgotten_people, reason, receipt, requeue=True
            )
        live = [r[0] for r in rows if r[3] is None]
        receipt.add("messages_fts", len(live))
        (vecs,) = await tx.fetchone(
            f"SELECT count(*) FROM message_vectors WHERE id IN ({marks})", pks
        )
        await tx.execute(f"DELETE FROM message_vectors WHERE id IN ({marks})", pks)
        receipt.add("message_vectors", vecs)
        (bits,) = await tx.fetchone(
            f"SELECT count(*) FROM messages_vec WHERE rowid IN ({marks})", pks
        )
        await tx.executemany("DELETE FROM messages_vec WHERE rowid = ?", [(pk,) for pk in pks])
        receipt.add("messages_vec", bits)
        # Interaction rows (who a message speaks to, which turn it answers) go with it.
        for table, where in (
            ("message_addressees", f"message_pk IN ({marks})"),
            ("message_links", f"message_pk IN ({marks}) OR parent_pk IN ({marks})"),
        ):
            if await self._has_table(tx, table):
                params = pks * where.count("IN")
                cur = await tx.execute(f"DELETE FROM {table} WHERE {where}", params)
                receipt.add(table, cur.rowcount)
        # Tombstone: channel + message id stay (a replayed create must not add it back);
        # the trigger takes the live ones out of FTS5 with the old text.
        cur = await tx.execute(
            "UPDATE messages SET text = '', speaker_name = '', speaker_id = '', thread_id = NULL,"
            " reply_to = NULL, addressees = '[]', edited_at = NULL, embedded = 1,"
            f" deleted_at = coalesce(deleted_at, ?) WHERE id IN ({marks})",
            (time.time(), *pks),
        )
        changed = sum(1 for r in rows if r[3] is None or r[4] or r[5])
        receipt.add("messages", min(changed, cur.rowcount))

    @staticmethod
    def _records_naming_sql(n: int) -> str:
        """Records of a channel (first parameter) whose from_ids name any of `n` message ids."""
        return (
            "SELECT DISTINCT r.id FROM records r, json_each(r.from_ids) j"
            f" WHERE r.channel_pk = ? AND j.value IN ({','.join('?' * n)})"
        )

    async def _withdraw_tx(
        self,
        tx: Transaction,
        record_ids: list[int],
        forgotten: dict[int, set[str]],
        forgotten_people: set[str],
        reason: str,
        receipt: Receipt,
        *,
        requeue: bool,
    ) -> None:
        marks = _marks(record_ids)
        recs = await tx.fetchall(
            "SELECT id, channel_pk, platform, workspace, channel, layer, owner, source, state,"
            f" from_ids, chain_root FROM records WHERE id IN ({marks})",
            record_ids,
        )
        if not recs:
            return
        withdrawn = {r[0] for r in recs}
        queue: list[tuple[Any, ...]] = []
        now = time.time()
        if requeue:
            for r in recs:
                from_ids = json.loads(r[9])
                left = remaining_support(from_ids, forgotten.get(r[1], set()))
                if left:
                    live = await tx.fetchall(
                        "SELECT message_id FROM messages WHERE channel_pk = ? AND deleted_at IS"
                        f" NULL AND message_id IN ({_marks(left)})",
                        (r[1], *left),
                    )
                    alive = {x[0] for x in live}
                    left = [m for m in left if m in alive]
                if should_rederive(
                    was_head=r[8] == "active",
                    remaining=left,
                    people=(r[6], r[7]),
                    forgotten_people=forgotten_people,
                ):
                    queue.append(
                        (r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.dumps(left), reason, now)
                    )
        chains = sorted({r[10] for r in recs})
        cur = await tx.execute(
            f"DELETE FROM record_sources WHERE record_id IN ({marks})", record_ids
        )
        receipt.add("record_sources", cur.rowcount)
        await tx.execute(
            f"UPDATE records SET supersedes = NULL WHERE supersedes IN ({marks})", record_ids
        )
        await tx.execute(
            f"UPDATE records SET superseded_by = NULL WHERE superseded_by IN ({marks})",
            record_ids,
        )
        (vecs,) = await tx.fetchone(
            f"SELECT count(*) FROM records_vec WHERE rowid IN ({marks})", record_ids
        )
        await tx.executemany(
            "DELETE FROM records_vec WHERE rowid = ?", [(rid,) for rid in record_ids]
        )
        receipt.add("records_vec", vecs)
        cur = await tx.execute(f"DELETE FROM records WHERE id IN ({marks})", record_ids)
        receipt.add("records", cur.rowcount)
        receipt.add("records_fts", cur.rowcount)
        relinked = 0
        for root in chains:
            nodes = await tx.fetchall(
                "SELECT id, supersedes, superseded_by, state, chain_root FROM records"
                " WHERE chain_root = ? ORDER BY id",
                (root,),
            )
            current = {n[0]: (n[1], n[2], n[3] == "active", n[4]) for n in nodes}
            for link in relink_chain(current, withdrawn):
                want = (link.supersedes, link.superseded_by, link.active, link.chain_root)
                if current[link.id] == want:
                    continue
                relinked += 1
                await tx.execute(
                    "UPDATE records SET supersedes = ?, superseded_by = ?, state = ?,"
                    " chain_root = ? WHERE id = ?",
                    (
                        link.supersedes,
                        link.superseded_by,
                        "active" if link.active else "superseded",
                        link.chain_root,
                        link.id,
                    ),
                )
        receipt.add("records_relinked", relinked)
        await tx.executemany(
            "INSERT INTO rederive_queue (channel_pk, platform, workspace, channel, layer, owner,"
            " source, from_ids, reason, queued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            queue,
        )
        receipt.add("rederive_queued", len(queue))

    # ---- export -------------------------------------------------------------------------

    async def user_messages(self, platform: str, workspace: str, user_id: str) -> list[Any]:
        return await self.db.read(
            "SELECT channel, message_id, thread_id, ts, text, edited_at FROM messages"
            " WHERE platform = ? AND workspace = ? AND speaker_id = ? AND deleted_at IS NULL"
            " ORDER BY ts, id",
            (platform, workspace, user_id),
        )

    async def user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]:
        """Every record the member is owner or source of, in any state, chain by chain."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE platform = ? AND workspace = ?"
            " AND (owner = ? OR source = ?) ORDER BY chain_root, id",
            (platform, workspace, user_id, user_id),
        )
        return [record_from_row(r) for r in rows]

    async def active_user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]:
        """The member's active records (owner or source), newest first."""
        rows = await self.db.read(
            f"SELECT {RECORD_COLUMNS} FROM records WHERE platform = ? AND workspace = ?"
            " AND (owner = ? OR source = ?) AND state = 'active' ORDER BY time DESC, id DESC",
            (platform, workspace, user_id, user_id),
        )
        return [record_from_row(r) for r in rows]

    async def live_message_count(self, platform: str, workspace: str, user_id: str) -> int:
        """How many of the member's messages are stored and not deleted or forgotten."""
        rows = await self.db.read(
            "SELECT count(*) FROM messages WHERE platform = ? AND workspace = ?"
            " AND speaker_id = ? AND deleted_at IS NULL",
            (platform, workspace, user_id),
        )
        return int(rows[0][0])

    async def has_spoken(self, platform: str, workspace: str, user_id: str) -> bool:
        """Whether any stored message row carries this speaker id (deleted ones included), so a
        member whose name row is gone can still be found by id."""
        rows = await self.db.read(
            "SELECT 1 FROM messages WHERE platform = ? AND workspace = ? AND speaker_id = ?"
            " LIMIT 1",
            (platform, workspace, user_id),
        )
        return bool(rows)
