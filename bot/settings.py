"""All settings, read once from the environment (prefix SPEAKERMEM_) into one typed object.

Secrets are `SecretStr`: they print as '**********' in logs, reprs and `speakermem config`.
"""

from __future__ import annotations

from copy import copy
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bot import spill
from memory.config import (
    GovernanceConfig,
    IngestConfig,
    MemoryConfig,
    RecallConfig,
    SearchConfig,
    StoreConfig,
    WriterConfig,
)


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


def inherit(model: type[BaseModel], name: str) -> Any:
    """A memory config field (default and bounds) reused as a setting: written once, there."""
    return copy(model.model_fields[name])


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPEAKERMEM_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # storage
    db_path: Path = inherit(StoreConfig, "db_path")
    db_url: SecretStr | None = inherit(StoreConfig, "db_url")
    """postgresql://user:password@host/db selects PostgreSQL (issue 13); unset = db_path."""
    sqlite_driver: Literal["auto", "stdlib", "sqlean"] = inherit(StoreConfig, "sqlite_driver")
    db_readers: int = inherit(StoreConfig, "readers")
    db_cache_mib: int = inherit(StoreConfig, "cache_mib")
    db_lock_wait_s: float = inherit(StoreConfig, "lock_wait_s")
    spill_path: Path | None = None
    """Where events go while the database or disk is full; None = beside the database."""
    spill_max_bytes: int = Field(default=spill.DEFAULT_CAP_BYTES, ge=1024)

    # ingestion and the Writer's segments
    session_gap_minutes: float = inherit(IngestConfig, "session_gap_minutes")
    writer_window: int = inherit(IngestConfig, "segment_window")
    writer_concurrency: int = inherit(WriterConfig, "concurrency")
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
    embedder: Literal["minilm", "openai", "none"] = "minilm"
    embed_quantize: bool = False
    embed_threads: int = Field(default=2, ge=1, le=64)
    model_cache_dir: Path = Path.home() / ".cache" / "speakermem" / "models"
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr = SecretStr("")
    embedding_model: str = "text-embedding-3-small"
    embedding_dim: int = 384

    # LLM (any OpenAI-compatible endpoint: vLLM, Ollama, llama.cpp, OpenAI)
    llm_base_url: str | None = None
    llm_api_key: SecretStr = SecretStr("not-needed")
    llm_model: str = "default"
    llm_timeout_s: float = Field(default=60.0, gt=0)
    llm_max_retries: int = Field(default=3, ge=0)
    llm_structured_mode: Literal["json_schema", "json_object", "none"] = "json_schema"

    # search and /recall budgets (SPEC §5 defaults)
    rrf_k0: int = inherit(SearchConfig, "rrf_k0")
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
    recall_ephemeral: bool = False

    # Slack
    slack_bot_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_mode: Literal["http", "socket"] = "http"
    slack_http_host: str = "0.0.0.0"
    slack_http_port: int = 3000
    slack_http_path: str = "/slack/events"
    slack_api_url: str = "https://slack.com/api/"
    slack_admin_users: str = ""
    """Comma-separated Slack user ids who may run admin `/memory` commands, besides the
    workspace's admins and owners (read from users.info at every call)."""

    # Discord
    discord_token: SecretStr | None = None
    discord_api_url: str = "https://discord.com/api/v10"
    discord_gateway_url: str = "wss://gateway.discord.gg/"
    discord_shard_count: int | None = None
    discord_shard_ids: Annotated[tuple[int, ...] | None, NoDecode] = None
    """Shards this process runs ("0-3", "0,2"); needs discord_shard_count. None = all."""

    # governance (issue 8): defaults are GovernanceConfig's
    channel_default_enabled: bool = Field(
        default=GovernanceConfig.model_fields["channel_default_enabled"].default
    )
    channel_notice: bool = Field(default=GovernanceConfig.model_fields["channel_notice"].default)

    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    """json: one JSON object per log line (for log shippers)."""

    # operations endpoint (/healthz, /metrics); off unless a port is set
    ops_host: str = "0.0.0.0"
    ops_port: int | None = Field(default=None, ge=0, le=65535)

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
            search=SearchConfig(rrf_k0=self.rrf_k0, pool=self.recall_pool),
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
