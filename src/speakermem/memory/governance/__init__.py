"""Governance: channel switches, retention, forgetting with receipts, export, audit."""

from speakermem.memory.governance.policy import Receipt

__all__ = ["Receipt"]
