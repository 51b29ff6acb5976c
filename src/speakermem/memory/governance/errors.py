"""Why a governance request could not be carried out (each message says what to do)."""

from __future__ import annotations

from collections.abc import Sequence

from speakermem.memory.governance.policy import Receipt


class GovernanceError(ValueError):
    """A governance request that cannot be carried out; the message says why."""


class UnknownUser(GovernanceError):
    pass


class AmbiguousUser(GovernanceError):
    def __init__(self, text: str, candidates: Sequence[tuple[str, str]]) -> None:
        self.candidates = list(candidates)
        listed = ", ".join(f"{name} ({uid})" for uid, name in self.candidates)
        super().__init__(f"{text!r} matches several members: {listed}; use an id or a mention")


class UnknownMessage(GovernanceError):
    pass


class ForgetIncomplete(GovernanceError):
    """A forget failed part-way: what it did is in its receipt (marked incomplete) and in
    the audit log, and the rest is retried automatically until it completes."""

    def __init__(self, receipt: Receipt, error: BaseException) -> None:
        self.receipt = receipt
        super().__init__(
            f"{receipt.action} {receipt.target} did not complete ({type(error).__name__}: "
            f"{str(error)[:200]}); done so far: {receipt.summary()}. The rest is retried "
            "automatically; `audit` shows when it completes"
        )
