"""Which audit receipts stand for a person still forgotten (migration SQLite 11 /
PostgreSQL 15, memory.store.tombstone_backfill); the rows it writes are checked on
databases made by the old code in tests/test_upgrade_matrix.py."""

from __future__ import annotations

from speakermem.memory.store.tombstone_backfill import ForgottenPerson, still_forgotten


def test_a_forget_receipt_stands_for_a_forgotten_person() -> None:
    events = [
        (1, "discord", "g1", "alias-add", "u1", 10.0),
        (2, "discord", "g1", "forget-user", "u1", 11.0),
        (3, "discord", "g1", "forget-me", "u2", 12.0),
        (4, "discord", "g1", "opt-out-forget", "u3", 13.0),
        (5, "discord", "g1", "forget-message", "discord/g1/c/m1", 14.0),
    ]
    assert still_forgotten(events) == [
        ForgottenPerson("discord", "g1", "u1", 11.0),
        ForgottenPerson("discord", "g1", "u2", 12.0),
        ForgottenPerson("discord", "g1", "u3", 13.0),
    ]


def test_an_opt_in_or_lift_after_the_forget_leaves_no_tombstone() -> None:
    events = [
        (1, "discord", "g1", "forget-user", "u1", 1.0),
        (2, "discord", "g1", "opt-in", "u1", 2.0),
        (3, "slack", "T1", "forget-user", "u1", 3.0),
        (4, "slack", "T1", "forget-lift", "u1", 4.0),
        (5, "slack", "T1", "forget-user", "u2", 5.0),
        (6, "slack", "T1", "opt-in", "u2", 6.0),
        (7, "slack", "T1", "forget-me", "u2", 7.0),
    ]
    # the same id in another workspace is another person; a forget after the lift counts
    assert still_forgotten(events) == [ForgottenPerson("slack", "T1", "u2", 7.0)]
