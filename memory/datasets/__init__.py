"""Readers for the public evaluation datasets (LoCoMo, FriendsQA) into memory events."""

from collections.abc import Callable

from memory.datasets.common import Dataset, DatasetError, EvalQuestion, Observation
from memory.datasets.friendsqa import read_friendsqa
from memory.datasets.locomo import read_locomo

DATASET_READERS: dict[str, Callable[..., Dataset]] = {
    "locomo": read_locomo,
    "friendsqa": read_friendsqa,
}
"""Reader per dataset; each takes the path and `sessions=False` to hide session markers."""

__all__ = [
    "DATASET_READERS",
    "Dataset",
    "DatasetError",
    "EvalQuestion",
    "Observation",
]
