"""Governance's SQL as one repository: channel and workspace policy, members' preferences
and data, the audit log, the re-derivation queue, the selections a forget works on, and the
forgetting cascade itself (each part in its own module of this package)."""

from __future__ import annotations

from speakermem.memory.store.channels import ChannelRepo
from speakermem.memory.store.database import Database
from speakermem.memory.store.governance.audit import AuditLog, RederiveQueue
from speakermem.memory.store.governance.cascade import ForgetCascade
from speakermem.memory.store.governance.people import People
from speakermem.memory.store.governance.policies import ChannelPolicies
from speakermem.memory.store.governance.selections import CascadeSelections


class GovernanceRepo(
    ChannelPolicies, People, AuditLog, RederiveQueue, CascadeSelections, ForgetCascade
):
    def __init__(self, db: Database, channels: ChannelRepo) -> None:
        super().__init__(db)
        self.channels = channels
