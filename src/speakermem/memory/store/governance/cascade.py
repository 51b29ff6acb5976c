"""The one forgetting cascade every path uses (a forget, a retention sweep, a purge, a
platform delete, a create whose delete came first).

It works on batches of message row ids, one transaction per batch, so a crash leaves each
batch either fully applied or untouched, and running it again finishes the job:
- every System 2 record citing a forgotten message is withdrawn (its row, full-text and
  vector rows, record_sources), the chain is relinked so the newest survivor is the head,
  and a withdrawn head with other live support is queued for re-derivation;
- the message keeps only its channel and message id (a tombstone, so a replayed event does
  not add it again); its text leaves the full-text index and both vector tables.
Decisions (relinking, what to re-derive) are the pure functions of `memory.governance.policy`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from speakermem.memory.config import GovernanceConfig
from speakermem.memory.governance.policy import (
    Receipt,
    relink_chain,
    remaining_support,
    should_rederive,
)
from speakermem.memory.store.database import IN_CHUNK, Database, Transaction

FORGET_BATCH: int = GovernanceConfig.model_fields["forget_batch"].default
"""Messages per transaction when no batch is given (a platform delete): the config's default."""


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


class ForgetCascade:
    """Forgets messages and withdraws records, with everything derived from them."""

    def __init__(self, db: Database) -> None:
        self.db = db

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

    async def _has_table(self, tx: Transaction, name: str) -> bool:
        """Tables of later migrations (the interaction graph) are cleaned when present."""
        row = await tx.fetchone(self.db.dialect.table_exists(), (name,))
        return bool(row[0])

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
            f" WHERE id IN ({marks}) ORDER BY id{self.db.dialect.for_update}",
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

    def _records_naming_sql(self, n: int) -> str:
        """Records of a channel (first parameter) whose from_ids name any of `n` message ids."""
        from_ids = self.db.dialect.json_elements("r.from_ids", "j")
        return (
            f"SELECT DISTINCT r.id FROM records r, {from_ids}"
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
