"""Tunables of the memory core, as one typed object.

The bot's settings (read once from the environment) build this; tests build it
directly. Every budget from SPEC §5 is here so nothing is hard-coded downstream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class StoreConfig(BaseModel):
    db_path: Path = Path("speakermem.db")
    sqlite_driver: Literal["auto", "stdlib", "sqlean"] = "auto"
    readers: int = Field(default=2, ge=1, le=16)
    busy_timeout_ms: int = Field(default=5_000, ge=0)
    vec_chunk_size: int = Field(default=64, ge=8, le=4096)
    dense_oversample: int = Field(default=400, ge=10, le=4096)
    """Candidates taken from the binary-quantised index before exact re-scoring."""


class IngestConfig(BaseModel):
    session_gap_minutes: float = Field(default=30.0, gt=0)
    segment_window: int = Field(default=25, ge=1, le=500)


class SearchConfig(BaseModel):
    rrf_k0: int = Field(default=60, ge=1)
    lexical_weight: float = Field(default=1.0, ge=0)
    dense_weight: float = Field(default=1.0, ge=0)
    pool: int = Field(default=40, ge=1, le=1000)


class MemoryConfig(BaseModel):
    store: StoreConfig = StoreConfig()
    ingest: IngestConfig = IngestConfig()
    search: SearchConfig = SearchConfig()
