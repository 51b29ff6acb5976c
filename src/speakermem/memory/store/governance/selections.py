"""Which rows a forget, a retention sweep or a purge works on: message and record ids by
channel, member or age, and the records citing them."""

from __future__ import annotations

from collections.abc import Sequence

from speakermem.memory.models import Scope
from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import Database


class CascadeSelections:
    """Part of `GovernanceRepo`: the selections the cascade is given."""

    db: Database
    channels: ChannelRepo

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
