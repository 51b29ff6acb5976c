"""IN-list padding (memory.store.inlists): a few statement texts, the same meaning."""

from __future__ import annotations

import pytest

from speakermem.memory.store.inlists import in_list, padded_size


def test_lists_are_padded_to_the_next_power_of_two_with_their_last_value() -> None:
    assert [padded_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 500, 512, 513)] == [
        1, 2, 4, 4, 8, 8, 16, 512, 512, 1024,
    ]  # fmt: skip
    marks, values = in_list(["a", "b", "c"])
    assert (marks, values) == ("?,?,?,?", ["a", "b", "c", "c"])
    marks, values = in_list((7, 8))
    assert (marks, values) == ("?,?", [7, 8])


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        in_list([])
