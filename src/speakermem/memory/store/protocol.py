"""The store as the rest of SpeakerMem sees it: one protocol per repository, and `Store`.

Everything outside memory/store (the engine, the query pipeline, the Writer, governance,
the console) is typed against these, never against a backend class. Each protocol lists
the methods callers use, no more: a new backend implements exactly this surface
(`memory/store/sqlite/store.py` and `memory/store/pg/store.py` do, checked by mypy through
`make_store`), and the contract suite (tests/store_contract/) runs the same behaviour
checks over every backend through it.

How the two backends share code: memory/store/dialect.py. What a repository needs of a
database: memory/store/database.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import numpy as np

from speakermem.memory.governance.policy import Receipt
from speakermem.memory.governance.tombstones import Exclusions
from speakermem.memory.interactions import NameIndex
from speakermem.memory.models import (
    DeleteEvent,
    DerivedRecord,
    EditEvent,
    MessageEvent,
    NewRecord,
    RosterEvent,
    RosterMember,
    Scope,
    Segment,
    StoredMessage,
)
from speakermem.memory.store.catchup import Cursor
from speakermem.memory.store.console import PersonCounts, PersonRow
from speakermem.memory.store.database import Database, Transaction
from speakermem.memory.store.forget_jobs import ForgetJob
from speakermem.memory.store.governance import FORGET_BATCH, AuditEntry, ChannelPolicy, RederiveItem
from speakermem.memory.store.messages import ChangeStatus, IngestOutcome
from speakermem.memory.store.reconcile import StoredRow
from speakermem.memory.store.records import WriterRunLog
from speakermem.memory.store.segments import Backlog


class Policy(Protocol):
    """What may be remembered: switches, opt-outs and tombstones (`channels.policy`)."""

    async def exclusions(
        self, platform: str, workspace: str, tx: Transaction | None = None
    ) -> Exclusions: ...
    async def channels_on(
        self, scopes: Iterable[Scope], default: bool, tx: Transaction | None = None
    ) -> dict[Scope, bool]: ...
    async def deleted_early(self, scope: Scope, message_id: str) -> bool:
        """Whether a delete of this message arrived before the message itself."""


class Channels(Protocol):
    """Channel rows, users, aliases and per-channel rosters."""

    @property
    def policy(self) -> Policy: ...
    async def lookup(self, scope: Scope) -> int | None:
        """The channel's row id, None when the store never saw it."""

    async def all(self) -> list[dict[str, Any]]:
        """Every channel: pk, scope, name, is_private, messages, members, sessions."""

    async def workspaces(self) -> list[tuple[str, str]]: ...
    async def find(self, channel: str, platform: str | None = None) -> list[Scope]: ...
    async def set_meta(
        self, scope: Scope, *, name: str | None, is_private: bool | None
    ) -> None: ...
    async def is_private(self, scope: Scope) -> bool:
        """Unknown channels count as private (fail closed)."""

    async def apply(self, event: RosterEvent) -> None: ...
    async def sync_members(
        self, scope: Scope, listed: list[tuple[str, str | None, bool]], at: float | None = None
    ) -> tuple[int, int]: ...
    async def members(self, scope: Scope, *, include_left: bool = False) -> list[RosterMember]: ...
    async def readable_channels(
        self, platform: str, workspace: str, user_id: str
    ) -> list[Scope]: ...
    async def find_user(self, platform: str, workspace: str, name_or_id: str) -> list[str]: ...


