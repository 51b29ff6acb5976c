"""The Writer's queue on PostgreSQL: any number of worker processes claim segments.

The SQL of the SQLite SegmentRepo runs unchanged, except the index hint of the pending scan
(`_IN_ORDER`, SQLite syntax) and the claim's SELECT, which locks the
rows it returns (`FOR UPDATE SKIP LOCKED`): two workers claiming at once never wait on each
other and never get the same segment; the lease written in the same transaction keeps the
segment out of later claims until it runs out.
"""

from __future__ import annotations

from memory.store.segments import SegmentRepo


class PgSegmentRepo(SegmentRepo):
    _CLAIM_LOCK = " FOR UPDATE SKIP LOCKED"
    _IN_ORDER = ""
