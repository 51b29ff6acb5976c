"""All settings, read once from the environment (prefix SPEAKERMEM_) into one typed object.

Secrets are `SecretStr`: they print as '**********' in logs, reprs and `speakermem config`.
"""

from __future__ import annotations

import ipaddress
from copy import copy
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from speakermem.bot import asks, spill
from speakermem.memory.config import (
    GovernanceConfig,
    IngestConfig,
    MemoryConfig,
    RecallConfig,
    SearchConfig,
    StoreConfig,
    WriterConfig,
)

MIN_ADMIN_TOKEN_CHARS = 24
"""A shorter operator token is refused: the login limit slows guessing, it cannot stop it."""


def parse_shard_ids(text: str) -> tuple[int, ...]:
    """'0-3' or '0,2' or '0-1,4' -> sorted distinct shard ids; ValueError says what is wrong."""
    ids: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"empty item in shard ids {text!r} (expected e.g. '0-3' or '0,2')")
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(
                f"{part!r} in shard ids {text!r} is not a shard id or range "
                "(expected e.g. '0-3' or '0,2')"
            ) from None
        if first < 0 or last < first:
            raise ValueError(f"shard range {part!r} must be ascending non-negative numbers")
        ids.update(range(first, last + 1))
    return tuple(sorted(ids))


PREFIX = "SPEAKERMEM_"


def inherit(model: type[BaseModel], name: str) -> Any:
    """A memory config field (default and bounds) reused as a setting: written once, there."""
    return copy(model.model_fields[name])