class Messages(Protocol):
    """System 1: verbatim messages, their sessions, segments and indexes."""

    last_receipt: Receipt | None

    async def ingest(
        self, events: Sequence[MessageEvent], *, channel_default: bool
    ) -> list[IngestOutcome]: ...
    async def edit(self, event: EditEvent, *, channel_default: bool) -> ChangeStatus: ...
    async def delete(self, event: DeleteEvent) -> ChangeStatus: ...

    # the embedding queue
    async def pending_embeddings(self, limit: int) -> list[tuple[int, int, str]]: ...
    async def count_pending_embeddings(self) -> int: ...
    async def store_vectors(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray, *, draft: bool = False
    ) -> int: ...
    async def draft_vectors(self, limit: int) -> list[tuple[int, int, str]]: ...
    async def count_draft_vectors(self) -> int: ...
    async def replace_drafts(
        self, items: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> int: ...

    # reads
    async def get_many(self, pks: Sequence[int]) -> dict[int, StoredMessage]: ...
    async def by_ids(
        self, scope: Scope, message_ids: Sequence[str]
    ) -> dict[str, StoredMessage]: ...
    async def get(self, scope: Scope, message_id: str) -> StoredMessage | None: ...
    async def in_segment(self, segment_id: int) -> list[StoredMessage]: ...
    async def neighbours(self, message: StoredMessage, radius: int) -> list[StoredMessage]: ...
    async def session_started(
        self, scope: Scope, session_ids: Sequence[int]
    ) -> dict[int, float]: ...
    async def channel_corpus(self, channel_pk: int) -> list[tuple[int, str, str, str]]: ...
    async def vectors(self, pks: Sequence[int]) -> dict[int, np.ndarray]: ...
    async def session_total(self, channel_pks: Sequence[int]) -> int: ...
    async def session_sizes(
        self, sessions: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], int]: ...
    async def latest_ts(self, channel_pks: Sequence[int]) -> float | None: ...
    async def counts(self) -> dict[str, int]: ...
    async def vectors_written_by(self) -> str | None: ...
    async def set_vectors_written_by(self, name: str) -> None: ...
    async def has_vectors(self) -> bool: ...
    async def drop_vectors(self) -> int: ...

    # search
    async def lexical(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        *,
        speakers: Sequence[str] | None = None,
        speaker_names: Sequence[str] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> list[tuple[int, float]]:
        """BM25 over the channels' live messages: [(pk, score)] best first (scores are
        negative, lower is better, as FTS5's)."""

    async def lexical_by_speaker(
        self, match: str, channel_pks: Sequence[int], speakers: Sequence[str], per_speaker: int
    ) -> dict[str, list[int]]: ...
    async def dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        limit: int,
        oversample: int,
        oversample_fraction: float = 0.0,
    ) -> list[tuple[int, float]]:
        """Vector KNN over the channels: [(pk, cosine similarity)] best first."""

    async def lowercase_share(
        self, word: str, channel_pks: Sequence[int], *, sample: int = 200
    ) -> tuple[int, float]: ...
    async def speaker_dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        speakers: Sequence[str],
        limit: int,
        *,
        max_messages: int,
    ) -> list[tuple[int, float]]: ...
    async def session_term_counts(
        self, terms: Sequence[str], channel_pks: Sequence[int], *, cap: int = 2000
    ) -> dict[str, dict[tuple[int, int], int]]: ...


