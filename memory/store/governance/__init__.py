"""Governance's SQL: policy, members, audit, re-derivation, and the forgetting cascade."""

from memory.store.governance.audit import AuditEntry, RederiveItem
from memory.store.governance.cascade import FORGET_BATCH, ForgetCascade
from memory.store.governance.policies import ChannelPolicy
from memory.store.governance.repo import GovernanceRepo

__all__ = [
    "FORGET_BATCH",
    "AuditEntry",
    "ChannelPolicy",
    "ForgetCascade",
    "GovernanceRepo",
    "RederiveItem",
]
