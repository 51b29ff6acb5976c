"""Tunables of the memory core, as one typed object.

The bot's settings (read once from the environment) build this; tests build it
directly. Every budget from SPEC §5 is here so nothing is hard-coded downstream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from speakermem.memory.writer.gate import (
    DEFAULT_DENSE_THRESHOLD,
    DEFAULT_GATE_MODE,
    DEFAULT_LEXICAL_THRESHOLD,
    GateMode,
)


class StoreConfig(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    db_path: Path = Path("speakermem.db")
    """The SQLite file (`speakermem demo` and `shell` use ./speakermem-demo.db unless this or
    --db is set)."""
    db_url: SecretStr | None = None
    """postgresql://user:password@host/db puts the memory in PostgreSQL + pgvector instead of
    the SQLite file, shared by several bot processes and Writer workers (install the driver
    with `bash deploy/install.sh --postgres`); unset keeps SQLite. A secret: shown masked."""
    sqlite_driver: Literal["auto", "stdlib", "sqlean"] = "auto"
    """auto: Python's sqlite3 when it can load extensions, else the bundled sqlean.py; or
    force stdlib or sqlean."""
    readers: int = Field(default=4, ge=1, le=16)
    """Reader connections: /recall runs its rankings concurrently, one per connection."""
    # Why one budget per process: per-connection caches (8 MiB each, five per process) let a
    # bot under steady traffic grow for five minutes, three processes filling 120 MiB of
    # them. At 8 MiB a recall process, which reads only the channels it is asked about,
    # still filled its budget until ~2½ minutes into bench/bench_load.py (+2.7 MB each over
    # the last three); at 4 it is full by the second and /recall was no slower (p95 150-183
    # ms against 171-184, MiniLM, two recall processes).
    cache_mib: int = Field(default=4, ge=1, le=4096)
    """SQLite memory of one process (its writer and readers together), in MiB: the page
    caches share it, so memory levels off once it is used (the OS page cache still serves
    re-reads)."""
    busy_timeout_ms: int = Field(default=5_000, ge=0)
    lock_wait_s: float = Field(default=60.0, gt=0, le=3600)
    """How long a write waits for another process's write lock (a backup, a CLI import)
    before it fails with StoreBusy; each attempt also waits up to `busy_timeout_ms`."""
    vec_chunk_size: int = Field(default=64, ge=8, le=4096)
    dense_oversample: int = Field(default=800, ge=10, le=4096)
    """Candidates taken from the binary-quantised index before exact re-scoring.

    800 keeps recall@40 against exact cosine at 0.96 on 10k MiniLM vectors of chat
    (400 gave 0.90); see bench/bench_store.py."""


class IngestConfig(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    session_gap_minutes: float = Field(default=30.0, gt=0)
    """Idle minutes that start a new session and close the channel's Writer segment."""
    segment_window: int = Field(default=25, ge=1, le=500)
    """Messages per Writer segment."""


class SearchConfig(BaseModel):
    """`speakermem search`: System 1's hybrid search (MemoryEngine.search), not /recall's."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    hybrid_rrf_k0: int = Field(default=60, ge=1)
    """RRF constant of `speakermem search`'s hybrid fusion (SPEC's 60); /recall fuses its
    rankings with a constant of its own."""
    lexical_weight: float = Field(default=1.0, ge=0)
    dense_weight: float = Field(default=1.0, ge=0)
    pool: int = Field(default=40, ge=1, le=1000)
    hybrid_oversample_fraction: float = Field(default=0.008, ge=0, le=1)
    """`speakermem search`'s dense ranking: large partitions re-score this share of their
    rows exactly when it exceeds `StoreConfig.dense_oversample` (chosen from
    `COARSE_WIDEN` times as many by Hamming distance). recall@40 on 100k real MiniLM
    vectors: 0.975 at 800 of 3,200, where Hamming alone gave 0.955 at 1,600 (the former
    default, 0.016). /recall's is `RecallConfig.dense_oversample_fraction`."""