class Records(Protocol):
    """System 2: derived records with append-only update chains."""

    async def commit_segment(
        self,
        segment_id: int,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        run: WriterRunLog,
        *,
        worker_id: str | None = None,
    ) -> list[int]: ...
    async def add_records(
        self,
        scope: Scope,
        records: Sequence[NewRecord],
        vectors: np.ndarray | None,
        *,
        rederive_item: int | None = None,
        dropped: dict[str, int] | None = None,
    ) -> list[int]: ...
    async def log_failed_run(self, segment_id: int, scope: Scope, run: WriterRunLog) -> None: ...
    async def get_many(self, ids: Sequence[int]) -> dict[int, DerivedRecord]: ...
    async def heads(
        self,
        channel_pks: Sequence[int],
        *,
        owners: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
    ) -> list[DerivedRecord]: ...
    async def chain(self, record_id: int) -> list[DerivedRecord]: ...
    async def chains(self, record_ids: Sequence[int]) -> dict[int, list[DerivedRecord]]: ...
    async def channel_of(self, record_ids: Sequence[int]) -> dict[int, tuple[str, str, str]]: ...
    async def lexical(
        self,
        match: str,
        channel_pks: Sequence[int],
        limit: int,
        *,
        active_only: bool = True,
        owner: str | None = None,
        source: str | None = None,
        exclude_owner: str | None = None,
    ) -> list[tuple[int, float]]: ...
    async def lexical_by_owner(
        self, match: str, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> dict[str, list[int]]: ...
    async def lexical_by_source(
        self, match: str, channel_pks: Sequence[int], sources: Sequence[str], per_source: int
    ) -> dict[str, list[int]]: ...
    async def matching_owners(
        self, match: str, channel_pks: Sequence[int], limit: int
    ) -> list[str]: ...
    async def latest_owned(
        self, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> list[int]: ...
    async def latest_owned_by(
        self, channel_pks: Sequence[int], owners: Sequence[str], per_owner: int
    ) -> list[tuple[int, str]]: ...
    async def citing(
        self, message_pks: Sequence[int], owners: Sequence[str]
    ) -> list[tuple[int, int]]: ...
    async def dense_among(
        self, query: np.ndarray, record_ids: Sequence[int]
    ) -> list[tuple[int, float]]: ...
    async def dense(
        self, query: np.ndarray, channel_pks: Sequence[int], limit: int
    ) -> list[tuple[int, float]]: ...
    async def counts(self) -> dict[str, int]: ...
    async def vector_texts(self, after_id: int, limit: int) -> list[tuple[int, int, str]]: ...
    async def replace_vectors(
        self, rows: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> None: ...
    async def by_owner_name(self, name_or_id: str) -> list[DerivedRecord]: ...
    async def writer_stats(self) -> dict[str, object]: ...


class Segments(Protocol):
    """The Writer's queue: segments move open -> pending -> done; failures back off."""

    async def close_idle(self, idle_seconds: float, *, now: float | None = None) -> int: ...
    async def close_channel(self, scope: Scope) -> int: ...
    async def backlog(self) -> Backlog: ...
    async def due(
        self, *, limit: int, now: float | None = None, scope: Scope | None = None
    ) -> list[Segment]: ...
    async def defer(
        self,
        segment_id: int,
        error: str,
        delay_seconds: float,
        *,
        worker_id: str | None = None,
        now: float | None = None,
    ) -> bool: ...
    async def claim(
        self, worker_id: str, lease_s: float, *, limit: int = 1, now: float | None = None
    ) -> list[Segment]: ...
    async def renew(
        self, segment_id: int, worker_id: str, lease_s: float, *, now: float | None = None
    ) -> bool: ...
    async def release(self, segment_id: int, worker_id: str) -> bool: ...
    async def counts(self) -> dict[str, int]: ...


class Governance(Protocol):
    """Policy, members, audit, re-derivation, and the forgetting cascade."""

    # channel and workspace policy
    async def channel_policy(self, scope: Scope) -> ChannelPolicy: ...
    async def channel_switches(
        self, platform: str, workspace: str, channels: Sequence[str]
    ) -> dict[str, bool]: ...
    async def is_enabled(self, scope: Scope, *, default: bool) -> bool: ...
    async def channel_policies(self) -> list[ChannelPolicy]: ...
    async def set_channel_enabled(self, scope: Scope, enabled: bool, actor: str) -> bool | None: ...
    async def set_channel_retention(self, scope: Scope, days: int | None, actor: str) -> None: ...
    async def set_workspace_retention(
        self, platform: str, workspace: str, days: int | None, actor: str
    ) -> None: ...
    async def workspace_retention(self) -> dict[tuple[str, str], int | None]: ...
    async def claim_notice(self, scope: Scope) -> bool: ...
    async def release_notice(self, scope: Scope) -> None: ...

    # members
    async def set_opted_out(
        self, platform: str, workspace: str, user_id: str, opted_out: bool
    ) -> None: ...
    async def is_opted_out(self, platform: str, workspace: str, user_id: str) -> bool: ...
    async def opted_out_count(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int: ...
    async def add_alias(self, platform: str, workspace: str, user_id: str, alias: str) -> bool: ...
    async def remove_alias(
        self, platform: str, workspace: str, user_id: str, alias: str
    ) -> bool: ...
    async def user_candidates(
        self, platform: str, workspace: str, name_or_id: str
    ) -> list[tuple[str, str]]: ...
    async def user_names(self, platform: str, workspace: str, user_id: str) -> dict[str, Any]: ...
    async def user_messages(self, platform: str, workspace: str, user_id: str) -> list[Any]: ...
    async def user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]: ...
    async def active_user_records(
        self, platform: str, workspace: str, user_id: str
    ) -> list[DerivedRecord]: ...
    async def live_message_count(self, platform: str, workspace: str, user_id: str) -> int: ...
    async def has_spoken(self, platform: str, workspace: str, user_id: str) -> bool: ...

    # audit and re-derivation
    async def log(
        self,
        *,
        platform: str,
        workspace: str,
        actor: str,
        action: str,
        target: str = "",
        args: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
    ) -> int: ...
    async def audit(
        self, limit: int, *, platform: str | None = None, workspace: str | None = None
    ) -> list[AuditEntry]: ...
    async def rederive_depth(
        self, platform: str | None = None, workspace: str | None = None
    ) -> int: ...
    async def due_rederive(
        self, limit: int = 50, *, now: float | None = None
    ) -> list[RederiveItem]: ...
    async def defer_rederive(self, item_id: int, error: str, delay_s: float) -> None: ...
    async def drop_rederive(self, item_id: int) -> None: ...

    # what a forget, a retention sweep or a purge works on
    async def record_source_channels(self, record_ids: Sequence[int]) -> dict[int, set[int]]: ...
    async def message_pks(self, scope: Scope, message_ids: Sequence[str]) -> list[int]: ...
    async def find_message(
        self, platform: str, workspace: str | None, message_id: str
    ) -> list[Scope]: ...
    async def user_message_pks(self, platform: str, workspace: str, user_id: str) -> list[int]: ...
    async def channel_message_pks(self, scope: Scope) -> list[int]: ...
    async def expired_message_pks(self, channel_pk: int, cutoff: float) -> list[int]: ...
    async def channels_with_pk(self) -> list[tuple[int, Scope]]: ...
    async def user_record_ids(self, platform: str, workspace: str, user_id: str) -> list[int]: ...
    async def channel_record_ids(self, scope: Scope) -> list[int]: ...
    async def records_citing(self, message_pks: Sequence[int]) -> list[int]: ...

    # the cascade
    async def forget_messages(
        self,
        message_pks: Sequence[int],
        receipt: Receipt,
        *,
        reason: str,
        forgotten_people: set[str] | None = None,
        batch: int = FORGET_BATCH,
    ) -> Receipt: ...
    async def withdraw(
        self,
        record_ids: Sequence[int],
        receipt: Receipt,
        *,
        reason: str,
        forgotten_people: set[str] | None = None,
        requeue: bool = True,
    ) -> Receipt: ...
    async def delete_user_rows(
        self, platform: str, workspace: str, user_id: str, receipt: Receipt
    ) -> Receipt: ...


class Interactions(Protocol):
    """The interaction graph: inferred addressees and reply links per message."""

    async def update(
        self, channel_pk: int, names: NameIndex, *, limit: int = 5_000, wait: bool = True
    ) -> int: ...
    async def behind(self) -> list[tuple[int, Scope]]: ...
    async def addressees(self, pks: Sequence[int]) -> dict[int, list[tuple[str, str]]]: ...
    async def parents(self, pks: Sequence[int]) -> dict[int, tuple[int, str]]: ...
    async def replies(self, pks: Sequence[int]) -> dict[int, list[tuple[int, str]]]: ...
    async def relation_dense(
        self,
        query: np.ndarray,
        channel_pks: Sequence[int],
        addressee: str,
        speakers: Sequence[str],
        limit: int,
        *,
        max_messages: int,
    ) -> list[tuple[int, float]]: ...


class CatchupCursors(Protocol):
    """Where each channel's history fetch (and reconciliation) stands."""

    async def newest(
        self, platform: str, workspace: str | None = None
    ) -> dict[Scope, tuple[str, float, str | None]]: ...
    async def cursors(self, platform: str, kind: str = "catchup") -> list[Cursor]: ...
    async def cursor(self, scope: Scope, kind: str) -> Cursor | None: ...
    async def save(
        self,
        scope: Scope,
        kind: str,
        *,
        cursor_id: str | None,
        cursor_ts: float | None,
        fetched: int,
        finished: bool,
        detail: dict[str, Any] | None = None,
    ) -> None: ...


class ConsoleReads(Protocol):
    """Aggregates the web console reads that no other repository answers."""

    async def active_records_per_channel(self) -> dict[int, int]: ...
    async def record_people(self, channel_pk: int) -> list[PersonCounts]: ...
    async def person_records(
        self, channel_pks: Sequence[int], person: str, *, limit: int, offset: int = 0
    ) -> tuple[list[DerivedRecord], int]: ...
    async def speaker_messages(
        self, channel_pks: Sequence[int], user_id: str, *, limit: int
    ) -> tuple[list[StoredMessage], int]: ...
    async def on_roster(self, channel_pks: Sequence[int], user_id: str) -> bool: ...
    async def addressee_edges(
        self, channel_pk: int, *, last_messages: int, limit: int
    ) -> list[tuple[str, str, int]]: ...
    async def people(
        self,
        platform: str,
        workspace: str,
        *,
        query: str = "",
        channel_pks: Sequence[int] | None = None,
        limit: int,
        offset: int = 0,
    ) -> tuple[list[PersonRow], int]: ...


class ReconcileReads(Protocol):
    """What reconciliation after downtime compares with the platform."""

    async def window(self, scope: Scope, low: float, high: float) -> list[StoredRow]: ...
    async def count(self, scope: Scope, low: float, high: float) -> int: ...
    async def thread_messages(self, scope: Scope, thread_id: str) -> list[tuple[int, str]]: ...


class JobLocks(Protocol):
    """Cluster-wide job locks: a periodic job runs in one process at a time."""

    def try_job(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Yields True when this process may run the job now, False when another process
        is running it (the caller skips this run)."""


class Tombstones(Protocol):
    """Keyed hashes of forgotten people and their names."""

    async def names_of(self, platform: str, workspace: str, user_id: str) -> set[str]: ...
    async def bury(
        self, platform: str, workspace: str, user_id: str, names: Iterable[str]
    ) -> set[str]: ...
    async def lift(self, platform: str, workspace: str, user_id: str) -> bool: ...
    async def is_forgotten(self, platform: str, workspace: str, user_id: str) -> bool: ...
    async def count(self, platform: str | None = None, workspace: str | None = None) -> int: ...
    async def records_naming(
        self, platform: str, workspace: str, names: set[str], *, exclude: Iterable[int] = ()
    ) -> list[int]: ...


class ForgetJobs(Protocol):
    """Forgets in progress, resumed until complete."""

    async def start(
        self,
        platform: str,
        workspace: str,
        action: str,
        target: str,
        actor: str,
        args: dict[str, Any],
    ) -> int: ...
    async def retried(self, job_id: int) -> None: ...
    async def failed(self, job_id: int, error: str) -> None: ...
    async def done(self, job_id: int) -> None: ...
    async def open(
        self, platform: str | None = None, workspace: str | None = None
    ) -> list[ForgetJob]: ...


class Store(Protocol):
    """One database and its repositories (`memory.store.make_store` picks the backend).

    `db` is the raw database, for the store's own functions (memory/store/diagnostics.py,
    usage.py), benchmarks and tests; everything else goes through a repository. (Read-only
    properties here: each backend's store holds its own classes of them.)"""

    @property
    def db(self) -> Database: ...

    @property
    def channels(self) -> Channels: ...

    @property
    def messages(self) -> Messages: ...

    @property
    def records(self) -> Records: ...

    @property
    def segments(self) -> Segments: ...

    @property
    def governance(self) -> Governance: ...

    @property
    def interactions(self) -> Interactions: ...

    @property
    def catchup(self) -> CatchupCursors: ...

    @property
    def console(self) -> ConsoleReads: ...

    @property
    def reconcile(self) -> ReconcileReads: ...

    @property
    def locks(self) -> JobLocks: ...

    @property
    def tombstones(self) -> Tombstones: ...

    @property
    def forget_jobs(self) -> ForgetJobs: ...

    @property
    def driver_name(self) -> str:
        """'stdlib' or 'sqlean' (the SQLite driver), or 'postgres'."""

    def retryable(self, exc: BaseException) -> bool:
        """Whether the same write can succeed later: the store is full, locked, its
        connection was lost. Anything else is a bad write or a bug."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def db_size_bytes(self) -> int: ...
    async def settle(self) -> list[str]:
        """After a bulk write: bring planner statistics (both backends) and the visibility
        map (PostgreSQL) up to date where the write outgrew them; returns the tables
        settled."""
        ...