def renamed(field: Any, name: str, *formerly: str) -> Any:
    """A setting read from SPEAKERMEM_<NAME> and, still, from its former names (said in
    its documented meaning)."""
    field.validation_alias = AliasChoices(*(PREFIX + n.upper() for n in (name, *formerly)))
    old = ", ".join(PREFIX + n.upper() for n in formerly)
    field.description = f"{field.description} Formerly {old}, still read."
    return field


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        use_attribute_docstrings=True,  # each field's docstring is its documented meaning
        populate_by_name=True,  # a renamed setting still takes its field name in code
    )

    # storage
    db_path: Path = inherit(StoreConfig, "db_path")
    db_url: SecretStr | None = inherit(StoreConfig, "db_url")
    sqlite_driver: Literal["auto", "stdlib", "sqlean"] = inherit(StoreConfig, "sqlite_driver")
    db_readers: int = inherit(StoreConfig, "readers")
    db_cache_mib: int = inherit(StoreConfig, "cache_mib")
    db_lock_wait_s: float = inherit(StoreConfig, "lock_wait_s")
    spill_path: Path | None = None
    """Where events wait while the database or disk is full, replayed once space returns;
    unset = beside the database (<db path>.spill.jsonl)."""
    spill_max_bytes: int = Field(default=spill.DEFAULT_CAP_BYTES, ge=1024)
    """Cap of the spill file in bytes: past it, events are refused with an error (never dropped
    silently)."""
    spill_retry_s: float = Field(default=spill.RETRY_S, gt=0, le=3600)
    """Seconds between attempts to replay the spill into the store once it takes writes
    again; a new event also retries it when this long has passed since the last attempt."""

    # ingestion and the Writer's segments
    session_gap_minutes: float = inherit(IngestConfig, "session_gap_minutes")
    writer_window: int = inherit(IngestConfig, "segment_window")
    writer_concurrency: int = inherit(WriterConfig, "concurrency")
    writer_max_concurrency: int = inherit(WriterConfig, "max_concurrency")
    writer_budget_per_message: int = inherit(WriterConfig, "budget_per_message")
    writer_budget_cap: int = inherit(WriterConfig, "budget_cap")
    writer_retry_base_s: float = inherit(WriterConfig, "retry_base_s")
    writer_retry_max_s: float = inherit(WriterConfig, "retry_max_s")
    writer_heads_tokens: int = inherit(WriterConfig, "heads_token_budget")
    writer_mode: Literal["inprocess", "workers"] = "inprocess"
    """workers: the bot process closes segments but does not write them; `speakermem worker`
    processes claim and write them (several bot processes on one PostgreSQL store)."""
    writer_lease_s: float = Field(default=120.0, gt=0)
    """How long a `speakermem worker`'s claim on a segment lasts without renewal: a worker
    that dies mid-segment holds it this long before another worker writes it."""
    gate_mode: Literal["lexical", "dense", "either", "both"] = inherit(WriterConfig, "gate_mode")
    # calibrated on LoCoMo by bench/calibrate_gate.py
    gate_lexical_threshold: float = inherit(WriterConfig, "gate_lexical_threshold")
    gate_dense_threshold: float = inherit(WriterConfig, "gate_dense_threshold")

    # embeddings
    embedder: str = Field(default="minilm", pattern=r"^(minilm|openai|none|onnx:.+)$")
    """minilm: all-MiniLM-L6-v2 run locally with ONNX Runtime (no download); onnx:<folder>: a
    sentence-embedding model in a local folder (tokenizer.json with model.onnx, or with a
    BERT-family model.safetensors and config.json; 384-dimensional, e.g. a multilingual
    MiniLM); openai: an OpenAI-compatible /v1/embeddings endpoint; none: lexical search only."""
    embed_quantize: bool = False
    """Dynamic int8 quantisation of MiniLM for messages too (half the CPU per message, but
    cosine to the reference drops to about 0.96, and evidence recall on SocialMemBench and
    FriendsQA by more than half a point; docs/benchmarks/embed.json `int8_evidence`)."""
    embed_query_quantize: bool = True
    """MiniLM embeds /recall questions with its int8 graph while messages keep fp32 vectors:
    half the CPU of a question's embedding, and evidence recall within half a point of fp32
    on LoCoMo, FriendsQA and SocialMemBench (docs/benchmarks/embed.json `int8_evidence`)."""
    embed_threads: int = Field(default=2, ge=1, le=64)
    """MiniLM threads for background embedding (each runs the model on one core, in Linux's
    idle scheduling class: only on a core nothing else wants); a question is embedded on a
    thread of its own."""
    model_cache_dir: Path = Path.home() / ".cache" / "speakermem" / "models"
    """Where the ONNX graph built from the MiniLM weights is cached."""
    embedding_base_url: str | None = None
    """Embeddings endpoint for SPEAKERMEM_EMBEDDER=openai, e.g. http://localhost:8001/v1."""
    embedding_api_key: SecretStr = SecretStr("")
    """API key of the embeddings endpoint."""
    embedding_model: str = "text-embedding-3-small"
    """Model name at the embeddings endpoint."""
    embedding_dim: int = 384
    """Vector size the embeddings endpoint returns (MiniLM: 384)."""

    # LLM (any OpenAI-compatible endpoint: vLLM, Ollama, llama.cpp, OpenAI)
    llm_base_url: str | None = None
    """OpenAI-compatible endpoint of the Writer and the answers, e.g. http://localhost:8000/v1
    (vLLM) or http://localhost:11434/v1 (Ollama). Unset = no LLM: ingestion, search and
    extractive /recall answers with citations still work; the Writer stays off."""
    llm_api_key: SecretStr = SecretStr("not-needed")
    """API key of the LLM endpoint (local servers ignore it)."""
    llm_model: str = "default"
    """Model name the endpoint serves, e.g. Qwen/Qwen2.5-7B-Instruct."""
    llm_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds per LLM call before it counts as failed."""
    llm_max_retries: int = Field(default=3, ge=0)
    """Retries of a failed LLM call (429, 5xx, timeouts), with backoff."""
    llm_structured_mode: Literal["auto", "json_schema", "json_object", "none"] = "auto"
    """auto: identify the server (vLLM, llama.cpp, Ollama, LM Studio) and use its mode; an
    unidentified one gets json_schema, json_object, then the schema in the prompt, whichever
    its first call accepts (integrations/llm/server_profile.py)."""
    llm_context_tokens: int | None = Field(default=None, ge=512)
    """The model's context in tokens; None: what the server says (or its known default).
    Prompts are sized to it; a server that proves it smaller (it cuts a prompt) wins."""
    llm_thinking_tokens: int = Field(default=1024, ge=0)
    """Tokens a reasoning model may think on top of each answer, when its thinking cannot
    be switched off on the server (0: none; its thinking then eats the answer's budget)."""
    llm_prompt_price_per_mtok: float = inherit(WriterConfig, "prompt_price_per_mtok")
    llm_completion_price_per_mtok: float = inherit(WriterConfig, "completion_price_per_mtok")

    # search and /recall budgets (SPEC §5 defaults)
    search_rrf_k0: int = renamed(inherit(SearchConfig, "hybrid_rrf_k0"), "search_rrf_k0", "rrf_k0")
    recall_pool: int = inherit(RecallConfig, "pool")
    recall_top_k: int = inherit(RecallConfig, "top_k")
    recall_rrf_k0: int = inherit(RecallConfig, "rrf_k0")
    recall_expand_anchors: int = inherit(RecallConfig, "expand_anchors")
    recall_expand_radius: int = inherit(RecallConfig, "expand_radius")
    recall_ask: bool = inherit(RecallConfig, "ask")
    recall_s2_k: int = inherit(RecallConfig, "s2_k")
    recall_s2_source_k: int = inherit(RecallConfig, "s2_source_k")
    recall_s2_max_people: int = inherit(RecallConfig, "s2_max_people")
    recall_scope: Literal["channel", "workspace"] = inherit(RecallConfig, "scope")
    recall_s1_pack_tokens: int = inherit(RecallConfig, "s1_pack_tokens")
    recall_s2_pack_tokens: int = inherit(RecallConfig, "s2_pack_tokens")
    recall_answer_max_tokens: int = inherit(RecallConfig, "answer_max_tokens")
    recall_processes: Annotated[int, Field(ge=0, le=16)] | Literal["auto"] = "auto"
    """auto: /recall runs in the bot's own process until the bot is busy, then in recall
    processes while it stays busy (integrations/recall_scaling.py: from the usable cores
    and the messages stored a second). 0: always in the bot's own process. N: always in N
    spawned processes (one recall at a time each), so a busy bot's ingestion and recalls
    stop sharing one interpreter lock (integrations/recall_processes.py). Each holds its
    own store connections and embedder."""
    ask_per_minute: int = Field(default=asks.ASKS_PER_MINUTE, ge=1, le=600)
    """Questions each member may ask by mentioning the bot, replying to it, messaging it
    directly or with the context menu, in any 60 seconds (`/recall` is not counted); more
    get a "please wait" reply."""
    recall_ephemeral: bool = False
    """true: /recall answers only the asker (ephemeral); false: the channel sees the answer."""

    # Slack
    slack_bot_token: SecretStr | None = None
    """Slack Bot User OAuth Token, xoxb-…."""
    slack_signing_secret: SecretStr | None = None
    """Slack Signing Secret (HTTP mode): requests with a bad signature get 401."""
    slack_app_token: SecretStr | None = None
    """Slack app-level token with connections:write, xapp-… (Socket Mode)."""
    slack_mode: Literal["http", "socket"] = "http"
    """http: Events API over HTTP (needs a public URL); socket: Socket Mode (needs the app
    token)."""
    slack_http_host: str = "0.0.0.0"
    """Address the Slack HTTP mode listens on."""
    slack_http_port: int = 3000
    """Port the Slack HTTP mode listens on."""
    slack_http_path: str = "/slack/events"
    """Path of the Events API, slash commands and interactivity."""
    slack_api_url: str = "https://slack.com/api/"
    """Slack Web API base URL (a proxy or a test stand-in)."""
    slack_admin_users: str = ""
    """Comma-separated Slack user ids who may run admin `/memory` commands, besides the
    workspace's admins and owners (read from users.info at every call)."""

    # Discord
    discord_token: SecretStr | None = None
    """Discord bot token (Developer Portal → Bot)."""
    discord_api_url: str = "https://discord.com/api/v10"
    """Discord REST base URL (a proxy or a test stand-in)."""
    discord_gateway_url: str = "wss://gateway.discord.gg/"
    """Discord gateway URL."""
    discord_shard_count: int | None = None
    """Total number of shards across all processes; set it to use the auto-sharded client (large
    bots)."""
    discord_shard_ids: Annotated[tuple[int, ...] | None, NoDecode] = None
    """Shards this process runs, e.g. 0-3 or 0,2 (within the shard count; one range per process
    when several processes share the shards); unset = all shards in this process."""

    # reconciliation after downtime (bot/reconcile.py)
    reconcile_lookback_s: float = Field(default=24 * 3600.0, ge=0)
    """Stored messages this long before an outage are checked against the platform after it
    (deleted ones forgotten, edits applied); 0 = no reconciliation."""
    reconcile_budget_s: float = Field(default=300.0, gt=0)
    """Seconds one catch-up pass spends reconciling one channel, rate-limit waits included;
    what is left is reported in `status` and checked first next time."""

    # governance (issue 8): defaults are GovernanceConfig's
    channel_default_enabled: bool = inherit(GovernanceConfig, "channel_default_enabled")
    channel_notice: bool = inherit(GovernanceConfig, "channel_notice")

    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""
    log_format: Literal["text", "json"] = "text"
    """json: one JSON object per log line (for log shippers)."""

    # operations endpoint (/healthz, /metrics); off unless a port is set
    ops_host: str = "0.0.0.0"
    """Address of the /healthz and /metrics endpoint."""
    ops_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of /healthz (JSON; 503 when the bot cannot serve) and /metrics (Prometheus); unset =
    off."""

    # web console (integrations/web): `speakermem web`, or inside `run` when a port is set
    web_host: str = "127.0.0.1"
    """Address the web console binds (`speakermem web`, or inside `run`); 127.0.0.1 = this
    machine only."""
    web_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the web console: set, `speakermem run` serves it too; `speakermem web` uses it
    unless given --port (else its default port, in `speakermem web --help`). Unset = no
    console inside `run`."""
    web_admin_token: SecretStr | None = None
    """The operator's sign-in token, at least 24 characters (e.g. `python -c "import secrets;
    print(secrets.token_urlsafe(32))"`); unset = a new random one each start, shown once
    (see `speakermem run`)."""
    web_public_url: str | None = None
    """The console's address as browsers see it (behind a proxy); https makes cookies Secure."""
    web_session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    """Hours a console sign-in lasts before it asks again."""
    web_login_attempts: int = Field(default=10, ge=1, le=10_000)
    """Failed sign-in attempts allowed per client address per minute (successes do not
    count)."""
    web_trusted_proxies: Annotated[tuple[str, ...] | None, NoDecode] = None
    """Addresses or networks (comma-separated: `127.0.0.1,10.0.0.0/8`) of the reverse proxies
    in front of the console: from them the client's address is read from X-Forwarded-For
    (for the login limit). Unset = the connecting address, and X-Forwarded-For is ignored."""
    web_discord_client_id: str | None = None
    """Client id of the Discord application, for "Sign in with Discord" (OAuth2: identify,
    guilds); unset = no Discord sign-in."""
    web_discord_client_secret: SecretStr | None = None
    """Client secret of that Discord application."""
    web_discord_authorize_url: str = "https://discord.com/oauth2/authorize"
    """Discord's OAuth2 authorize page (a setting so tests run against a local stand-in)."""
    web_slack_client_id: str | None = None
    """Client id of the Slack app, for "Sign in with Slack" (OpenID Connect); unset = no
    Slack sign-in."""
    web_slack_client_secret: SecretStr | None = None
    """Client secret of that Slack app."""
    web_slack_authorize_url: str = "https://slack.com/openid/connect/authorize"
    """Slack's OpenID Connect authorize page (a setting so tests run against a stand-in)."""

    @field_validator("web_admin_token")
    @classmethod
    def _long_enough_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and 0 < len(value.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"SPEAKERMEM_WEB_ADMIN_TOKEN is {len(value.get_secret_value())} characters; "
                f'use at least {MIN_ADMIN_TOKEN_CHARS} (python -c "import secrets; '
                'print(secrets.token_urlsafe(32))"), or unset it for a random one'
            )
        return value

    @field_validator("web_trusted_proxies", mode="before")
    @classmethod
    def _parse_proxies(cls, value: Any) -> Any:
        if value is None:
            return None
        items = value.replace(",", " ").split() if isinstance(value, str) else value
        for item in items:
            try:
                ipaddress.ip_network(str(item).strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"SPEAKERMEM_WEB_TRUSTED_PROXIES: {item!r} is not an IP address or network"
                ) from None
        return tuple(str(item).strip() for item in items) or None

    @field_validator("discord_shard_ids", mode="before")
    @classmethod
    def _parse_shard_ids(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_shard_ids(value) if value.strip() else None
        return value

    @model_validator(mode="after")
    def _shards_within_count(self) -> Settings:
        ids, count = self.discord_shard_ids, self.discord_shard_count
        if ids is None:
            return self
        if count is None:
            raise ValueError(
                "SPEAKERMEM_DISCORD_SHARD_IDS needs SPEAKERMEM_DISCORD_SHARD_COUNT (the total "
                "number of shards across all processes)"
            )
        if not ids:
            raise ValueError("SPEAKERMEM_DISCORD_SHARD_IDS names no shard")
        outside = [i for i in ids if i >= count]
        if outside:
            raise ValueError(
                f"SPEAKERMEM_DISCORD_SHARD_IDS {outside} outside 0-{count - 1} "
                f"(SPEAKERMEM_DISCORD_SHARD_COUNT={count})"
            )
        return self

    def memory_config(self) -> MemoryConfig:
        return MemoryConfig(
            store=StoreConfig(
                db_path=self.db_path,
                db_url=self.db_url,
                sqlite_driver=self.sqlite_driver,
                readers=self.db_readers,
                cache_mib=self.db_cache_mib,
                lock_wait_s=self.db_lock_wait_s,
            ),
            ingest=IngestConfig(
                session_gap_minutes=self.session_gap_minutes, segment_window=self.writer_window
            ),
            search=SearchConfig(hybrid_rrf_k0=self.search_rrf_k0, pool=self.recall_pool),
            recall=RecallConfig(
                pool=self.recall_pool,
                top_k=self.recall_top_k,
                rrf_k0=self.recall_rrf_k0,
                expand_anchors=self.recall_expand_anchors,
                expand_radius=self.recall_expand_radius,
                ask=self.recall_ask,
                s2_k=self.recall_s2_k,
                s2_source_k=self.recall_s2_source_k,
                s2_max_people=self.recall_s2_max_people,
                scope=self.recall_scope,
                s1_pack_tokens=self.recall_s1_pack_tokens,
                s2_pack_tokens=self.recall_s2_pack_tokens,
                answer_max_tokens=self.recall_answer_max_tokens,
            ),
            writer=WriterConfig(
                budget_per_message=self.writer_budget_per_message,
                budget_cap=self.writer_budget_cap,
                heads_token_budget=self.writer_heads_tokens,
                concurrency=self.writer_concurrency,
                max_concurrency=self.writer_max_concurrency,
                prompt_price_per_mtok=self.llm_prompt_price_per_mtok,
                completion_price_per_mtok=self.llm_completion_price_per_mtok,
                retry_base_s=self.writer_retry_base_s,
                retry_max_s=self.writer_retry_max_s,
                gate_mode=self.gate_mode,
                gate_lexical_threshold=self.gate_lexical_threshold,
                gate_dense_threshold=self.gate_dense_threshold,
            ),
            governance=GovernanceConfig(
                channel_default_enabled=self.channel_default_enabled,
                channel_notice=self.channel_notice,
            ),
        )

    @property
    def spill_file(self) -> Path:
        return self.spill_path or spill.default_path(self.db_path)

    @property
    def slack_admin_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.slack_admin_users.split(",") if u.strip())

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm_base_url)


def load_settings(**overrides: object) -> Settings:
    """Read the environment once; CLI flags come in as overrides."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)  # type: ignore[arg-type]