class RecallConfig(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    """/recall budgets (SPEC §5 defaults: recall-n=40, top-k=10, S2 k=2, source-k=1, no ASK)."""

    pool: int = Field(default=40, ge=1, le=1000)
    """Candidates /recall (and search) draw from each ranking (SPEC recall-n)."""
    top_k: int = Field(default=10, ge=1, le=100)
    """Verbatim messages kept as evidence (SPEC top-k)."""
    rrf_k0: int = Field(default=20, ge=1)
    """RRF constant of the recall fusion (SPEC's 60 is kept for the hybrid `search`)."""
    max_question_chars: int = Field(default=4_000, ge=100, le=40_000)
    """Longest question /recall reads, in characters, at every door (chat, CLI, web
    console); the rest is cut. A question is a sentence or a paragraph: 4,000 holds the
    longest message Discord allows (Nitro) and bounds the name and time scans and the
    prompts a pasted wall of text would fill."""
    session_aggregate_top: int = Field(default=10, ge=1)
    session_aggregate_weight: float = Field(default=2.0, ge=0)
    session_bm25_weight: float = Field(default=2.0, ge=0)
    session_length_norm: float = Field(default=0.5, ge=0, le=1)
    """BM25 `b` of session scoring: normalise by session length (messages) against the
    mean over the pool's sessions (measured: +1.4 FriendsQA, flat LoCoMo)."""
    focus_margin: float = Field(default=1.5, ge=1)
    """A session whose BM25 is at least this factor above the runner-up is dominant."""
    focus_weight: float = Field(default=1.0, ge=0)
    """Weight of the dominant session's turns as one more ranking (0 = off)."""
    focus_radius: int = Field(default=20, ge=1, le=200)
    """Turns fetched around the dominant session's best pick (bounds the cost)."""
    broad_session_cap: int = Field(default=4, ge=0, le=100)
    """At most this many of the top-k evidence from one session for a question about a
    person's pattern or a change (0 = no cap)."""
    people_rank: bool = True
    """Rank the evidence of a question about named people's pattern, relationship or change
    by the people model (`memory.query.people_rank`): their own messages, the messages
    naming them and exchanges between them. Off: the general fused ranking."""
    broad_lexical_weight: float = Field(default=0.25, ge=0)
    """Weight of the word rankings (BM25 of the question, its phrases, the named people's
    words, the time window) and of the sessions' BM25 in the fusion for a broad question
    (a pattern, a change, everyone's view) that the people model does not rank: such
    questions are abstract, and their framing words ("chat", "relationship") match the
    wrong messages. Chosen by leave-one-network-out (bench/quality/fit_people.py)."""
    group_speaker_cap: int = Field(default=2, ge=0, le=100)
    """At most this many of the top-k evidence from one speaker for a question about
    everyone (0 = no cap)."""
    context_anchors: int = Field(default=3, ge=0, le=20)
    """Soft Expand: the turns around the top picks join the fusion as one more ranking."""
    context_weight: float = Field(default=0.5, ge=0)
    expand_anchors: int = Field(default=2, ge=0, le=10)
    """At most this many anchors when the LLM's Select picks them."""
    fallback_expand_anchors: int = Field(default=0, ge=0, le=10)
    """Anchors expanded without an LLM (measured: expanding the top hits blindly hurt)."""
    expand_radius: int = Field(default=1, ge=0, le=10)
    """Neighbouring turns added on each side of an expanded anchor."""
    ask: bool = False
    """ASK: one extra search when the LLM judges the evidence insufficient."""
    s2_k: int = Field(default=2, ge=0, le=20)
    """System 2 records per row (a person or GROUP)."""
    s2_source_k: int = Field(default=1, ge=0, le=20)
    """Records a row's person provided about others."""
    s2_fallback_messages: int = Field(default=2, ge=0, le=20)
    s2_max_people: int = Field(default=5, ge=1, le=50)
    """PERSON rows read for one question: an ALL question reads the people most relevant to
    it (speakers of the top evidence, people it mentions, owners of matching records), never
    the whole roster; named people beyond this are left out (and --explain says so)."""
    scope: Literal["channel", "workspace"] = "channel"
    """channel: answer only from the channel asked in; workspace: also from other public
    channels the asker can read (a private channel never answers outside itself)."""
    answer_max_tokens: int = Field(default=400, ge=16)
    """Longest answer the LLM may write, in tokens."""
    dense_oversample_fraction: float = Field(default=0.0, ge=0, le=1)
    """/recall's dense ranking: its share of a large partition as coarse candidates; 0 keeps
    the fixed `StoreConfig.dense_oversample` (`search` has its own:
    `SearchConfig.hybrid_oversample_fraction`)."""
    relation_weight: float = Field(default=1.0, ge=0)
    """Weight of the speaker-addressee ranking ("what did X tell Y"): messages to Y (from
    X) and Y's replies to them, by dense similarity (0 = off)."""
    relation_max_messages: int = Field(default=3_000, ge=1)
    """A relation with more messages than this narrows nothing and is skipped."""
    speaker_dense: Literal["off", "fallback", "always"] = "off"
    """Rank a named person's own messages by dense similarity: never, only when the
    speaker BM25 ranking found nothing, or always (rare speakers only). Off: on half A of
    FriendsQA "fallback" gained 0.2 points with sessions but lost 2.1 without them."""
    speaker_dense_max_messages: int = Field(default=400, ge=1)
    """"Rare" speakers for `speaker_dense`: at most this many messages in the channel."""
    speaker_candidates: bool = True
    """The speaker ranking also reads the messages of everyone an ambiguous name could mean."""
    reply_slots: int = Field(default=0, ge=0, le=10)
    """The top picks whose reply (by reply link, else the next turn) is placed right after
    them in the evidence, ahead of lower-ranked picks."""
    rerank_depth: int = Field(default=40, ge=0, le=200)
    """The feature re-ranker re-orders this many of the fused pool's head (0 = off); its
    weights are fitted offline (memory/query/rerank.py)."""
    context_structure: bool = True
    """Soft Expand follows reply links (the parent and replies of each top pick, tagged or
    inferred) instead of the turns just before and after."""
    check_claims: bool = True
    """Check each claim of an LLM answer against the messages it cites; drop or re-cite the
    unsupported ones, and abstain when none is left."""
    interaction_catchup: int = Field(default=500, ge=0)
    """New messages per channel whose addressees and reply links /recall infers first, when
    no background worker keeps the graph current (the CLI, evaluation). With the worker
    running, /recall never writes: it reads the graph as the worker left it."""
    s1_pack_tokens: int = Field(default=1_500, ge=100)
    """Budget of the verbatim excerpts in the evidence pack (longest texts are shortened)."""
    s2_pack_tokens: int = Field(default=1_300, ge=100)
    """Budget of the PERSON/GROUP rows in the evidence pack (plus what S1 leaves unused)."""


class WriterConfig(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    budget_per_message: int = Field(default=2, ge=1)
    """Writer actions allowed per message of a segment."""
    budget_cap: int = Field(default=40, ge=1)
    """Writer actions allowed per segment at most."""
    heads_token_budget: int = Field(default=1500, ge=0)
    """Token budget of the current System 2 heads shown to the Writer with each segment."""
    concurrency: int = Field(default=2, ge=1, le=64)
    """LLM calls at once to start with; the Writer adapts it (memory/writer/pacing.py)."""
    max_concurrency: int = Field(default=32, ge=1, le=256)
    """The most LLM calls at once the Writer raises to while latency holds (the ceiling;
    a server that says how many it serves at once lowers it). Set it to `concurrency` for
    a fixed number."""
    retry_base_s: float = Field(default=30.0, gt=0)
    """First retry delay, in seconds, of a segment whose LLM call failed; doubles each time."""
    retry_max_s: float = Field(default=1800.0, gt=0)
    """Longest retry delay, in seconds: bounds the wait after a long LLM outage."""
    max_tokens: int = Field(default=2048, ge=64)
    prompt_price_per_mtok: float = Field(default=0.0, ge=0)
    """What the endpoint charges per million prompt tokens (USD), for the cost in `status`
    and the metrics; 0 for a server of your own."""
    completion_price_per_mtok: float = Field(default=0.0, ge=0)
    """The same per million completion tokens (thinking included)."""
    gate_mode: GateMode = DEFAULT_GATE_MODE
    """Evidence gate: does a proposed record's content overlap its cited messages? lexical,
    dense, either or both."""
    gate_lexical_threshold: float = Field(default=DEFAULT_LEXICAL_THRESHOLD, ge=0, le=1)
    """Lexical gate threshold: the share of the record's content words its cited messages
    contain (calibrated on LoCoMo by bench/calibrate_gate.py)."""
    gate_dense_threshold: float = Field(default=DEFAULT_DENSE_THRESHOLD, ge=-1, le=1)
    """Dense gate threshold: cosine between the record and its cited messages."""


class GovernanceConfig(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    """What admins and members control (issue 8)."""

    channel_default_enabled: bool = True
    """Memory in a channel nobody switched on or off (`/memory channel on|off` overrides)."""
    channel_notice: bool = True
    """Post one short notice in a channel the first time memory is on there."""
    forget_batch: int = Field(default=2_000, ge=1, le=50_000)
    """Messages forgotten per transaction: each batch is complete on its own."""


class MemoryConfig(BaseModel):
    store: StoreConfig = StoreConfig()
    ingest: IngestConfig = IngestConfig()
    search: SearchConfig = SearchConfig()
    recall: RecallConfig = RecallConfig()
    writer: WriterConfig = WriterConfig()
    governance: GovernanceConfig = GovernanceConfig()
