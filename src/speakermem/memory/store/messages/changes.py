"""Edits and deletes of stored messages, converging in any order and with any duplicates.

- An edit applies only when it is newer (by `edited_at`, then text) than what is stored.
- An edit or delete of an id not stored yet is kept in `early_changes` (early.py).
- A delete is the forgetting cascade (memory/store/governance/cascade.py): text, indexes,
  vectors and every record citing the message go; a tombstone keeps the id so a replayed
  create does not bring it back.
"""

from __future__ import annotations

from typing import Any

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.models import DeleteEvent, EditEvent, Scope
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import Database, Transaction
from speakermem.memory.store.governance.cascade import ForgetCascade
from speakermem.memory.store.messages import early
from speakermem.memory.store.messages.outcomes import ChangeStatus
from speakermem.memory.store.rows import to_ts


class MessageChanges:
    """Edits and deletes (`MessageRepo.edit`, `MessageRepo.delete`)."""

    def __init__(self, db: Database, channels: ChannelRepo, cascade: ForgetCascade) -> None:
        self.db = db
        self.channels = channels
        self.cascade = cascade

    async def edit(self, event: EditEvent, *, channel_default: bool) -> ChangeStatus:
        """Replace the text: the full-text index follows, the old vector goes (the embedder
        makes a new one). Records citing it are re-checked by the caller
        (`memory.governance.service`), with `citing_records`.

        Only a newer edit applies: (edited_at, text) above the stored one, so any order of
        the same edits ends on the same text. An edit of a message not stored yet is kept
        for it (UNKNOWN); an edit of a deleted message changes nothing.

        The admission gate holds for edits too: the text of a member who opted out or was
        forgotten (the stored message's author, else the event's `author_id`) is not kept,
        nor an early edit's in a channel whose memory is off."""
        at = to_ts(event.edited_at)
        async with self.db.transaction() as tx:
            await tx.ingest_lock([event.scope.key()])
            await tx.policy_lock(shared=True)
            row = await self._locate(tx, event.scope, event.message_id)
            if row is not None and row[2] is not None:
                return ChangeStatus.UNCHANGED
            people = await self.channels.policy.exclusions(
                event.scope.platform, event.scope.workspace, tx
            )
            author = row[4] if row is not None else event.author_id
            if author and (refusal := people.reason(author)) is not None:
                return ChangeStatus(refusal.value)
            if row is None:
                (on,) = (
                    await self.channels.policy.channels_on([event.scope], channel_default, tx)
                ).values()
                if not on:  # memory is off here: keep no text of a message it never stored
                    return ChangeStatus.CHANNEL_OFF
                await early.keep_edit(tx, event, at)
                return ChangeStatus.UNKNOWN
            pk, text, _deleted, edited_at, _speaker = row
            if edited_at is not None and (at, event.text) <= (edited_at, text):
                return ChangeStatus.UNCHANGED  # an older edit (or this one) replayed late
            if text == event.text:  # newer but the same words: only the time moves
                await tx.execute("UPDATE messages SET edited_at = ? WHERE id = ?", (at, pk))
                return ChangeStatus.UNCHANGED
            await tx.execute(
                "UPDATE messages SET text = ?, edited_at = ?, embedded = 0 WHERE id = ?",
                (event.text, at, pk),
            )
            await tx.execute("DELETE FROM messages_vec WHERE rowid = ?", (pk,))
            await tx.execute("DELETE FROM message_vectors WHERE id = ?", (pk,))
            return ChangeStatus.APPLIED

    async def delete(self, event: DeleteEvent) -> tuple[ChangeStatus, Receipt | None]:
        """A platform delete: the forgetting cascade; what it removed (None when nothing).

        A delete of a message not stored yet is kept as an early tombstone (UNKNOWN): the
        create that follows is stored forgotten."""
        async with self.db.transaction() as tx:
            await tx.ingest_lock([event.scope.key()])
            row = await tx.fetchone(
                "SELECT m.id, m.deleted_at, m.speaker_name FROM messages m JOIN channels c"
                " ON c.id = m.channel_pk WHERE c.platform = ? AND c.workspace = ?"
                " AND c.channel = ? AND m.message_id = ?",
                (*event.scope.key(), event.message_id),
            )
            if row is None:
                await early.keep_delete(tx, event.scope, event.message_id)
                return ChangeStatus.UNKNOWN, None
        pk, deleted, speaker_name = row
        cited = await self.db.read(
            "SELECT 1 FROM record_sources WHERE message_pk = ? LIMIT 1", (pk,)
        )
        if deleted is not None and not speaker_name and not cited:
            return ChangeStatus.UNCHANGED, None
        receipt = Receipt(action="platform-delete", target=f"{event.scope}/{event.message_id}")
        await self.cascade.forget_messages([pk], receipt, reason="platform-delete")
        return ChangeStatus.APPLIED, receipt

    @staticmethod
    async def _locate(tx: Transaction, scope: Scope, message_id: str) -> Any:
        return await tx.fetchone(
            "SELECT m.id, m.text, m.deleted_at, m.edited_at, m.speaker_id FROM messages m"
            " JOIN channels c ON c.id = m.channel_pk WHERE c.platform = ? AND c.workspace = ?"
            " AND c.channel = ? AND m.message_id = ?",
            (*scope.key(), message_id),
        )
