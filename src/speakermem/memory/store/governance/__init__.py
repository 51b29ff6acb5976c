"""Governance's SQL: policy, members, audit, re-derivation, and the forgetting cascade."""

from speakermem.memory.store.governance.audit import AuditEntry, RederiveItem
from speakermem.memory.store.governance.cascade import FORGET_BATCH, ForgetCascade
from speakermem.memory.store.governance.policies import ChannelPolicy
from speakermem.memory.store.governance.repo import GovernanceRepo

__all__ = [
    "FORGET_BATCH",
    "AuditEntry",
    "ChannelPolicy",
    "ForgetCascade",
    "GovernanceRepo",
    "RederiveItem",
]
