"""What a backup reports, whichever backend wrote it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BackupResult:
    path: Path
    bytes: int
    messages: int
    records: int
    seconds: float
