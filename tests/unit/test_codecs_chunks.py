"""Chunks of rows bounded by count and by bytes (watcher.store.codecs.sized_chunks): what
keeps one insert statement of big items from carrying a gigabyte."""

from __future__ import annotations

import pytest

from watcher.store.codecs import sized_chunks


@pytest.mark.parametrize(("weights", "size", "most", "expected"), [
    ([], 3, 10, []),
    ([1, 1, 1, 1], 3, 10, [[1, 1, 1], [1]]),  # the count bounds a chunk
    ([4, 4, 4], 5, 10, [[4, 4], [4]]),  # the bytes do
    ([4, 6, 1], 5, 10, [[4, 6], [1]]),  # exactly at the bound
    ([30, 1, 30], 5, 10, [[30], [1], [30]]),  # one too big goes alone
    ([0] * 7, 3, 0, [[0, 0, 0], [0, 0, 0], [0]]),
])
def test_chunks_keep_order_and_both_bounds(weights: list[int], size: int, most: int,
                                           expected: list[list[int]]) -> None:
    chunked = [list(chunk) for chunk in sized_chunks(weights, size, most, lambda w: w)]
    assert chunked == expected
    assert [w for chunk in chunked for w in chunk] == weights
