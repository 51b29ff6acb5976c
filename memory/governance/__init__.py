"""Governance: channel switches, retention, forgetting with receipts, export, audit."""

from memory.governance.policy import Receipt

__all__ = ["Receipt"]
