"""Readers for the public evaluation datasets (LoCoMo, FriendsQA) into memory events."""

from memory.datasets.common import Dataset, DatasetError, EvalQuestion, Observation

__all__ = ["Dataset", "DatasetError", "EvalQuestion", "Observation"]
