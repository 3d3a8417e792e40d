"""The partitions list's bulk actions, decided from plain values: which ids a form
ticked, and the line the list shows after."""

from __future__ import annotations

import pytest

from processor.console.bulk_page import MAX_BULK, bulk_ids, bulk_notice
from watcher.errors import InvalidInputError


def test_the_ticked_ids_in_order_each_once() -> None:
    assert bulk_ids(["b", "a", "", "b", "c/d e"]) == ["b", "a", "c/d e"]
    assert bulk_ids([]) == []
    assert len(bulk_ids([f"p{n}" for n in range(MAX_BULK)])) == MAX_BULK
    with pytest.raises(InvalidInputError, match=f"at most {MAX_BULK} partitions"):
        bulk_ids([f"p{n}" for n in range(MAX_BULK + 1)])


@pytest.mark.parametrize(("params", "line"), [
    ({"bulk": "cancel", "asked": "3", "acted": "3", "unchanged": "0", "gone": "0"},
     "Cancelled 3 of 3 selected partition(s): no processor dispatches their items any "
     "more. Retry resumes them."),
    ({"bulk": "retry", "asked": "3", "acted": "1", "unchanged": "1", "gone": "1"},
     "Retried 1 of 3 selected partition(s): their failed items run again, a stopped one "
     "re-opened. 1 had nothing to retry. 1 no longer exist."),
    ({"bulk": "none"}, "Nothing selected: tick the partitions to act on first."),
    # A hand-edited address shows nothing.
    ({"bulk": "delete", "asked": "1", "acted": "1", "unchanged": "0", "gone": "0"}, None),
    ({"bulk": "retry", "asked": "x", "acted": "1", "unchanged": "0", "gone": "0"}, None),
    ({"bulk": "retry", "asked": "1", "acted": "-1", "unchanged": "0", "gone": "0"}, None),
    ({}, None),
])
def test_the_line_after_a_bulk_action(params: dict[str, str], line: str | None) -> None:
    assert bulk_notice(params) == line
