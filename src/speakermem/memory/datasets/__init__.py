"""Readers for the public evaluation datasets (LoCoMo, FriendsQA, SocialMemBench) into memory
events."""

from collections.abc import Callable, Sequence
from pathlib import Path

from speakermem.memory.datasets.common import (
    Dataset,
    DatasetError,
    DatasetSession,
    EvalQuestion,
    Observation,
)
from speakermem.memory.datasets.friendsqa import read_friendsqa
from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.datasets.socialmembench import read_socialmembench

DATASET_READERS: dict[str, Callable[..., Dataset]] = {
    "locomo": read_locomo,
    "friendsqa": read_friendsqa,
    "socialmembench": read_socialmembench,
}
"""Reader per dataset; each takes the path and `sessions=False` to hide session markers."""

MULTI_PATH = frozenset({"socialmembench"})
"""Datasets read from several files or folders at once (one network per file)."""


def read_dataset(kind: str, paths: Sequence[Path], *, sessions: bool = True) -> Dataset:
    """Read `paths` as dataset `kind`; a single-file format refuses several paths."""
    reader = DATASET_READERS[kind]
    if kind in MULTI_PATH:
        return reader(list(paths), sessions=sessions)
    if len(paths) != 1:
        raise DatasetError(f"{kind} reads one file; got {len(paths)} paths")
    return reader(paths[0], sessions=sessions)


__all__ = [
    "DATASET_READERS",
    "MULTI_PATH",
    "Dataset",
    "DatasetError",
    "DatasetSession",
    "EvalQuestion",
    "Observation",
    "read_dataset",
]
